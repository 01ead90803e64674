"""What a hooked file lets go of, off the caller's thread: the descriptors
of the mount its readers hold (a close is a FLUSH that the daemon answers
after the ioctls queued before it: the caller need not wait for that)."""

from __future__ import annotations

import atexit
import os
import threading
from typing import List


class Closing:
    """Closes readers off the caller's thread; drain() waits for them
    (tests, before they unmount; interpreter exit, through atexit)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.threads: List[threading.Thread] = []

    def run(self, fn) -> None:
        t = threading.Thread(target=fn, name="phxmount-close", daemon=True)
        with self.lock:
            self.threads = [x for x in self.threads if x.is_alive()] + [t]
        t.start()

    def drain(self, timeout: float = 30) -> None:
        with self.lock:
            ts, self.threads = self.threads, []
        for t in ts:
            t.join(timeout)


closing = Closing()
atexit.register(closing.drain)


def close_fd(box: list) -> None:
    """Closes the descriptor box holds, once."""
    fd, box[0] = box[0], None
    if fd is not None:
        os.close(fd)

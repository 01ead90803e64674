"""What a hooked file holds of the mount, and how it lets go: its
descriptor and its readers, closed off the caller's thread (a close is a
FLUSH that the daemon answers after the ioctls queued before it: the
caller need not wait for that), by close(), a fall-back, or the file's
collection."""

from __future__ import annotations

import atexit
import os
from typing import Dict, Optional

from . import threadpools


class Closing:
    """Closes readers off the caller's thread (the process's chore
    threads: threadpools, no thread started per close); drain() waits for
    them (tests, before they unmount; interpreter exit, through atexit)."""

    def run(self, fn) -> None:
        try:
            threadpools.soon(fn)
        except RuntimeError:  # no new threads (the interpreter is finalizing): here, then
            fn()

    def drain(self, timeout: float = 30) -> None:
        threadpools.drain(timeout)


closing = Closing()
atexit.register(closing.drain)


class Resources:
    """A hooked file's descriptor of the mount (the header was read from
    it; each reader reads on a duplicate, as an open of a file on the mount
    is a FUSE round trip and a dup is not) and its readers, one per device.
    Let go by release(): the file's close(), a fall-back, or the file's
    collection unclosed (weakref.finalize: an engine that never closes its
    safe_open must not keep a descriptor per file). Holds no reference to
    the file."""

    def __init__(self, fd: Optional[int], lock):
        self.fd, self.lock = fd, lock
        self.readers: Dict[int, object] = {}
        self.released = False

    def dup(self) -> Optional[int]:
        """A duplicate of the descriptor for a reader (None: none kept)."""
        with self.lock:
            return os.dup(self.fd) if self.fd is not None else None

    def opened(self, dev: int):
        """The reader onto dev where one is open (what reader() answers
        first; without the lock, and without the callbacks reader() takes:
        asked per tensor), else None."""
        return self.readers.get(dev)

    def reader(self, dev: int, open_new, refused) -> tuple:
        """(the reader onto dev, whether it is new): the one open, else
        open_new(a duplicate of the descriptor), kept unless refused() gives
        a reason (a fall-back meanwhile), which is raised."""
        with self.lock:
            r = self.readers.get(dev)
            if r is not None:
                return r, False
            if self.released:  # a reader now would be nobody's to close
                raise RuntimeError("the file was closed: its tensors read after that go through safetensors")
        r = open_new(self.dup())
        with self.lock:
            old, why = self.readers.get(dev), refused()
            if old is None and why is None:
                self.readers[dev] = r
                return r, True
        r.close()
        if old is not None:
            return old, False
        raise why

    def release(self) -> None:
        """Drops what the readers prefetched, now (its memory is free once
        its reads have returned: a fall-back after an out-of-memory needs
        it), and closes the readers and the descriptor off the caller's
        thread. Idempotent."""
        with self.lock:
            readers, self.readers = list(self.readers.values()), {}
            fd, self.fd = self.fd, None
            self.released = True
        for r in readers:
            r.drop_all()
        if readers or fd is not None:
            closing.run(lambda: _close_all(readers, fd))


def _close_all(readers: list, fd: Optional[int]) -> None:
    for r in readers:
        r.close()
    if fd is not None:
        os.close(fd)

"""get_tensor in key order (an engine's loading loop): the reads of the
next keys start with this one, up to PHXMOUNT_HOOK_WINDOW bytes. No
torch."""

from __future__ import annotations

import threading
from typing import Callable, Dict, List


class ReadAhead:
    """Where a file's get_tensor calls are in key order, and what of the
    keys after has been read ahead. Shares its file's lock."""

    def __init__(self, keys: List[str], sizes: Dict[str, int], lock: threading.RLock):
        self.keys, self.sizes, self.lock = keys, sizes, lock
        self.index = {n: i for i, n in enumerate(keys)}
        self.expect = 0  # the index of the next key in order
        self.ahead_to = 0  # keys before this index have been read ahead

    def after(self, name: str, window: int, defer: Callable[[str], None]) -> None:
        """get_tensor(name) was asked: when in key order, defer(k) each next
        key k, up to window bytes, that is not read ahead yet."""
        with self.lock:
            i = self.index[name]
            sequential, self.expect = i == self.expect, i + 1
            if not sequential:
                return
            k, j, ahead = self.keys, i + 1, 0
            while j < len(k) and ahead + self.sizes[k[j]] <= window:
                ahead += self.sizes[k[j]]
                if j >= self.ahead_to:
                    defer(k[j])
                j += 1
            self.ahead_to = max(self.ahead_to, j)

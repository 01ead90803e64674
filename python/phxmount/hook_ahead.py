"""get_tensor in key order (an engine's loading loop): the reads of the
next keys start with this one, as many as the file's window has room for
(PHXMOUNT_HOOK_WINDOW, shared with the slice guesses). No torch."""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Dict, List, Optional

from .hook_plan import Ahead, Held


# The window is refilled once at least 1/REFILL of it is free, while
# something is still ahead: each start of reads costs a synchronize and
# the planning of a task (some 0.3 ms on the H200 machine), which a
# refill per get_tensor would pay for every one of a MoE file's thousands
# of small tensors (run 37: 556 starts for 2,013 tensors).
REFILL = 8


class ReadAhead:
    """Where a file's get_tensor calls are in key order, and what of the
    keys after has been read ahead. Shares its file's lock."""

    def __init__(self, keys: List[str], sizes: Dict[str, int], lock: threading.RLock):
        self.keys, self.sizes, self.lock = keys, sizes, lock
        self.index = {n: i for i, n in enumerate(keys)}
        self.expect = 0  # the index of the next key in order
        self.ahead_to = 0  # keys before this index have been read ahead
        self.order: deque = deque()  # the names read ahead, in key order (some taken since)

    def reached_end(self) -> bool:
        """Whether every key has been read ahead (or asked). (Per
        get_tensor, without the lock: ahead_to only grows.)"""
        return self.ahead_to >= len(self.keys)

    def moved_on(self, name: str, ahead: Ahead) -> bool:
        """get_tensor(name) in key order where after() would only move on:
        nothing passed over to drop, and the window not yet due for a
        refill. Then the position moves and True; else False, and after()
        does the rest (the keys taken before name are forgotten either
        way). The per-call path of an engine's loop: no callbacks made."""
        with self.lock:
            i = self.index[name]
            if i != self.expect:
                return False
            order, held = self.order, ahead.held
            while order and self.index[order[0]] < i:
                h = held.get(order[0])
                if h is not None and h.kind in ("ahead", "deferred"):
                    return False  # passed over: after() drops it
                order.popleft()
            done = self.ahead_to >= len(self.keys)  # every key read ahead: nothing left to refill with
            if not done and not (self.ahead_to > i + 1 and ahead.room() < ahead.window // REFILL):
                return False
            self.expect = i + 1
            return True

    def after(self, name: Optional[str], dev: int, ahead: Ahead, defer: Callable[[str], None],
              drop: Callable[[str, Held], None], whole: Optional[Callable[[str], bool]] = None,
              region: Optional[Callable[[str], Optional[int]]] = None) -> List[str]:
        """get_tensor(name) onto dev was asked: when in key order, the read-
        aheads of keys before it (passed over) are dropped, and each next
        key not read ahead yet is deferred (defer(k)) while the window has
        room for it. A key that whole(k) says is not read whole is held
        for the read of its guessed region where region(k) says how many
        bytes that takes (hook_defer), and stops the read-ahead where it
        says None (its tensor is deferred unguessed; the next call goes on
        from there). Returns the keys held for guessed regions, for the
        caller to start (Held kind "deferred", its plan the read once
        started)."""
        made: List[str] = []
        with self.lock:
            # name None: before the first key (a warm file, hook_next)
            i = self.index[name] if name is not None else -1
            sequential, self.expect = name is None or i == self.expect, i + 1
            if not sequential:
                return made
            while self.order and self.index[self.order[0]] < i:
                k = self.order.popleft()
                h = ahead.held.get(k)
                if h is not None and h.kind in ("ahead", "deferred"):
                    drop(k, ahead.take(k))
            j = max(i + 1, self.ahead_to)
            if j > i + 1 and ahead.room() < ahead.window // REFILL:
                return made  # enough is ahead: refill in larger starts, not one per call
            while j < len(self.keys):
                k = self.keys[j]
                read_whole = whole is None or whole(k)
                size = self.sizes[k] if read_whole else (region(k) if region is not None else None)
                if size is None:
                    break
                if k not in ahead.held:  # (a slice guessed for it holds its own)
                    if not ahead.hold(k, Held(dev, size, "ahead" if read_whole else "deferred")):
                        break
                    if read_whole:
                        defer(k)
                    else:
                        made.append(k)
                    self.order.append(k)
                j += 1
            self.ahead_to = max(self.ahead_to, j)
        return made

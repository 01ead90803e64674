"""What a hooked file's reads start together, per device, and what they
may hold ahead of the caller. A reader that will read the whole file gets
one plan for it at its first read (get_tensors; transformers, whose loader
binds every tensor to its device before it reads any), and the read-ahead
joins the next read (Starts); get_tensor's read-ahead and get_slice's
guesses hold at most PHXMOUNT_HOOK_WINDOW bytes between them (Ahead).
No torch."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Dict, List, Optional

from .hook_report import report


class Starts:
    """The names deferred until the next read onto each device, and those
    started. Shares its file's lock."""

    def __init__(self, lock: threading.RLock):
        self.lock = lock
        self.deferred: Dict[int, Dict[str, None]] = {}  # per device, in order
        self.started: Dict[int, set] = {}

    def defer(self, dev: int, name: str) -> None:
        """name will be read onto dev: it starts with the next read there."""
        if name in self.started.get(dev, ()):  # (a look first: get_tensor of a key read ahead, per tensor)
            return
        with self.lock:
            if name not in self.started.get(dev, ()):
                self.deferred.setdefault(dev, {})[name] = None

    def of(self, dev: int) -> tuple:
        """(started, deferred) onto dev, as they are (the caller holds the
        lock while it looks)."""
        return self.started.get(dev, ()), self.deferred.get(dev, ())

    def reads(self, dev: int, name: str) -> bool:
        """Whether name's whole read onto dev started, or starts with the next read."""
        with self.lock:
            return name in self.started.get(dev, ()) or name in self.deferred.get(dev, ())

    def start(self, reader, dev: int, task: int) -> List:
        """Starts what is deferred onto dev, in tasks of task bytes (0: the
        reader's in-order task); returns the plans started."""
        if not self.deferred.get(dev):  # (a look first, per read: a name deferred meanwhile starts with its own thread's read)
            return []
        with self.lock:
            names = list(self.deferred.pop(dev, {}))
            self.started.setdefault(dev, set()).update(names)
        if not names:
            return []
        report.started()
        return reader.prefetch(names, flush_bytes=task or reader.fetcher.in_order_task)

    def clear(self) -> None:
        with self.lock:
            self.deferred.clear()


@dataclass
class Held:
    """A read started ahead of the caller: onto dev, nbytes; its plan key
    once started (what SafeOpen.drop takes) and, for a guess, its plan
    (for a deferred tensor's guessed region, (region, its Pending))."""
    dev: int
    nbytes: int
    kind: str  # "ahead" (get_tensor's read-ahead), "guess" (a slice guessed) or "deferred" (hook_defer)
    key: Optional[tuple] = None
    plan: object = None


class Ahead:
    """The reads a file started ahead of its caller and not yet taken, by
    name: at most window bytes, whatever the caller does. A read the caller
    takes, passes over or guessed wrong leaves it (hook_ahead, hook_guess);
    a fall-back or a close empties it. Shares its file's lock."""

    def __init__(self, window: int, lock: threading.RLock):
        self.window, self.lock = window, lock
        self.held: Dict[str, Held] = {}
        self.bytes = 0

    def room(self) -> int:
        with self.lock:
            return self.window - self.bytes

    def hold(self, name: str, h: Held) -> bool:
        """Counts h against the window, where it fits (False: it does not;
        nothing is held)."""
        with self.lock:
            if name in self.held or self.bytes + h.nbytes > self.window:
                return False
            self.held[name] = h
            self.bytes += h.nbytes
            return True

    def resize(self, name: str, nbytes: int) -> None:
        """What is held for name takes nbytes now (its read was planned)."""
        with self.lock:
            h = self.held.get(name)
            if h is not None:
                self.bytes += nbytes - h.nbytes
                h.nbytes = nbytes

    def take(self, name: str) -> Optional[Held]:
        """What was held for name (no longer counted), or None."""
        with self.lock:
            h = self.held.pop(name, None)
            if h is not None:
                self.bytes -= h.nbytes
            return h

    def started(self, plans) -> None:
        """The plans of held reads have started: their keys."""
        if not plans:
            return
        with self.lock:
            for p in plans:
                h = self.held.get(p.name)
                if h is not None and h.key is None:
                    h.key = p.key

    def clear(self) -> List[Held]:
        """Everything held, no longer counted (the caller drops what started)."""
        with self.lock:
            out, self.held, self.bytes = list(self.held.values()), {}, 0
            return out

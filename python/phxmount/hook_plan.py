"""What a hooked file's reads start together, per device: a reader that
will read the whole file gets one plan for it at its first read
(get_tensors; transformers, whose loader binds every tensor to its device
before it reads any), and the read-ahead joins the next read. No torch."""

from __future__ import annotations

import threading
from typing import Dict

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
        with self.lock:
            if name not in self.started.get(dev, ()):
                self.deferred.setdefault(dev, {})[name] = None

    def of(self, dev: int) -> tuple:
        """(started, deferred) onto dev, as they are (the caller holds the
        lock while it looks)."""
        return self.started.get(dev, ()), self.deferred.get(dev, ())

    def start(self, reader, dev: int, task: int) -> None:
        """Starts what is deferred onto dev, in tasks of task bytes (0: the
        reader's in-order task)."""
        with self.lock:
            names = list(self.deferred.pop(dev, {}))
            self.started.setdefault(dev, set()).update(names)
        if names:
            report.started()
            reader.prefetch(names, flush_bytes=task or reader.fetcher.in_order_task)

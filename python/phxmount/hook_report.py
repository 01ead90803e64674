"""What the safetensors hook says: once per kind of event on stderr, and
what it did, summed up at exit. No torch."""

from __future__ import annotations

import sys
import threading
import time
from typing import Optional


class Report:
    """What the hook did in this process: said once per kind of event on
    stderr, and summed up at exit."""

    def __init__(self, out=None):
        self.out = out
        self.lock = threading.Lock()
        self.said = set()
        self.files = self.tensors = self.bytes = self.fallbacks = self.starts = 0
        self.opened_ahead = 0  # files of them opened before the caller opened them (hook_next)
        self.devices = set()
        # perf_counter of the first read asked for, and of the last landed:
        # its bytes in device memory (a read started ahead lands before it
        # is asked for; one whose end is not known, when it is handed over)
        self.first = self.last = None

    def say(self, key: str, msg: str) -> None:
        with self.lock:
            if key in self.said:
                return
            self.said.add(key)
        print(f"phxmount hook: {msg}", file=self.out or sys.stderr, flush=True)

    def asked(self) -> None:
        if self.first is not None:  # (set once: per tensor of thousands, no lock)
            return
        with self.lock:
            if self.first is None:
                self.first = time.perf_counter()

    def started(self) -> None:
        with self.lock:
            self.starts += 1

    def opened(self, ahead: bool = False) -> None:
        """A file's first reader: one more file through phxmount (ahead:
        one the hook opened and started before the caller opened it)."""
        with self.lock:
            self.files += 1
            self.opened_ahead += ahead

    def landed(self, dev: int, nbytes: int, tensors: int = 1, at: Optional[float] = None) -> None:
        """tensors of nbytes were handed over on dev, their bytes landed at
        at (perf_counter; None: now)."""
        with self.lock:
            self.tensors += tensors
            self.bytes += nbytes
            self.devices.add(dev)
            at = time.perf_counter() if at is None else at
            self.last = at if self.last is None else max(self.last, at)

    def fell_back(self, path: str, why: BaseException) -> None:
        with self.lock:
            self.fallbacks += 1
        self.say(f"fallback {why.__class__.__name__}: {why}",
                 f"{path}: {why}; reading it with safetensors instead")

    def summary(self) -> str:
        with self.lock:
            devs = ", ".join(f"cuda:{d}" for d in sorted(self.devices)) or "no GPU"
            span = ""
            if self.first is not None and self.last is not None and self.last > self.first:
                secs = self.last - self.first
                span = (f" in {secs:.3f} s from the first read asked for to the last landed "
                        f"({self.bytes / secs / 1e9:.1f} GB/s)")
            return (f"{self.files} file(s) through phxmount, {self.tensors} tensor(s), "
                    f"{self.bytes / 1e9:.2f} GB onto {devs}{span}, {self.starts} start(s)"
                    + (f", {self.opened_ahead} file(s) started before they were opened" if self.opened_ahead else "")
                    + f"; {self.fallbacks} fallback(s) to safetensors")

    def at_exit(self) -> None:
        """The summary, when the hook did anything (atexit)."""
        if self.files or self.fallbacks:
            print(f"phxmount hook: {self.summary()}", file=self.out or sys.stderr, flush=True)


report = Report()

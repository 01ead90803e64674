"""Thread pools kept for the process's next reader, and a few reused
threads for what runs later or off the caller's thread.

Why. `Thread.start` returns only once the new thread has run, and beside
threads that take and give the interpreter's lock at every ioctl that
wait is long: 0.1 ms on an idle interpreter, 0.6-1 ms (8 ms at the 90th
percentile) beside four reading threads (this project's CI machine, two
CPUs). A loop over a checkpoint's files started some seven threads a file
on the caller's thread (a reader's pool of four, its urgent thread, its
closer, the next file's timer): run 66's world-8 narrow loop counted 19
thread starts in 85-100 ms. Here a thread starts only for the first
readers of a process:

* `take(width)` is an idle pool of that many threads that a closed
  reader handed back (`give`), or a new one: each reader still has its
  own pool while it is open (its reads are served exactly as before, by
  its own threads, as wide as it asked), only the threads outlive it. At
  most KEEP pools of each width are kept; more are shut down.
* `soon(fn)` runs fn on one of a few reused threads of the process, and
  `later(seconds, fn)` hands it to them after seconds unless cancelled
  (one timer thread): the hook's closes and the next file's expiry.

A child made by fork has none of its parent's threads: what was kept is
forgotten in the child (os.register_at_fork), which starts its own.
"""

from __future__ import annotations

import concurrent.futures as cf
import heapq
import itertools
import os
import threading
import time
from typing import Callable, Dict, List, Optional

# Idle pools kept per width: a loop has its file's reader and the next
# file's (hook_next) open at once, a pool each, and an urgent pool each.
KEEP = 4

_lock = threading.Lock()
_idle: Dict[int, List[cf.ThreadPoolExecutor]] = {}


def take(width: int) -> cf.ThreadPoolExecutor:
    """A pool of width threads with nothing queued, the caller's until it
    gives it back."""
    with _lock:
        free = _idle.get(width)
        if free:
            return free.pop()
    return cf.ThreadPoolExecutor(max_workers=width, thread_name_prefix="phx-io")


def give(pool: cf.ThreadPoolExecutor, width: int) -> None:
    """Hands back a pool taken with take(width), once every task submitted
    to it has ended: kept for the next reader, or shut down."""
    with _lock:
        free = _idle.setdefault(width, [])
        if len(free) < KEEP:
            free.append(pool)
            return
    pool.shutdown(wait=False)


def kept() -> int:
    """Idle pools kept now (tests)."""
    with _lock:
        return sum(len(v) for v in _idle.values())


class Later:
    """A call `later` will make unless cancelled first."""

    __slots__ = ("when", "fn", "cancelled")

    def __init__(self, when: float, fn: Callable[[], None]):
        self.when, self.fn, self.cancelled = when, fn, False

    def cancel(self) -> None:
        self.cancelled = True


# Threads that run the chores: a close is a FLUSH round trip, and one on a
# mount that stopped answering must hold up only itself and as many
# others as there are threads, never every later close and expiry.
CHORE_THREADS = 4


class _Chores:
    """Calls run as soon as may be on a few reused threads, and calls set
    for later handed to them at their time by one timer thread; both
    started at the first call."""

    def __init__(self):
        self.cond = threading.Condition(threading.Lock())
        self.heap: list = []
        self.order = itertools.count()  # ties: in the order asked
        self.timer: Optional[threading.Thread] = None
        self.pool: Optional[cf.ThreadPoolExecutor] = None
        self.running: set = set()  # futures of calls handed to the pool, not yet ended

    def run(self, fn: Callable[[], None]) -> None:
        """fn on the pool; RuntimeError once the interpreter is finalizing."""
        with self.cond:
            if self.pool is None:
                self.pool = cf.ThreadPoolExecutor(max_workers=CHORE_THREADS, thread_name_prefix="phxmount-chore")
            fut = self.pool.submit(_quietly, fn)
            self.running.add(fut)
        fut.add_done_callback(self._ended)

    def _ended(self, fut: cf.Future) -> None:
        with self.cond:
            self.running.discard(fut)
            self.cond.notify_all()

    def add(self, delay: float, fn: Callable[[], None]) -> Later:
        c = Later(time.monotonic() + max(0.0, delay), fn)
        with self.cond:
            heapq.heappush(self.heap, (c.when, next(self.order), c))
            if self.timer is None:
                self.timer = threading.Thread(target=self._serve, name="phxmount-timer", daemon=True)
                self.timer.start()
            self.cond.notify_all()
        return c

    def _serve(self) -> None:
        while True:
            with self.cond:
                while not self.heap or self.heap[0][0] > time.monotonic():
                    self.cond.wait(None if not self.heap else self.heap[0][0] - time.monotonic())
                c = heapq.heappop(self.heap)[2]
            if not c.cancelled:
                try:
                    self.run(c.fn)
                except RuntimeError:  # the interpreter is finalizing: nothing runs later any more
                    return

    def drain(self, timeout: float) -> bool:
        """Waits until every call asked to run now has run (those set for
        later and cancelled ones do not count); False after timeout
        seconds."""
        end = time.monotonic() + timeout
        with self.cond:
            while self.running or any(not c.cancelled and c.when <= time.monotonic() for _, _, c in self.heap):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.05))
        return True


def _quietly(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001: a chore's failure is its own (closes report nothing either)
        pass


_chores = _Chores()


def later(seconds: float, fn: Callable[[], None]) -> Later:
    """fn() after seconds on a chore thread, unless cancelled."""
    return _chores.add(seconds, fn)


def soon(fn: Callable[[], None]) -> None:
    """fn() on a chore thread as soon as one is free; RuntimeError once
    the interpreter is finalizing (the caller runs it itself then)."""
    _chores.run(fn)


def drain(timeout: float = 30) -> bool:
    """Waits for the chores due now (tests; interpreter exit)."""
    return _chores.drain(timeout)


def _forget_in_child() -> None:
    global _lock, _chores
    _lock = threading.Lock()
    _idle.clear()
    _chores = _Chores()


os.register_at_fork(after_in_child=_forget_in_child)

"""The process's worker threads: reads, closes and timers run on threads
made once and reused, not on threads started per file.

Why. `Thread.start` returns only once the new thread has run, and beside
threads that take and give the interpreter's lock at every ioctl that
wait is long: 0.1 ms on an idle interpreter, 0.6-1 ms (8 ms at the 90th
percentile) beside four reading threads on this project's CI machine. A
loop over a checkpoint's files started seven threads a file on the
caller's thread (a reader's pool of four, its urgent thread, its closer,
the next file's timer). Now a thread starts only when every one started
before is busy.

* `run(fn, *args)` runs fn on an idle worker (one is started where none
  is idle) and returns its Future.
* A `Lane` is a queue of tasks served in order by at most `width`
  workers at once: a reader's own pool of that many threads, as far as
  its tasks can tell (batchio's submitters keep one for their reads and
  one, one wide, for the reads a caller waits for).
* `later(seconds, fn)` runs fn after seconds unless cancelled, on one
  timer thread for the process.

A child made by fork has none of its parent's threads: it starts its own
at its first task (os.register_at_fork).
"""

from __future__ import annotations

import concurrent.futures as cf
import heapq
import itertools
import os
import threading
import time
from collections import deque
from typing import Callable, Optional

# Workers are started only while every one is busy, so this is a bound for
# a runaway caller, not a size: a loop keeps about two readers' lanes busy.
MAX_WORKERS = 256

_lock = threading.Lock()
_pool: Optional[cf.ThreadPoolExecutor] = None
_timers: Optional["_Timers"] = None


def _workers() -> cf.ThreadPoolExecutor:
    global _pool
    p = _pool
    if p is None:
        with _lock:
            if _pool is None:
                _pool = cf.ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="phx-worker")
            p = _pool
    return p


def run(fn: Callable, *args) -> cf.Future:
    """fn(*args) on a worker; RuntimeError once the interpreter is
    finalizing (no new work then: the caller runs it itself)."""
    return _workers().submit(fn, *args)


class Lane:
    """Tasks served in order by at most width workers at once (module doc)."""

    def __init__(self, width: int, name: str):
        self.width, self.name = max(1, width), name
        self._tasks: deque = deque()
        self._serving = 0  # workers serving this lane now
        self._cond = threading.Condition(threading.Lock())
        self._closed = False

    def submit(self, fn: Callable, *args) -> cf.Future:
        """Queues fn(*args); RuntimeError after shutdown (as an executor's)."""
        fut: cf.Future = cf.Future()
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self.name}: submit after shutdown")
            self._tasks.append((fut, fn, args))
            serve = self._serving < self.width
            self._serving += serve
        if serve:
            try:
                run(self._serve)
            except RuntimeError:  # the interpreter is finalizing: here, then
                self._serve()
        return fut

    def _serve(self) -> None:
        me = threading.current_thread()
        own, me.name = me.name, self.name  # the lane's name while it runs its tasks (probes tell lanes apart by it)
        try:
            while True:
                with self._cond:
                    if not self._tasks:
                        self._serving -= 1
                        self._cond.notify_all()
                        return
                    fut, fn, args = self._tasks.popleft()
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn(*args))
                    except BaseException as e:  # noqa: BLE001: the future carries it
                        fut.set_exception(e)
                # What a task holds (batchio: the memory its extents name)
                # goes when it has run, not when the next one is taken.
                del fut, fn, args
        finally:
            me.name = own

    def shutdown(self, wait: bool = False) -> None:
        """No new tasks; those queued still run. wait: until they have."""
        with self._cond:
            self._closed = True
            if wait:
                self._cond.wait_for(lambda: not self._tasks and not self._serving)


class Timer:
    """A call later() will make unless cancelled first."""

    def __init__(self, fn: Callable, args: tuple):
        self.fn, self.args, self.cancelled = fn, args, False

    def cancel(self) -> None:
        self.cancelled = True


def later(seconds: float, fn: Callable, *args) -> Timer:
    """fn(*args) after seconds, on the process's timer thread (a daemon:
    a call not due yet at exit is not made)."""
    global _timers
    with _lock:
        if _timers is None:
            _timers = _Timers()
        ts = _timers
    return ts.add(seconds, fn, args)


class _Timers:
    def __init__(self):
        self._heap: list = []
        self._seq = itertools.count()  # orders calls due at the same time
        self._cond = threading.Condition(threading.Lock())
        threading.Thread(target=self._loop, name="phx-timer", daemon=True).start()

    def add(self, seconds: float, fn: Callable, args: tuple) -> Timer:
        t = Timer(fn, args)
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._seq), t))
            self._cond.notify()
        return t

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                _, _, t = heapq.heappop(self._heap)
            if not t.cancelled:
                try:
                    t.fn(*t.args)
                except Exception:  # noqa: BLE001: a timer's call reports its own failures
                    pass


def _forget_parents() -> None:
    global _lock, _pool, _timers
    _lock, _pool, _timers = threading.Lock(), None, None  # (the lock may have been held at the fork)


os.register_at_fork(after_in_child=_forget_parents)

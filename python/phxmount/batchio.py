"""Moving extents from client threads. BatchIO sends BATCH ioctls on a
mount from the threads of its pool, all on one descriptor of the file (the
daemon serves ioctls of one descriptor concurrently, and an open of a file
on the mount is a FUSE round trip: one is enough), every ioctl carrying up
to 409 extents. PreadIO is the fallback off a mount: pread into host
memory, said so by whoever chose it. Both take extents as columns
(extents.Cols) and return futures; wait_all waits with a deadline.

The memory that extents land in (or, for writes, come from) must outlive
every ioctl that names it, whatever the caller does meanwhile: drop a
prefetched request, stop iterating, meet another request's error or time
out. So a queued task holds that memory itself (submit's keep) and lets go
of it only when its ioctls have returned: the caching allocator cannot hand
those blocks to a new tensor while the daemon still writes into them."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import errno
import os
import threading
import time
from typing import Dict, List, Optional, Union

from . import abi, threadpools
from .client import PhxError, PhxFile
from .extents import Cols

def wait_all(futures: List[cf.Future], timeout: Optional[float], what: str) -> None:
    """Waits for every future; raises the first failure, or TimeoutError
    after timeout seconds (the tasks still hold their memory: submit)."""
    done, not_done = cf.wait(futures, timeout=timeout)
    if not_done:
        raise TimeoutError(f"{what}: {len(not_done)} of {len(futures)} requests not done after {timeout} s")
    for f in futures:
        f.result()


class _Submitter:
    """A pool of client threads sharing one descriptor of the file: fd
    when given (it is closed with the pool), else opened at first use;
    closed once every request has finished, when its pools go back to
    the process for the next reader (threadpools: no thread started per
    file)."""

    # False: the pools are this submitter's own, shut down at its end (a
    # test that waits for a pool's threads to exit).
    shares_pools = True

    def __init__(self, path: Union[str, os.PathLike], threads: int, fd: Optional[int] = None):
        self.path = os.fspath(path)
        self.threads = max(1, threads)
        self._pool = self._take(self.threads)
        self._lock = threading.Lock()
        self._fd = fd  # not yet wrapped in a handle
        self._h = None
        # Requests not finished yet (each leaves at its end: a KV client
        # queues hundreds, and a scan per submit made queueing quadratic).
        self._live: set = set()
        self._urgent: Optional[cf.ThreadPoolExecutor] = None  # made at the first urgent task
        self.calls = 0  # ioctls (or preads) issued
        self.closed = False
        self._retired = False  # the descriptor closed, the pools given back

    def _handle(self):
        h = self._h
        if h is None:
            with self._lock:
                if self._h is None:
                    fd, self._fd = self._fd, None
                    self._h = self._open(fd)
                h = self._h
        return h

    def _open(self, fd: Optional[int]):
        """The handle: of fd when given, else of the path opened now."""
        raise NotImplementedError

    def _close_handle(self, h) -> None:
        raise NotImplementedError

    def run(self, cols: Cols) -> None:
        """Moves every extent of cols on the calling thread."""
        raise NotImplementedError

    def _run_holding(self, cols: Cols, keep) -> float:
        """Runs cols; its future's result is when they landed (perf_counter)."""
        # The executor's work item holds keep until run has returned; the
        # del keeps a failure's traceback from holding it any longer.
        try:
            self.run(cols)
            return time.perf_counter()
        finally:
            del keep

    def submit(self, cols: Cols, keep=None, urgent: bool = False) -> cf.Future:
        """Queues the extents of cols. keep (the memory they name) is held
        by the queued task until its ioctls have returned. urgent: a caller
        is waiting for them now; they go to a thread of their own rather
        than behind the tasks queued ahead (the daemon serves both at once).
        RuntimeError after close (the pools serve another reader by then)."""
        with self._lock:
            if self.closed:
                raise RuntimeError(f"{self.path}: submit after close")
            if urgent and self._urgent is None:
                self._urgent = self._take(1)
            fut = (self._urgent if urgent else self._pool).submit(self._run_holding, cols, keep)
            self._live.add(fut)
        fut.add_done_callback(self._finished)  # (at once when it is done already)
        return fut

    @contextlib.contextmanager
    def held(self):
        """Keeps the descriptor open while the caller runs extents on a
        thread of its own (run; the planner's measurement on a chore
        thread): a close in the meantime takes effect when it ends.
        RuntimeError after close."""
        token = object()
        with self._lock:
            if self.closed:
                raise RuntimeError(f"{self.path}: run after close")
            self._live.add(token)
        try:
            yield
        finally:
            with self._lock:
                self._live.discard(token)
                last = self._last()
            if last:
                self._retire()

    def pending(self) -> int:
        """Tasks queued or running."""
        with self._lock:
            return len(self._live)

    def _finished(self, fut: cf.Future) -> None:
        with self._lock:
            self._live.discard(fut)
            last = self._last()
        if last:
            self._retire()

    def _last(self) -> bool:
        """Whether the reader is closed with nothing in flight and not yet
        retired (then it is, by the caller); self._lock is held."""
        if not self.closed or self._live or self._retired:
            return False
        self._retired = True
        return True

    def _retire(self) -> None:
        """Closes the descriptor and gives the pools back, their every task
        ended (on the thread that ended the last one, or close's)."""
        try:
            self._close_all()
        finally:  # a close that fails must not keep the threads from the next reader
            for pool, width in ((self._pool, self.threads), (self._urgent, 1)):
                if pool is None:
                    continue
                if self.shares_pools:
                    threadpools.give(pool, width)
                else:
                    pool.shutdown(wait=False)

    def _take(self, width: int) -> cf.ThreadPoolExecutor:
        if self.shares_pools:
            return threadpools.take(width)
        return cf.ThreadPoolExecutor(max_workers=width, thread_name_prefix="phx-io")

    def close(self) -> None:
        """No new requests; the descriptor closes and the pools go back when
        the last request has finished (at once when none is in flight)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            last = self._last()
        if last:
            self._retire()

    def _close_all(self) -> None:
        with self._lock:
            h, self._h, fd, self._fd = self._h, None, self._fd, None
        if h is not None:
            self._close_handle(h)
        if fd is not None:  # given, and no request ever ran
            os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BatchIO(_Submitter):
    """BATCH_READ (or BATCH_WRITE) ioctls on a file of a mount; strided
    ones for columns that hold strided extents (a column slice of every
    row is one extent), plain ones, piece by piece, where the daemon has no
    strided batches (ENOTTY, remembered)."""

    kind = "mount"

    def __init__(self, path: Union[str, os.PathLike], threads: int = 4, write: bool = False,
                 fd: Optional[int] = None):
        super().__init__(path, threads, fd)
        self.write = write
        self.strided = True  # until the daemon says otherwise

    def _open(self, fd: Optional[int]) -> PhxFile:
        return PhxFile(self.path, os.O_WRONLY if self.write else os.O_RDONLY, fd=fd)

    def _close_handle(self, h: PhxFile) -> None:
        h.close()

    def run(self, cols: Cols) -> None:
        f = self._handle()
        strided = cols.strided  # (a pass over the counts: once per task)
        if strided and self.strided:
            try:
                for part in cols.split_pieces(abi.MAX_STRIDED_EXTENTS, abi.MAX_PIECES):
                    self.calls += 1
                    f.batch_strided_cols(part, self.write)
                return
            except PhxError as e:
                if e.errno != errno.ENOTTY:
                    raise
                self.strided = False  # an older daemon (it refuses the first one): the pieces one by one
        for part in (cols.expanded() if strided else cols).split(abi.MAX_EXTENTS):
            self.calls += 1
            f.batch_cols(part, self.write)


class PreadIO(_Submitter):
    """pread into host memory: views maps a buffer id to a writable
    memoryview (the host buffers a backend allocated)."""

    kind = "pread"

    def __init__(self, path: Union[str, os.PathLike], views: Dict[int, memoryview], threads: int = 4,
                 fd: Optional[int] = None):
        super().__init__(path, threads, fd)
        self.views = views

    def _open(self, fd: Optional[int]) -> int:
        return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC) if fd is None else fd

    def _close_handle(self, h: int) -> None:
        os.close(h)

    def run(self, cols: Cols) -> None:
        fd = self._handle()
        for buf_id, off, length, fo in cols.pieces():
            mv = self.views[buf_id][off:off + length]
            got = 0
            while got < length:
                self.calls += 1
                n = os.preadv(fd, [mv[got:]], fo + got)
                if n <= 0:
                    raise PhxError(errno.EIO, f"pread {self.path}: {length} bytes at file offset {fo}: "
                                              f"only {got} (file shorter than its header says?)")
                got += n


def timed(fn, *args) -> float:
    """Seconds fn(*args) took."""
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0

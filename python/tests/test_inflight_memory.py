"""The destination memory of a request lives until every ioctl that names
it has returned, on every path (issue 18, item 3): a timeout, a SafeOpen
closed with prefetched requests, a stream() whose consumer stops early, a
request whose result() fails while others are in flight, a save that fails.
The I/O here is a client-thread pool (batchio._Submitter, the one BatchIO
uses) whose tasks block until the test lets them go, standing in for BATCH
ioctls the daemon has not answered yet; no mount is needed."""

import errno
import gc
import os
import tempfile
import threading
import unittest
import weakref

from phxmount.batchio import _Submitter, wait_all
from phxmount.client import PhxError
from phxmount.extents import Cols
from phxmount.fetch import Fetcher, select, stream
from phxmount.safeopen import SafeOpen
from phxmount.stformat import write_file
from phxmount.savefile import Source, save

KiB = 1 << 10


class Mem:
    """Stands in for a tensor: what the caching allocator would reuse once
    the last reference goes."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes


class GatedIO(_Submitter):
    """Each task waits for a token (the daemon answering one BATCH), then
    fails when it carries an extent at a file offset in fail_at."""

    kind = "gated"
    shares_pools = False  # the tests wait for its pool's threads to exit

    def __init__(self, path, threads=1):
        super().__init__(path, threads)
        self.tokens = threading.Semaphore(0)
        self.fail_at = set()

    def answer(self, n: int = 1000) -> None:
        self.tokens.release(n)

    def _open(self):
        return None

    def _close_handle(self, h) -> None:
        pass

    def run(self, cols: Cols) -> None:
        if not self.tokens.acquire(timeout=30):
            raise TimeoutError("the test never answered this task")
        for _buf, _off, length, fo in cols:
            if fo in self.fail_at:
                raise PhxError(errno.EIO, f"injected failure at file offset {fo}")


class TrackingBackend:
    """Allocates Mem objects and remembers a weak reference to each."""

    def __init__(self):
        self.refs = []

    def prepare(self, plans) -> None:
        pass

    def alloc(self, plan):
        m = Mem(plan.read_bytes)
        self.refs.append(weakref.ref(m))
        return m

    scratch = alloc

    def locate(self, mem):
        return 1, 0

    def finish(self, mem, plan):
        return mem.nbytes

    def release(self, mem) -> None:
        pass

    def alive(self) -> int:
        gc.collect()
        return sum(1 for r in self.refs if r() is not None)


class InflightMemoryTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "m.safetensors")
        write_file(self.path, [(f"t{i}", "U8", [64 * KiB], bytes([i]) * (64 * KiB)) for i in range(6)])
        self.io = GatedIO(self.path)
        self.backend = TrackingBackend()
        # One task per request (flush_bytes 1): requests fail or land apart.
        self.fetcher = Fetcher(self.path, self.backend, self.io, strategy="exact", flush_bytes=1, timeout=30)

    def tearDown(self):
        self.io.answer()
        self.io.close()
        self.dir.cleanup()

    def alive_after_answers(self):
        """Answers every task, waits until the pool has run them all and
        counts the memory still alive."""
        self.io.answer()
        self.io._pool.shutdown(wait=True)
        return self.backend.alive()

    def test_closing_with_prefetched_requests(self):
        f = SafeOpen(self.fetcher, None)
        f.prefetch([f"t{i}" for i in range(6)])
        f.close()
        del f
        self.assertEqual(self.backend.alive(), 6, "memory freed while its reads may still land")
        self.assertEqual(self.alive_after_answers(), 0, "memory kept after every read returned")

    def test_a_stream_left_early(self):
        plans = select(self.fetcher)
        it = stream(self.fetcher, plans, window=1 << 30)
        self.io.answer(1)  # the first request's read lands
        self.assertEqual(next(it), ("t0", 64 * KiB))
        it.close()  # the consumer stops (iter_tensors' caller breaks out)
        del it, plans
        # t0 was returned to the caller and dropped; the reads of the other
        # five may still be in flight (those queued behind the gate).
        self.assertEqual(self.backend.alive(), 5)
        self.assertEqual(self.alive_after_answers(), 0)

    def test_a_failing_request_with_others_in_flight(self):
        plans = select(self.fetcher)
        self.io.fail_at.add(self.fetcher.header.data_start + plans[0].info.begin)
        pends = self.fetcher.start(plans)
        self.io.answer(1)  # the first request's read fails
        with self.assertRaises(PhxError):
            pends[0].result()
        del pends, plans
        self.assertEqual(self.backend.alive(), 5, "requests still in flight lost their memory")
        self.assertEqual(self.alive_after_answers(), 0)

    def test_a_timeout(self):
        m = Mem(1)
        ref = weakref.ref(m)
        fut = self.io.submit(Cols(), m)
        del m
        with self.assertRaises(TimeoutError):
            wait_all([fut], 0.05, "slow")
        gc.collect()
        self.assertIsNotNone(ref(), "freed while the request may still write into it")
        self.io.answer()
        fut.result(10)
        self.io._pool.shutdown(wait=True)
        gc.collect()
        self.assertIsNone(ref(), "kept after the request returned")

    def test_a_save_that_times_out(self):
        from phxmount import savefile
        out = os.path.join(self.dir.name, "out.safetensors")
        srcs = [Source(f"s{i}", "U8", (64 * KiB,), 64 * KiB, 1, i * 64 * KiB) for i in range(4)]
        keep = Mem(4 * 64 * KiB)
        ref = weakref.ref(keep)
        io = GatedIO(out)
        real = savefile.BatchIO
        savefile.BatchIO = lambda path, threads, write: io
        try:
            with self.assertRaises(TimeoutError):
                save(out, srcs, keep=keep, timeout=0.05)
        finally:
            savefile.BatchIO = real
        del keep
        gc.collect()
        self.assertIsNotNone(ref(), "the sources freed while a write may still read them")
        io.answer()
        io._pool.shutdown(wait=True)
        gc.collect()
        self.assertIsNone(ref(), "kept after every write returned")


if __name__ == "__main__":
    unittest.main()

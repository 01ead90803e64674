"""BatchIO's choice of ioctl: strided batches for columns that hold
strided extents, plain ones otherwise, and plain ones piece by piece once a
daemon without strided batches refused one (ENOTTY). No mount: a recording
stand-in for the file's ioctls."""

import errno
import unittest

from phxmount.batchio import BatchIO
from phxmount.client import PhxError
from phxmount.extents import Cols


class Recorder:
    def __init__(self, strided_ok):
        self.strided_ok, self.calls = strided_ok, []

    def batch_strided_cols(self, cols, write=False):
        if not self.strided_ok:
            raise PhxError(errno.ENOTTY, "no strided batches here")
        self.calls.append(("strided", len(cols), cols.nbytes))

    def batch_cols(self, cols, write=False):
        self.calls.append(("plain", len(cols), cols.nbytes))

    def close(self):
        pass


class FakeIO(BatchIO):
    def __init__(self, strided_ok):
        super().__init__("/nonexistent", threads=1)
        self.rec = Recorder(strided_ok)

    def _open(self, fd):
        return self.rec


def column(n=1000):
    c = Cols()
    c.add_run(1, n, 0, 512, 512, 4096, 4096)  # a column of n rows
    return c


class BatchIOTest(unittest.TestCase):
    def test_strided_when_the_daemon_has_them(self):
        io = FakeIO(True)
        io.run(column())
        plain = Cols()
        plain.add(1, 0, 100, 0)
        io.run(plain)
        self.assertEqual(io.rec.calls, [("strided", 1, 512000), ("plain", 1, 100)])
        io.close()

    def test_plain_pieces_after_enotty(self):
        io = FakeIO(False)
        io.run(column())
        self.assertFalse(io.strided)
        self.assertEqual(io.rec.calls, [("plain", 409, 409 * 512), ("plain", 409, 409 * 512), ("plain", 182, 182 * 512)])
        io.rec.calls.clear()
        io.run(column(10))  # remembered: no strided ioctl tried again
        self.assertEqual(io.rec.calls, [("plain", 10, 5120)])
        io.close()

    def test_strided_batches_keep_max_pieces(self):
        """A strided batch carries at most MAX_PIECES pieces (the daemon
        refuses more with E2BIG): columns of more pieces go in several, a
        column of more than MAX_PIECES rows cut into runs of its rows,
        every piece sent once, in order."""
        from phxmount import abi
        cols = Cols()
        rows = 3 * abi.MAX_PIECES + 7
        cols.add_run(1, rows, 0, 2, 2, 100, 16)  # one column of rows
        for k in range(300):
            cols.add_run(2, 1000, k << 20, 8, 8, k << 24, 64)
        sent = []

        def record(part, write=False):
            self.assertLessEqual(len(part), abi.MAX_STRIDED_EXTENTS)
            self.assertLessEqual(sum(part.counts), abi.MAX_PIECES)
            abi.encode_strided_batch_cols(len(part), part)  # what the ioctl would carry
            sent.append(part)
        io = FakeIO(True)
        io.rec.batch_strided_cols = record
        io.run(cols)
        self.assertEqual([p for part in sent for p in part.pieces()], list(cols.pieces()))
        self.assertEqual(sum(sum(part.counts) for part in sent), rows + 300 * 1000)
        self.assertEqual(len(sent), -(-(rows + 300 * 1000) // abi.MAX_PIECES))  # every batch but the last full
        io.close()
        with self.assertRaisesRegex(ValueError, "pieces"):
            abi.encode_strided_batch_cols(1, cols.part(0, 1))

    def test_other_errors_are_errors(self):
        io = FakeIO(True)

        def eio(cols, write=False):
            raise PhxError(errno.EIO, "disk")
        io.rec.batch_strided_cols = eio
        with self.assertRaises(PhxError):
            io.run(column())
        self.assertTrue(io.strided)
        io.close()


if __name__ == "__main__":
    unittest.main()


class Gated(Recorder):
    """A file whose plain batches wait for a gate: the pool's thread is busy."""

    def __init__(self):
        super().__init__(True)
        import threading
        self.gate = threading.Event()

    def batch_cols(self, cols, write=False):
        if len(cols) > 1:
            self.gate.wait(10)
        super().batch_cols(cols, write)


class UrgentTest(unittest.TestCase):
    def test_an_urgent_task_does_not_queue_behind_the_pool(self):
        io = FakeIO(True)
        io.rec = Gated()
        slow, queued = Cols(), Cols()
        for k in range(2):
            slow.add(1, k * 10, 10, k * 10)
            queued.add(1, k * 10, 10, k * 10)
        one = Cols()
        one.add(1, 0, 10, 0)
        a = io.submit(slow)  # holds the pool's one thread
        b = io.submit(queued)  # waits behind it
        now = io.submit(one, urgent=True)
        now.result(5)  # done while the pool is still held
        self.assertFalse(a.done() or b.done())
        io.rec.gate.set()
        a.result(5), b.result(5)
        io.close()

    def test_no_task_after_close(self):
        io = FakeIO(True)
        io.close()
        one = Cols()
        one.add(1, 0, 10, 0)
        for urgent in (False, True):
            with self.assertRaises(RuntimeError):
                io.submit(one, urgent=urgent)


class LiveTest(unittest.TestCase):
    def test_a_finished_request_is_not_kept(self):
        # close() waits for the requests still in flight; a finished one
        # leaves that set at its end, not at some later submit (a scan of
        # every request queued at each submit made queueing hundreds
        # quadratic).
        io = FakeIO(True)
        io.rec = Gated()
        two = Cols()
        for k in range(2):
            two.add(1, k * 10, 10, k * 10)
        futs = [io.submit(two) for _ in range(50)]  # (Gated holds a task of more than one extent)
        self.assertEqual(len(io._live), 50)
        io.rec.gate.set()
        for f in futs:
            f.result(5)
        self.assertEqual(len(io._live), 0, "finished requests are still held")
        io.close()


class HeldTest(unittest.TestCase):
    def test_a_close_while_held_takes_effect_when_the_hold_ends(self):
        # The planner measures on a chore thread with run() (fetch's
        # measure_soon): a close meanwhile must not close the descriptor
        # under it.
        io = FakeIO(True)
        closed = []
        io._close_handle = closed.append
        one = Cols()
        one.add(1, 0, 10, 0)
        with io.held():
            io.run(one)
            io.close()
            self.assertEqual(closed, [], "the descriptor closed while held")
            io.run(one)
            with self.assertRaises(RuntimeError):
                io.submit(one)
        self.assertEqual(closed, [io.rec])
        with self.assertRaises(RuntimeError):
            with io.held():
                pass

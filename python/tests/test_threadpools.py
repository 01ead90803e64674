"""threadpools: a closed reader's pool serves the next reader (no thread
started per file), never while its tasks run; soon and later on a few
reused chore threads, one stuck chore holding up no other; a forked
child starts its own. No mount needed."""

import threading
import time
import unittest

from mountutil import in_child

from phxmount import threadpools
from phxmount.batchio import _Submitter
from phxmount.extents import Cols


class EchoIO(_Submitter):
    """A submitter whose every task waits for the test's go (when gated)
    and records the thread that ran it."""

    kind = "echo"

    def __init__(self, threads=2, gate=None):
        super().__init__("/nonexistent", threads)
        self.gate = gate
        self.ran_on = []

    def _open(self, fd):
        return None

    def _close_handle(self, h) -> None:
        pass

    def run(self, cols: Cols) -> None:
        if self.gate is not None and not self.gate.wait(10):
            raise TimeoutError("the test never opened the gate")
        self.ran_on.append(threading.get_ident())


def phx_threads():
    return {t.ident for t in threading.enumerate() if t.name.startswith("phx-io")}


class PoolsTest(unittest.TestCase):
    def setUp(self):
        threadpools._idle.clear()

    def test_the_next_reader_runs_on_the_threads_of_the_last(self):
        a = EchoIO(threads=2)
        for _ in range(4):
            a.submit(Cols()).result(10)
        first = set(a.ran_on)
        a.close()
        before = phx_threads()
        b = EchoIO(threads=2)
        for _ in range(4):
            b.submit(Cols()).result(10)
        self.assertLessEqual(set(b.ran_on), first, "the second reader started threads of its own")
        self.assertEqual(phx_threads(), before, "a thread was started for the second reader")
        b.close()
        self.assertEqual(threadpools.kept(), 1)

    def test_a_pool_goes_back_only_when_its_tasks_have_ended(self):
        gate = threading.Event()
        a = EchoIO(threads=1, gate=gate)
        fut = a.submit(Cols())
        a.close()
        self.assertEqual(threadpools.kept(), 0, "handed on with a task still running on it")
        with self.assertRaises(RuntimeError):
            a.submit(Cols())  # closed: its pool may serve another reader
        b = EchoIO(threads=1)
        b.submit(Cols()).result(10)  # a pool of its own meanwhile
        gate.set()
        fut.result(10)
        deadline = time.monotonic() + 10
        while threadpools.kept() < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(threadpools.kept(), 1, "not handed back once its task ended")
        b.close()
        self.assertEqual(threadpools.kept(), 2)

    def test_at_most_keep_pools_are_kept(self):
        readers = [EchoIO(threads=3) for _ in range(threadpools.KEEP + 2)]
        for r in readers:
            r.submit(Cols()).result(10)
        for r in readers:
            r.close()
        self.assertEqual(threadpools.kept(), threadpools.KEEP)

    def test_an_urgent_pool_is_kept_too(self):
        a = EchoIO(threads=2)
        a.submit(Cols(), urgent=True).result(10)
        a.close()
        self.assertEqual(threadpools.kept(), 2, "the reader's pool and its urgent one")

    def test_a_forked_child_starts_its_own(self):
        a = EchoIO(threads=2)
        a.submit(Cols()).result(10)
        a.close()
        self.assertEqual(threadpools.kept(), 1)
        def child():  # its parent's pools have no threads here
            if threadpools.kept() != 0:
                return False
            b = EchoIO(threads=2)
            b.submit(Cols()).result(5)
            done = threading.Event()
            threadpools.soon(done.set)
            return done.wait(5)

        self.assertTrue(in_child(child), "the child forgot nothing, or its reads or chores did not run")


class ChoresTest(unittest.TestCase):
    def test_later_runs_at_its_time_unless_cancelled(self):
        ran = []
        t0 = time.monotonic()
        threadpools.later(0.15, lambda: ran.append(("late", time.monotonic() - t0)))
        c = threadpools.later(0.05, lambda: ran.append(("cancelled", 0)))
        threadpools.soon(lambda: ran.append(("soon", time.monotonic() - t0)))
        c.cancel()
        time.sleep(0.4)
        self.assertEqual([n for n, _ in ran], ["soon", "late"])
        self.assertGreaterEqual(ran[1][1], 0.15)

    def test_drain_waits_for_every_chore(self):
        ran = []
        for i in range(20):
            threadpools.soon(lambda i=i: (time.sleep(0.002), ran.append(i)))
        self.assertTrue(threadpools.drain(10))
        self.assertEqual(sorted(ran), list(range(20)))

    def test_a_stuck_chore_holds_up_only_itself(self):
        # A close on a mount that stopped answering: later closes and the
        # next file's expiry still run.
        stuck, ran = threading.Event(), []
        threadpools.soon(lambda: stuck.wait(10))
        threadpools.soon(lambda: ran.append("close"))
        threadpools.later(0.05, lambda: ran.append("expiry"))
        deadline = time.monotonic() + 5
        while len(ran) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        stuck.set()
        self.assertEqual(sorted(ran), ["close", "expiry"])
        self.assertTrue(threadpools.drain(10))

    def test_a_failing_chore_does_not_stop_the_next(self):
        ran = []
        threadpools.soon(lambda: 1 / 0)
        threadpools.soon(lambda: ran.append(1))
        self.assertTrue(threadpools.drain(10))
        self.assertEqual(ran, [1])


if __name__ == "__main__":
    unittest.main()

"""phxmount.workers: threads started once and reused; a lane's width, order
and what its tasks hold; timers; a forked child."""

import gc
import os
import threading
import time
import unittest
import weakref

from phxmount import workers
from phxmount.batchio import BatchIO
from phxmount.extents import Cols


class Held:
    """Something a task holds (batchio: the memory its extents name)."""


def phx_threads():
    return {t.ident for t in threading.enumerate() if t.name.startswith(("phx-worker", "phx-io"))}


class LaneTest(unittest.TestCase):
    def test_width_bounds_the_tasks_running_at_once_and_order_is_kept(self):
        lane = workers.Lane(2, "test-lane")
        gate, lock = threading.Event(), threading.Lock()
        running, most, order = [0], [0], []

        def task(i):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
                order.append(i)
            gate.wait(5)
            with lock:
                running[0] -= 1
            return i

        futs = [lane.submit(task, i) for i in range(6)]
        time.sleep(0.1)
        self.assertEqual(running[0], 2, "a lane two wide runs two tasks while they block")
        gate.set()
        self.assertEqual([f.result(5) for f in futs], list(range(6)))
        self.assertEqual(most[0], 2)
        self.assertEqual(order, list(range(6)), "tasks start in the order they were queued")
        lane.shutdown(wait=True)

    def test_failures_reach_the_future(self):
        lane = workers.Lane(1, "test-lane")
        fut = lane.submit(lambda: 1 // 0)
        with self.assertRaises(ZeroDivisionError):
            fut.result(5)
        self.assertEqual(lane.submit(lambda: 7).result(5), 7, "the lane goes on after a failure")

    def test_a_task_lets_go_of_what_it_holds_when_it_has_run(self):
        lane = workers.Lane(1, "test-lane")
        gate = threading.Event()
        held = Held()
        ref = weakref.ref(held)
        first = lane.submit(lambda h: None, held)
        second = lane.submit(gate.wait, 5)  # the lane's worker is still serving it
        del held
        first.result(5)
        gc.collect()
        self.assertIsNone(ref(), "held after its task ran, while the lane served the next")
        gate.set()
        second.result(5)

    def test_no_task_after_shutdown_and_queued_ones_still_run(self):
        lane = workers.Lane(1, "test-lane")
        gate = threading.Event()
        a = lane.submit(gate.wait, 5)
        b = lane.submit(lambda: "queued")
        lane.shutdown()
        with self.assertRaises(RuntimeError):
            lane.submit(lambda: None)
        gate.set()
        self.assertTrue(a.result(5))
        self.assertEqual(b.result(5), "queued")
        lane.shutdown(wait=True)

    def test_shutdown_waits_for_every_task(self):
        lane = workers.Lane(3, "test-lane")
        futs = [lane.submit(time.sleep, 0.05) for _ in range(6)]
        lane.shutdown(wait=True)
        self.assertTrue(all(f.done() for f in futs))

    def test_lanes_after_the_first_start_no_thread(self):
        # A loop over a checkpoint's files makes a reader (two lanes) a
        # file: only the first file's may start threads.
        def a_file():
            lane = workers.Lane(4, "test-lane")
            gate = threading.Event()
            futs = [lane.submit(gate.wait, 5) for _ in range(6)]
            time.sleep(0.05)
            gate.set()
            [f.result(5) for f in futs]
            lane.shutdown(wait=True)

        a_file()
        time.sleep(0.05)  # the workers go idle
        before = phx_threads()
        for _ in range(5):
            a_file()
        self.assertEqual(phx_threads() - before, set(), "a later file started threads")


class SubmitterTest(unittest.TestCase):
    def test_readers_one_after_another_start_no_thread(self):
        def a_reader():
            io = BatchIO("/nonexistent", threads=4)
            io.run = lambda cols: time.sleep(0.01)  # its ioctls
            futs = [io.submit(Cols()) for _ in range(8)] + [io.submit(Cols(), urgent=True)]
            [f.result(5) for f in futs]
            io.close()

        a_reader()
        time.sleep(0.05)
        before = phx_threads()
        for _ in range(4):
            a_reader()
        self.assertEqual(phx_threads() - before, set(), "a later reader started threads")

    def test_close_with_requests_in_flight_closes_after_the_last(self):
        io = BatchIO("/nonexistent", threads=2)
        gate = threading.Event()
        io.run = lambda cols: gate.wait(5)
        closed = []
        io._close_all = lambda: closed.append(time.perf_counter())
        futs = [io.submit(Cols()) for _ in range(3)]
        io.close()
        time.sleep(0.05)
        self.assertEqual(closed, [], "closed while requests were in flight")
        gate.set()
        [f.result(5) for f in futs]
        deadline = time.monotonic() + 5
        while not closed and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(len(closed), 1, "not closed (or closed twice) after the last request")


class TimerTest(unittest.TestCase):
    def test_later_calls_once_when_due_and_never_when_cancelled(self):
        got = []
        done = threading.Event()
        t0 = time.monotonic()
        workers.later(0.05, lambda x: (got.append((x, time.monotonic() - t0)), done.set()), "due")
        c = workers.later(0.02, got.append, "cancelled")
        c.cancel()
        self.assertTrue(done.wait(5))
        time.sleep(0.05)
        self.assertEqual([g[0] for g in got], ["due"])
        self.assertGreaterEqual(got[0][1], 0.05)


class ForkTest(unittest.TestCase):
    def test_a_forked_child_runs_tasks_on_threads_of_its_own(self):
        lane = workers.Lane(1, "test-lane")
        lane.submit(lambda: None).result(5)  # the parent's workers exist
        pid = os.fork()
        if pid == 0:  # the child: none of the parent's threads is here
            code = 1
            try:
                code = 0 if workers.run(lambda: 42).result(5) == 42 else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0, "the child's task did not run")


if __name__ == "__main__":
    unittest.main()

"""How Fetcher.start cuts a start into tasks (no mount, no device: a
backend and an I/O that only record). The first tasks are small and grow,
so the reads begin after a few allocations; the last ones shrink to a
share of what is left among the I/O's threads, so they end together; no
task is larger than the start's task size, and every byte goes in exactly
one task."""

import concurrent.futures as cf
import os
import tempfile
import unittest

from phxmount.fetch import FIRST_TASK, Fetcher
from phxmount.stformat import Header, TensorInfo

MiB = 1 << 20


class Recorder:
    """A backend whose memory is a number and an I/O that records each
    task's bytes and completes it at once."""
    kind = "fake"

    def __init__(self, threads=4):
        self.threads, self.tasks = threads, []
        self.done = cf.Future()
        self.done.set_result(None)

    # backend
    def prepare(self, plans):
        pass

    def alloc(self, plan):
        return plan.read_bytes

    def locate(self, mem):
        return 1, 0

    def finish(self, mem, plan):
        return mem

    # I/O
    def submit(self, cols, keep, urgent=False):
        self.tasks.append(cols.nbytes)
        return self.done

    def close(self):
        pass


def fetcher(sizes, io):
    fd, path = tempfile.mkstemp()
    os.close(fd)
    infos, at = [], 0
    for i, n in enumerate(sizes):
        infos.append(TensorInfo(f"t{i}", "U8", (n,), at, at + n))
        at += n
    f = Fetcher(path, io, io, header=Header(0, 8, at, tuple(infos), None))
    os.unlink(path)
    return f


class TaskScheduleTest(unittest.TestCase):
    def test_a_file_of_small_tensors(self):
        io = Recorder(threads=4)
        f = fetcher([4 * MiB] * 256, io)  # 1 GiB
        for p in f.start([f.plan(t.name) for t in f.header.tensors], flush_bytes=128 * MiB):
            p.result()
        t = io.tasks
        self.assertEqual(sum(t), 1 << 30, "a byte in no task, or in two")
        self.assertTrue(all(x <= 128 * MiB for x in t), t)
        self.assertEqual(t[0], FIRST_TASK, t)
        self.assertEqual(t[1:4], [2 * FIRST_TASK, 4 * FIRST_TASK, 8 * FIRST_TASK], t)
        self.assertIn(128 * MiB, t)
        # The last four tasks hold less than one full one: they end together.
        self.assertLess(sum(t[-4:]), 128 * MiB, t)
        self.assertTrue(all(a >= b for a, b in zip(t[t.index(128 * MiB):], t[t.index(128 * MiB) + 1:])), t)

    def test_a_start_behind_a_full_pipeline_goes_in_whole_tasks(self):
        # A read-ahead's refill: the I/O has a task queued or running for
        # each of its threads, so this start's first task waits for them
        # whatever its size, and its last ones do not end alone.
        io = Recorder(threads=4)
        io.pending = lambda: 4
        f = fetcher([4 * MiB] * 256, io)  # 1 GiB
        for p in f.start([f.plan(t.name) for t in f.header.tensors], flush_bytes=128 * MiB, ahead=True):
            p.result()
        self.assertEqual(io.tasks, [128 * MiB] * 8)
        # Not a start a caller waits on (not ahead: a narrowed region's
        # own read), nor an urgent one, nor one beside a pipeline with room.
        for ahead, urgent, pending in ((False, False, 4), (True, True, 4), (True, False, 3)):
            io.tasks, io.pending = [], (lambda n: lambda: n)(pending)
            f = fetcher([4 * MiB] * 256, io)
            for p in f.start([f.plan(t.name) for t in f.header.tensors], flush_bytes=128 * MiB, urgent=urgent,
                             ahead=ahead):
                p.result()
            self.assertEqual(io.tasks[0], FIRST_TASK, (ahead, urgent, pending, io.tasks))
            self.assertEqual(sum(io.tasks), 1 << 30)

    def test_the_caller_task_size_bounds_every_task(self):
        # PHXMOUNT_HOOK_TASK=1 (hook tests): every tensor its own task.
        io = Recorder()
        f = fetcher([1000] * 9, io)
        for p in f.start([f.plan(t.name) for t in f.header.tensors], flush_bytes=1):
            p.result()
        self.assertEqual(io.tasks, [1000] * 9)

    def test_a_single_request_is_one_task(self):
        io = Recorder()
        f = fetcher([300 * MiB], io)
        f.start([f.plan("t0")])[0].result()
        self.assertEqual(io.tasks, [300 * MiB])


if __name__ == "__main__":
    unittest.main()

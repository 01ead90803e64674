"""What a hooked file holds, and when it lets go (issue 26 item 7), on a
real emu mount with the emulated device standing in for cuda:0:

* an unclosed hooked safe_open keeps no descriptor once collected (a count
  of /proc/self/fd);
* get_tensor's read-ahead and get_slice's guesses together never hold more
  than PHXMOUNT_HOOK_WINDOW bytes of a file, whatever the caller skips,
  mixes or asks as a slice of a tensor read ahead whole (the bytes of every
  prefetched request not yet taken, after each call);
* a fall-back after an out-of-memory releases what the file had read
  ahead;
* an INFO ioctl that fails (EIO) is said on stderr, once, with its errno,
  and asked again at the next file; another file system's answer (ENOTTY)
  is remembered without a word; a statfs that fails is not remembered.
"""

import errno
import gc
import os
import unittest
from unittest import mock

from hookutil import RANK, HookedCase, Served, StockFile
from mountutil import make_file, np, same

from phxmount import hook, hook_route  # noqa: E402
from phxmount.client import PhxError, PhxFile  # noqa: E402
from phxmount.hostbackends import open_emu  # noqa: E402

# 48 tensors of 4 KiB, in key order in the file.
MANY = [(f"t.{i:02d}", "U8", (4096,)) for i in range(48)]


def fds_of(path: str) -> int:
    """This process's descriptors of path."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == path
        except OSError:
            pass  # the listing's own descriptor, closed since
    return n


def landing_bytes(reader) -> int:
    """Bytes of the requests a reader prefetched that no caller took yet."""
    return sum(p.plan.read_bytes for q in reader._landing.values() for p in q)


class OutOfMemoryError(RuntimeError):
    """torch.cuda.OutOfMemoryError is a RuntimeError."""


class ResourcesTest(HookedCase):
    @classmethod
    def populate(cls, backing):
        super().populate(backing)
        _, ts = make_file(os.path.join(backing, "many.safetensors"), specs=MANY)
        cls.many = {n: np.frombuffer(v[2], dtype=np.uint8) for n, v in ts.items()}

    def setUp(self):
        super().setUp()
        self.gpu_ok()
        hook.install(hook.Mode(True, "cuda:0"))

    def test_an_unclosed_file_keeps_no_descriptor(self):
        with self.fake.safe_open(self.path, "pt") as f:  # the caches and threads a first load starts
            f.get_tensor("a.w")
        hook.closing.drain()
        gc.collect()
        self.assertEqual(fds_of(self.path), 0)
        for _ in range(12):
            f = self.fake.safe_open(self.path, "pt")
            self.assertIsInstance(f, hook.HookedFile)
            self.assertTrue(same(f.get_tensor("a.w"), self.arrays["a.w"]))
            self.assertGreater(fds_of(self.path), 0)
            del f
        gc.collect()
        hook.closing.drain()
        self.assertEqual(fds_of(self.path), 0, "descriptors of unclosed hooked files were kept")

    def check_window(self, f, what):
        held = sum(landing_bytes(r) for r in self.readers)
        self.assertLessEqual(held, f._ahead.window, what)
        self.assertEqual(held, sum(h.nbytes for h in f._ahead.held.values()), what)

    def test_get_tensor_that_skips_holds_at_most_the_window(self):
        order = [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 30, 31, 32, 33, 34, 35, 20, 21, 22, 23, 24, 40, 41, 47]
        with self.fake.safe_open(self.m.path("many.safetensors"), "pt") as f:
            f._ahead.window = 5 * 4096
            keys = f.keys()
            for i in order:
                self.assertTrue(same(f.get_tensor(keys[i]), self.many[keys[i]]), keys[i])
                self.check_window(f, f"after {keys[i]}")
        self.assertEqual(Served.tensors, 0)
        self.assertGreater(self.readers[0].served_from_prefetch, 0, "nothing was read ahead")

    def test_read_ahead_and_guesses_share_the_window(self):
        # A loop that takes the first layer whole (get_tensor: the next
        # tensors are read ahead whole), then the norms whole and the
        # weights as its rank's slices (guessed ahead): both in one window,
        # and a tensor read ahead whole but asked as a slice lets go.
        with self.fake.safe_open(self.m.path("layers.safetensors"), "pt") as f:
            f._ahead.window = 64 << 10
            for n, k in enumerate(f.keys()):
                part = k.split(".", 3)[3]
                if part == "norm.weight" or n < 3:
                    got, want = f.get_tensor(k), self.layers[k]
                else:
                    got, want = f.get_slice(k)[RANK[part]], self.layers[k][RANK[part]]
                self.assertTrue(same(got, want), k)
                self.check_window(f, f"after {k}")
        self.assertEqual(Served.tensors, 0)
        self.assertGreater(self.readers[0].served_from_prefetch, 0, "nothing was read ahead")

    def test_a_fall_back_after_out_of_memory_releases_the_reads_ahead(self):
        def open_reader(path, dev, availability=None, header=None, fd=None):
            r = open_emu(path, fd=fd, header=header, availability=availability)
            alloc, n = r.fetcher.backend.alloc, [0]

            def alloc_until_full(plan):
                n[0] += 1
                if n[0] > 4:
                    raise OutOfMemoryError("CUDA out of memory (injected)")
                return alloc(plan)
            r.fetcher.backend.alloc = alloc_until_full
            self.readers.append(r)
            return r
        hook._open_reader = open_reader
        with self.fake.safe_open(self.m.path("many.safetensors"), "pt") as f:
            f._ahead.window = 3 * 4096
            keys = f.keys()
            self.assertTrue(same(f.get_tensor(keys[0]), self.many[keys[0]]))
            self.assertEqual(landing_bytes(self.readers[0]), 3 * 4096, "t.01-03 read ahead")
            for k in keys[1:6]:  # t.04's read-ahead finds no memory: the file falls back
                self.assertTrue(same(np.asarray(f.get_tensor(k)), self.many[k]), k)
            self.assertEqual(self.readers[0]._landing, {}, "the reads ahead outlived the fall-back")
            self.assertEqual((f._ahead.held, f._ahead.bytes), ({}, 0))
            self.assertGreater(Served.tensors, 0)
        said = self.err.getvalue()
        self.assertEqual(said.count("out of memory (injected)"), 1, said)

    def info_failing(self, err, times=1):
        real, calls = PhxFile.info, []

        def info(f, dev=0):
            calls.append(dev)
            if len(calls) <= times:
                raise PhxError(err, "injected")
            return real(f, dev)
        return mock.patch.object(PhxFile, "info", info), calls

    def test_an_info_failure_is_said_and_asked_again(self):
        patch, calls = self.info_failing(errno.EIO)
        with patch:
            for want in (StockFile, hook.HookedFile, hook.HookedFile):
                f = self.fake.safe_open(self.path, "pt")
                self.assertIsInstance(f, want)
                f.__exit__(None, None, None)
        self.assertEqual(len(calls), 2, "asked again after the failure, then remembered")
        said = self.err.getvalue()
        self.assertEqual(said.count("INFO ioctl failed with EIO"), 1, said)

    def test_another_file_systems_answer_is_remembered_silently(self):
        patch, calls = self.info_failing(errno.ENOTTY, times=99)
        with patch:
            for _ in range(3):
                self.assertIsInstance(self.fake.safe_open(self.path, "pt"), StockFile)
        self.assertEqual(len(calls), 1)
        self.assertNotIn("phxmount hook:", self.err.getvalue())

    def test_a_failing_statfs_is_not_remembered(self):
        real, n = hook_route.statfs_type, [0]

        def statfs_type(path):
            n[0] += 1
            return None if n[0] == 1 else real(path)
        with mock.patch.object(hook_route, "statfs_type", statfs_type):
            self.assertIsInstance(self.fake.safe_open(self.path, "pt"), StockFile)
            f = self.fake.safe_open(self.path, "pt")
            self.assertIsInstance(f, hook.HookedFile)
            f.__exit__(None, None, None)


if __name__ == "__main__":
    unittest.main()


class ReleasedTest(unittest.TestCase):
    """hook_close.Resources after release(): no reader is made again (one
    made then would be nobody's to close: its descriptor would stay)."""

    def test_no_reader_after_release(self):
        import threading
        from phxmount.hook_close import Resources
        r = Resources(None, threading.RLock())
        opened = []
        r.release()
        with self.assertRaises(RuntimeError):
            r.reader(0, lambda fd: opened.append(fd) or object(), lambda: None)
        self.assertEqual(opened, [])

"""The next file of a loop (hook_next) on a real emu mount: once a file's
read-ahead reaches its last key, the next file of its series is opened by
the hook and its first reads start; the caller's open of that file gets
that object and its bytes; a file changed meanwhile, other arguments, a
caller that moves on or stops, and PHXMOUNT_HOOK_NEXT=0 get an ordinary
open (the warm file closed)."""

import os
import time
import unittest
from unittest import mock

from hookutil import LAYERS, HookedCase
from mountutil import as_array, in_child, make_file

from phxmount import hook, hook_next
from phxmount.hook_next import call_key, next_in_series, with_filename

SERIES = [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]


class SeriesNamesTest(unittest.TestCase):
    def test_next_in_series(self):
        self.assertEqual(next_in_series("/d/model-00001-of-00003.safetensors"), "/d/model-00002-of-00003.safetensors")
        self.assertEqual(next_in_series("/d/x-9-of-12.safetensors"), "/d/x-10-of-12.safetensors")
        for last in ("/d/model-00003-of-00003.safetensors", "/d/model.safetensors", "/d/model-1-of-3.bin",
                     "/d/model-00000-of-00003.safetensors"):
            self.assertIsNone(next_in_series(last), last)

    def test_arguments(self):
        self.assertEqual(with_filename(("a", "pt"), {"device": "cpu"}, "b"), (("b", "pt"), {"device": "cpu"}))
        self.assertEqual(with_filename((), {"filename": "a", "framework": "pt"}, "b"),
                         ((), {"filename": "b", "framework": "pt"}))
        self.assertEqual(call_key(("a", "pt"), {}, 0), call_key(("b", "pt"), {}, 0))
        self.assertEqual(call_key((), {"filename": "a", "framework": "pt"}, 0),
                         call_key((), {"filename": "b", "framework": "pt"}, 0))
        self.assertNotEqual(call_key(("a", "pt"), {}, 0), call_key(("a", "np"), {}, 0))
        self.assertNotEqual(call_key(("a", "pt"), {}, 0), call_key(("a", "pt"), {}, 1))


class NextFileTest(HookedCase):
    @classmethod
    def populate(cls, backing):
        super().populate(backing)
        cls.series = {}
        for seed, name in enumerate(SERIES):
            _, ts = make_file(os.path.join(backing, name), seed=100 + seed, specs=LAYERS)
            cls.series[name] = {n: as_array(*v) for n, v in ts.items()}

    def setUp(self):
        super().setUp()
        self.use(self.real, hook.Mode(True, "cuda:0"))  # get_tensor on the cpu lands on "cuda:0": the emu device
        self.gpu_ok()

    def loop(self, name):
        """The engines' loop over one file: every key with get_tensor, its
        bytes checked; returns the hooked file."""
        with self.fake.safe_open(self.m.path(name), "pt") as f:
            for k in f.keys():
                self.assertEqual(bytes(f.get_tensor(k)), self.series[name][k].tobytes(), f"{name}: {k}")
        return f

    def warm(self):
        """The warm files, once the open ahead under way (on a chore
        thread) has ended."""
        self.assertTrue(hook.next_files.settle(10), "an open ahead did not end")
        with hook.next_files.lock:
            return {os.path.basename(p): w.f for p, w in hook.next_files.warm.items()}

    def test_the_loop_gets_the_next_file_warm(self):
        files = []
        for name in SERIES:
            with self.fake.safe_open(self.m.path(name), "pt") as f:
                files.append(f)
                for k in f.keys():
                    self.assertEqual(bytes(f.get_tensor(k)), self.series[name][k].tobytes(), f"{name}: {k}")
                warm = self.warm()
                if name != SERIES[-1]:
                    nxt = SERIES[SERIES.index(name) + 1]
                    self.assertEqual(list(warm), [nxt], "the next file is not warm at the loop's last key")
                    self.assertIsNotNone(warm[nxt]._res.readers, "its reads did not start")
                    self.assertTrue(warm[nxt]._ahead.held, "nothing of it is read ahead")
                else:
                    self.assertEqual(warm, {}, "past the series' last file")
            if name != SERIES[-1]:
                ahead = warm[nxt]
        self.assertIs(files[2], ahead, "the caller's open of the last file did not get the warm one")
        self.assertFalse(any(f.warming for f in files))
        self.assertEqual(hook.report.files, 3, "a file counted twice or not at all")
        self.assertEqual(hook.report.opened_ahead, 2)
        self.assertIn("2 file(s) started before they were opened", hook.report.summary())

    def test_the_next_file_starts_after_this_ones_reads(self):
        # A file the window holds whole: its first get_tensor reaches the
        # last key, and the next file's first window must not go to the
        # daemon ahead of the keys this caller waits for.
        from phxmount import batchio
        order, real_submit = [], batchio._Submitter.submit

        def submit(sub, cols, keep=None, urgent=False):
            order.append(os.path.basename(sub.path))
            return real_submit(sub, cols, keep, urgent)
        with mock.patch.object(batchio._Submitter, "submit", submit):
            with self.fake.safe_open(self.m.path(SERIES[0]), "pt") as f:
                k = f.keys()[0]
                self.assertEqual(bytes(f.get_tensor(k)), self.series[SERIES[0]][k].tobytes())
                self.assertEqual(list(self.warm()), [SERIES[1]], "the next file did not start")
                self.assertEqual(order[0], SERIES[0], "the next file's reads went first")
                self.assertIn(SERIES[1], order, "nothing of the next file was read")

    def test_a_failed_start_is_said(self):
        def refuse(f, dev):
            raise OSError(5, "refused")
        with mock.patch.object(hook.HookedFile, "warm", refuse):
            self.loop(SERIES[0])
            self.loop(SERIES[1])
            self.assertEqual(self.warm(), {})  # (its opens ahead end with the refusal in place)
        self.assertIn("not started ahead of its open", self.err.getvalue())
        self.assertEqual((hook.report.files, hook.report.opened_ahead), (2, 0))

    def test_the_next_file_opens_off_the_callers_thread(self):
        # The open ahead runs on a chore thread; a caller that opens that
        # file while its open is under way waits for it and gets it.
        import threading
        real_warm, seen = hook.HookedFile.warm, []

        def slow_warm(f, dev):
            seen.append(threading.current_thread())
            time.sleep(0.3)
            real_warm(f, dev)
        with mock.patch.object(hook.HookedFile, "warm", slow_warm):
            self.loop(SERIES[0])
            t0 = time.monotonic()
            with self.fake.safe_open(self.m.path(SERIES[1]), "pt") as f:
                waited = time.monotonic() - t0
                for k in f.keys():
                    self.assertEqual(bytes(f.get_tensor(k)), self.series[SERIES[1]][k].tobytes(), k)
        self.assertTrue(seen, "nothing was opened ahead")
        self.assertIsNot(seen[0], threading.current_thread(), "the open ahead ran on the caller's thread")
        self.assertEqual(hook.report.opened_ahead, 1, "the caller's open did not get the file opened ahead")
        self.assertLess(waited, hook_next.CLAIM_WAIT, "the caller waited out the open ahead")

    def test_load_file_gets_the_next_file_started_whole(self):
        ahead = None
        for name in SERIES:
            with self.fake.safe_open(self.m.path(name), "pt") as f:
                if ahead is not None:
                    self.assertIs(f, ahead, f"{name}: the warm file was not handed")
                got = f.get_tensors()
                self.assertEqual(sorted(got), sorted(self.series[name]))
                for k, t in got.items():
                    self.assertEqual(bytes(t), self.series[name][k].tobytes(), f"{name}: {k}")
                ahead = self.warm().get(SERIES[SERIES.index(name) + 1]) if name != SERIES[-1] else None
                if name != SERIES[-1]:
                    self.assertIsNotNone(ahead, f"{name}: its next file did not start")
                    self.assertTrue(ahead._whole, "the next file was not started whole")
        self.assertEqual(hook.report.files, 3)

    def test_a_slice_loop_gets_the_next_file_guessed(self):
        # vLLM's get_slice loop: the rank's slice of every key; half way
        # through a file the next one's first slices start.
        rank = {"attn.q.weight": (slice(16, 32),), "attn.o.weight": (slice(None), slice(64, 128))}
        ahead = None
        for name in SERIES:
            with self.fake.safe_open(self.m.path(name), "pt") as f:
                if ahead is not None:
                    self.assertIs(f, ahead, f"{name}: the warm file was not handed")
                    self.assertTrue([h for h in f._ahead.held.values() if h.kind == "guess"],
                                    f"{name}: no slice of it was guessed ahead")
                for k in f.keys():
                    idx = rank.get(k.split(".", 3)[3], Ellipsis)
                    got = f.get_slice(k)[idx]
                    self.assertEqual(bytes(got), self.series[name][k][idx].tobytes(), f"{name}: {k}")
                ahead = self.warm().get(SERIES[SERIES.index(name) + 1]) if name != SERIES[-1] else None
                if name != SERIES[-1]:
                    self.assertIsNotNone(ahead, f"{name}: its next file did not start")
        self.assertEqual(hook.report.opened_ahead, 2)

    def test_a_changed_file_is_opened_anew(self):
        self.loop(SERIES[0])
        warm = self.warm()[SERIES[1]]
        p = os.path.join(self.m.backing, SERIES[1])
        _, ts = make_file(p, seed=999, specs=LAYERS)  # same size and names, other bytes
        self.series[SERIES[1]] = {n: as_array(*v) for n, v in ts.items()}
        self.addCleanup(self._restore, SERIES[1], 101)
        time.sleep(0.05)  # the mount's attributes of the changed file
        f = self.loop(SERIES[1])
        self.assertIsNot(f, warm, "a file changed after it was warmed was handed as it was")
        self.assertTrue(warm._closed, "the stale warm file was not closed")

    def _restore(self, name, seed):
        _, ts = make_file(os.path.join(self.m.backing, name), seed=seed, specs=LAYERS)
        self.series[name] = {n: as_array(*v) for n, v in ts.items()}

    def test_other_arguments_get_their_own_open(self):
        self.loop(SERIES[0])
        warm = self.warm()[SERIES[1]]
        with self.fake.safe_open(filename=self.m.path(SERIES[1]), framework="pt") as f:
            k = f.keys()[0]
            self.assertEqual(bytes(f.get_tensor(k)), self.series[SERIES[1]][k].tobytes())
        self.assertIsNot(f, warm)
        self.assertTrue(warm._closed)

    def test_a_caller_that_moves_on_closes_it(self):
        self.loop(SERIES[0])
        warm = self.warm()[SERIES[1]]
        self.loop(SERIES[2])  # not the next: the warm one is nobody's
        self.assertTrue(warm._closed)
        self.assertNotIn(SERIES[1], self.warm())

    def test_a_caller_that_stops_closes_it(self):
        with mock.patch.object(hook_next, "CLAIM_WITHIN", 0.05):
            self.loop(SERIES[0])
            warm = self.warm()[SERIES[1]]
            deadline = time.monotonic() + 5
            while not warm._closed and time.monotonic() < deadline:
                time.sleep(0.01)
        self.assertTrue(warm._closed, "a warm file nobody claimed stays open")
        self.assertEqual(self.warm(), {})
        self.assertEqual(hook.report.files, 1, "the unclaimed file was counted")

    def test_not_a_file_the_caller_has_open(self):
        # A loader that opens every file first and reads them one by one:
        # no second object of a file it holds (it would never be claimed).
        fs = [self.fake.safe_open(self.m.path(n), "pt") for n in SERIES]
        try:
            for f, name in zip(fs, SERIES):
                for k in f.keys():
                    self.assertEqual(bytes(f.get_tensor(k)), self.series[name][k].tobytes(), f"{name}: {k}")
                self.assertEqual(self.warm(), {}, f"{name}: a file the caller has open was warmed")
        finally:
            for f in fs:
                f.__exit__(None, None, None)

    def test_a_forked_child_opens_its_own(self):
        self.loop(SERIES[0])
        warm = self.warm()[SERIES[1]]
        def child():  # no warm file of the parent's, and its open reads the file itself
            with self.fake.safe_open(self.m.path(SERIES[1]), "pt") as f:
                k = f.keys()[0]
                return f is not warm and not hook.next_files.warm and \
                    bytes(f.get_tensor(k)) == self.series[SERIES[1]][k].tobytes()

        self.assertTrue(in_child(child), "the child took the parent's warm file, or read wrong bytes")
        self.assertIs(self.warm()[SERIES[1]], warm, "the parent's warm file went")

    def test_a_next_file_it_cannot_open_is_left_to_the_caller(self):
        # Not a safetensors file: the loop over the file before goes on;
        # the caller's own open of it says what safetensors says.
        bad = ["bad-00001-of-00002.safetensors", "bad-00002-of-00002.safetensors"]
        p = os.path.join(self.m.backing, bad[0])
        _, ts = make_file(p, seed=5, specs=LAYERS)
        self.series[bad[0]] = {k: as_array(*v) for k, v in ts.items()}
        with open(os.path.join(self.m.backing, bad[1]), "wb") as f:
            f.write(b"\xff" * 64)
        for n in bad:
            self.addCleanup(os.unlink, os.path.join(self.m.backing, n))
        self.loop(bad[0])
        self.assertEqual(self.warm(), {})
        self.assertIn("not started ahead of its open", self.err.getvalue())

    def test_off(self):
        with mock.patch.dict(os.environ, {hook_next.NEXT_ENV: "0"}):
            self.loop(SERIES[0])
        self.assertEqual(self.warm(), {})


if __name__ == "__main__":
    unittest.main()

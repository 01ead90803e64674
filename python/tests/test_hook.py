"""The safetensors drop-in (phxmount.hook) without torch or a GPU:

* the switch (PHXMOUNT_HOOK) and device names;
* the patching, in fresh interpreters, against stand-in `safetensors` and
  `transformers` packages: the name is replaced where it is defined and
  wherever a module took it, before or after the hook, and
  transformers' spawn_materialize tells hooked slices where they go;
* the routing on a real emu mount, with numpy results from the emulated
  device standing in for GPU tensors: files off the mount, other
  frameworks and devices, and host tensors go to the real safetensors
  with the same arguments; GPU-bound reads go through BATCH ioctls, the
  whole file at once for get_tensors and for transformers' pattern (from
  four threads), read ahead for get_tensor in key order; a mount that
  cannot serve the GPU and a failing read fall back to safetensors and
  say so once.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import types
import unittest
from unittest import mock

from hookutil import PYDIR, RANK, SPECS, HookedCase, SafetensorError, Served, StockFile, write_tree
from mountutil import np, opens_counted, same

from phxmount import fetch, hook, hook_env, hook_spec, threadpools  # noqa: E402
from phxmount.client import PhxError  # noqa: E402
from phxmount.fetch import Fetcher  # noqa: E402
from phxmount.hostbackends import open_emu  # noqa: E402
from phxmount.hook_import import patch_spawn  # noqa: E402


def spawned(orig):
    """transformers' spawn_materialize orig as the hook wraps it."""
    mod = types.SimpleNamespace(spawn_materialize=orig)
    patch_spawn(mod, lambda t: isinstance(t, hook.HookedSlice))
    return mod.spawn_materialize

# A stand-in for the real package: safe_open records its arguments and
# answers with them; safetensors.torch takes the name as the real one does.
FAKE_SAFETENSORS = {
    "safetensors/__init__.py": """
        calls = []
        def safe_open(filename, framework, device="cpu", *, backend="mmap"):
            calls.append((str(filename), framework, device, backend))
            return ("stock", str(filename), framework, device, backend)
    """,
    "safetensors/torch.py": """
        from safetensors import safe_open
        def load_file(filename, device="cpu", *, backend="mmap"):
            return safe_open(filename, framework="pt", device=device, backend=backend)
    """,
    "transformers/__init__.py": "",
    "transformers/core_model_loading.py": """
        def spawn_materialize(thread_pool, tensor, device=None, dtype=None, sharding_op=None, tensor_idx=None):
            return ("spawned", device, dtype)
    """,
    "early/__init__.py": "from safetensors import safe_open\n",
}


class ModeTest(unittest.TestCase):
    def test_the_switch(self):
        for v, want in (("", hook.Mode(False)), ("0", hook.Mode(False)), ("off", hook.Mode(False)),
                        ("1", hook.Mode(True)), ("auto", hook.Mode(True)), (" ON ", hook.Mode(True)),
                        ("cuda", hook.Mode(True, "cuda")), ("cuda:3", hook.Mode(True, "cuda:3"))):
            self.assertEqual(hook.parse_mode(v), want, v)
        for bad in ("cuda:x", "gpu", "2"):
            with self.assertRaises(ValueError):
                hook.parse_mode(bad)

    def test_device_names(self):
        for d, want in ((0, 0), (3, 3), ("cuda:2", 2), (" CUDA:1", 1), ("cpu", None), ("mps", None),
                        ("meta", None), (True, None), (-1, None)):
            self.assertEqual(hook.cuda_index(d), want, d)
        self.assertTrue(hook_env.is_cpu("cpu") and hook_env.is_cpu(None) and not hook_env.is_cpu("cuda:0"))


class PatchingTest(unittest.TestCase):
    """Fresh interpreters with the stand-in packages first on the path."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="phxhook-")
        write_tree(cls.dir, FAKE_SAFETENSORS)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def run_py(self, code, **env):
        e = {k: v for k, v in os.environ.items() if k != "PHXMOUNT_HOOK"}
        e.update(PYTHONPATH=os.pathsep.join([self.dir, PYDIR]), **env)
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), os.path.join(self.dir, "x.safetensors")],
                           env=e, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r

    def test_every_binding_is_replaced_before_and_after(self):
        self.run_py("""
            import early, safetensors                  # early took the name before the hook
            real = safetensors.safe_open
            import phxmount.hook as h
            import safetensors.torch                   # takes it after
            from safetensors import safe_open as late
            for where, fn in (("safetensors", safetensors.safe_open), ("early", early.safe_open),
                              ("safetensors.torch", safetensors.torch.safe_open), ("late", late)):
                assert fn is h.safe_open, where
            import transformers.core_model_loading as tcl
            assert tcl.spawn_materialize.__wrapped__ is not None
            h.uninstall()
            assert safetensors.safe_open is real and early.safe_open is real
            assert not hasattr(tcl.spawn_materialize, "__wrapped__")
        """)

    def test_hook_first_then_imports(self):
        self.run_py("""
            import phxmount.hook as h
            import safetensors.torch, transformers.core_model_loading as tcl
            assert safetensors.safe_open is h.safe_open and safetensors.torch.safe_open is h.safe_open
            assert tcl.spawn_materialize.__wrapped__ is not None
        """)

    def test_the_switch_at_import(self):
        self.run_py("""
            import phxmount.hook as h, safetensors
            assert safetensors.safe_open is not h.safe_open and not h._mode.on
        """, PHXMOUNT_HOOK="0")
        r = self.run_py("""
            import phxmount.hook as h, safetensors
            assert safetensors.safe_open is not h.safe_open
        """, PHXMOUNT_HOOK="gpu")
        self.assertIn("PHXMOUNT_HOOK='gpu'", r.stderr)
        self.run_py("""
            import phxmount.hook as h
            assert h._mode == h.Mode(True, "cuda:1"), h._mode
        """, PHXMOUNT_HOOK="cuda:1")

    def test_files_off_a_mount_go_to_safetensors_unchanged(self):
        r = self.run_py("""
            import sys, transformers, phxmount.hook, safetensors, safetensors.torch
            p = sys.argv[1]
            open(p, "wb").close()
            for args, kw, want in (((p, "pt"), {}, ("stock", p, "pt", "cpu", "mmap")),
                                   ((p, "pt", "cuda:0"), {"backend": "pread"}, ("stock", p, "pt", "cuda:0", "pread")),
                                   ((p, "np"), {}, ("stock", p, "np", "cpu", "mmap")),
                                   (("/nonexistent", "pt", 0), {}, ("stock", "/nonexistent", "pt", 0, "mmap"))):
                got = safetensors.safe_open(*args, **kw)
                assert got == want, (got, want)
            assert safetensors.torch.load_file(p, device="mps") == ("stock", p, "pt", "mps", "mmap")
            print("calls", len(safetensors.calls))
        """)
        self.assertIn("calls 5", r.stdout)
        self.assertNotIn("phxmount hook:", r.stderr, "nothing to say for files that are not on a mount")


# --- on a real emu mount ---------------------------------------------------------------

class RoutingTest(HookedCase):
    def test_host_tensors_come_from_safetensors(self):
        with self.fake.safe_open(self.path, "pt", device="cpu", backend="pread") as f:
            self.assertIsInstance(f, hook.HookedFile)
            self.assertEqual(f.keys(), sorted(self.arrays))
            self.assertEqual(f.offset_keys(), [n for n, _, _ in SPECS])
            for n, want in self.arrays.items():
                self.assertTrue(same(f.get_tensor(n), want), n)
                self.assertTrue(same(f.get_slice(n)[...], want), n)
            self.assertEqual((f.stock().device, f.stock().backend), ("cpu", "pread"))
        self.assertEqual(Served.tensors, 2 * len(self.arrays))
        with self.assertRaises(SafetensorError):
            self.fake.safe_open(self.path, "pt").get_tensor("nope")

    def test_off_the_mount(self):
        off = os.path.join(os.path.dirname(self.backing), "off.safetensors")
        self.assertIsInstance(self.fake.safe_open(off, "pt", device="cuda:0"), StockFile)
        self.assertIsInstance(self.fake.safe_open(self.path, "np", device="cpu"), StockFile)
        self.assertIsInstance(self.fake.safe_open(self.path, "pt", device="mps"), StockFile)

    def test_a_mount_without_a_gpu_falls_back_and_says_so(self):
        # The emu mount's real availability: not an NVIDIA GPU.
        with self.fake.safe_open(self.path, "pt", device="cuda:0") as f:
            for n, want in self.arrays.items():
                self.assertTrue(same(np.asarray(f.get_tensor(n)), want), n)
        self.assertGreater(Served.tensors, 0)
        said = self.err.getvalue()
        self.assertEqual(said.count("reading it with safetensors instead"), 1, said)
        self.assertIn("not an NVIDIA GPU", said)

    def test_get_tensors_is_one_plan(self):
        self.gpu_ok()
        b0 = self.batches()
        with self.fake.safe_open(self.path, "pt", device="cuda:0") as f:
            got = f.get_tensors()
        self.assertEqual(list(got), [n for n, _, _ in SPECS])
        for n, want in self.arrays.items():
            self.assertTrue(same(got[n], want), n)
        self.assertEqual(Served.tensors, 0)
        self.assertEqual(self.batches() - b0, 1, "one plan for the whole file: one BATCH")
        self.assertIn("through phxmount", self.err.getvalue())

    def test_what_starts_together_goes_in_tasks(self):
        # PHXMOUNT_HOOK_TASK bytes a task: 1 makes every tensor its own
        # BATCH, so the first lands without waiting for the rest.
        self.gpu_ok()
        with mock.patch.dict(os.environ, {hook.TASK_ENV: "1"}):
            b0 = self.batches()
            with self.fake.safe_open(self.path, "pt", device="cuda:0") as f:
                got = f.get_tensors()
        for n, want in self.arrays.items():
            self.assertTrue(same(got[n], want), n)
        self.assertEqual(self.batches() - b0, sum(1 for n, a in self.arrays.items() if a.nbytes))

    def test_transformers_pattern(self):
        self.gpu_ok()
        b0 = self.batches()
        f = self.fake.safe_open(self.path, "pt", device="cpu", backend="mmap")
        slices = {k: f.get_slice(k) for k in f.keys()}
        spawn = spawned(lambda pool, t, device=None, dtype=None, *a, **k: t)
        for k, s in slices.items():  # what from_pretrained does: device and dtype per tensor
            spawn(None, s, "cuda:0", None)
        out, errs = {}, []

        def materialize(names):
            try:
                for n in names:
                    out[n] = slices[n][...]
            except Exception as e:  # noqa: BLE001
                errs.append(e)
        names = sorted(slices)
        ts = [threading.Thread(target=materialize, args=(names[i::4],)) for i in range(4)]
        guesses = []
        after = hook.Guesses.after
        with mock.patch.object(hook.Guesses, "after", lambda g, *a, **k: (guesses.append(a[1].name), after(g, *a, **k))):
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        served = sum(r.served_from_prefetch for r in self.readers)  # (threads may each open one; one is kept)
        f.__exit__(None, None, None)
        self.assertEqual(errs, [])
        # [...] is the whole tensor: read whole, with what started together,
        # and no slice guessed from it (run 43: 2,013 guesses under the
        # file's lock made a MoE from_pretrained 6 GB/s).
        self.assertEqual(guesses, [])
        self.assertEqual(served, len(names))
        for n, want in self.arrays.items():
            self.assertTrue(same(out[n], want), n)
        self.assertEqual(Served.tensors, 0, "every tensor through the mount")
        self.assertLess(self.batches() - b0, len(self.arrays) - 1, "the bound tensors started together")

    def bound_files(self):
        """Two files on the mount, every key sliced, hook_spec off (these
        tests are of what the first read starts), and the hooked spawn."""
        self.gpu_ok()
        self.enterContext(mock.patch.dict(os.environ, {"PHXMOUNT_HOOK_SPECULATE": "0"}))
        files, slices = self.loader_files()
        return files, slices, spawned(lambda pool, t, device=None, dtype=None, *a, **k: t)

    def test_bound_files_start_together(self):
        # from_pretrained binds every tensor of every file before a pool of
        # threads asks them in key order: the first read onto the device
        # starts every file's bound tensors, not only its own file's (run
        # 51: a MoE checkpoint's last files started 0.6 s into the call).
        files, slices, spawn = self.bound_files()
        for _, _, s in slices:
            spawn(None, s, "cuda:0", None)
        second = files[1]
        self.assertEqual(set(second._starts.of(0)[1]), set(second.keys()), "bound, not started")
        f0, k0, s0 = slices[0]
        self.assertTrue(same(s0[...], self.layers[k0]))
        started, deferred = second._starts.of(0)
        self.assertEqual((set(started), set(deferred)), (set(second.keys()), set()),
                         "the second file's bound tensors started with the first file's first read")
        for f, k, s in slices[1:]:
            self.assertTrue(same(s[...], self.layers[k]), k)
        served = sum(r.served_from_prefetch for r in self.readers)
        for f in files:
            f.__exit__(None, None, None)
        self.assertEqual(served, len(slices), "every tensor from what started together")
        self.assertEqual(Served.tensors, 0, "every tensor through the mount")

    def test_a_bound_file_that_cannot_start_falls_back(self):
        # Another file's start that fails makes that file safetensors', as a
        # failing read of its own would; the file asked from is unaffected.
        files, slices, spawn = self.bound_files()
        for _, _, s in slices:
            spawn(None, s, "cuda:0", None)
        with mock.patch.object(files[1], "_reader", side_effect=OSError(5, "no reader")):
            f0, k0, s0 = slices[0]
            self.assertTrue(same(s0[...], self.layers[k0]))
        self.assertIsNotNone(files[1]._fallen)
        self.assertIsNone(files[0]._fallen)
        for f, k, s in slices:
            self.assertTrue(same(s[...], self.layers[k]), k)
        for f in files:
            f.__exit__(None, None, None)
        self.assertIn("no reader", self.err.getvalue())

    def test_read_ahead_lands_before_it_is_taken(self):
        # The summary's span ends at the last landed: a read started ahead
        # landed when its bytes were in memory, not when it was taken.
        self.gpu_ok()
        hook.install(hook.Mode(True, "cuda:0"))
        with mock.patch.dict(os.environ, {"PHXMOUNT_HOOK_DEFER": "0"}), self.fake.safe_open(self.path, "pt") as f:
            keys = f.keys()
            f.get_tensor(keys[0])
            r = self.readers[0]
            self.assertTrue(all(r.landing(k) for k in keys[1:]), "the rest read ahead")
            r.wait_prefetched()
            landed = time.perf_counter()
            time.sleep(0.05)
            for k in keys[1:]:
                self.assertTrue(same(f.get_tensor(k), self.arrays[k]), k)
            taken = time.perf_counter()
        self.assertLess(hook.report.last, landed)
        self.assertGreater(hook.report.last, hook.report.first)
        self.assertIn(f"{hook.report.last - hook.report.first:.3f} s", hook.report.summary())
        self.assertLess(hook.report.last, taken - 0.04)

    def test_a_readers_open_has_the_planner_measured_off_the_callers_thread(self):
        # The first reader of a mount asks for the cost model at its open
        # (fetch.Fetcher.measure_soon): a column slice asked later plans
        # with it, measuring nothing on the caller's thread.
        self.gpu_ok()
        key = (os.stat(self.path).st_dev, "mount")
        fetch._costs.pop(key, None)
        hook.install(hook.Mode(True, "cuda:0"))
        measured_on = []
        real = Fetcher.calibrate

        def calibrate(fetcher, plan):
            measured_on.append(threading.current_thread().name)
            return real(fetcher, plan)
        with mock.patch.object(Fetcher, "calibrate", autospec=True, side_effect=calibrate), \
                self.fake.safe_open(self.path, "pt") as f:
            k = f.keys()[0]
            self.assertTrue(same(f.get_tensor(k), self.arrays[k]))
            self.assertTrue(threadpools.drain(30))
            self.assertIn(key, fetch._costs)
            idx = (slice(None), slice(0, 37))
            self.assertTrue(same(f.get_slice("a.w")[idx], self.arrays["a.w"][idx]))
        self.assertGreaterEqual(len(measured_on), 1)
        self.assertTrue(fetch._costs[key].source.startswith("measured: "), fetch._costs[key].source)
        self.assertNotIn(threading.current_thread().name, measured_on)

    def loader_files(self):
        """Two files on the mount, every key sliced (a loader takes them whole)."""
        paths = [self.m.path("layers.safetensors"), self.m.path("layers2.safetensors")]
        files = [self.fake.safe_open(p, "pt", device="cpu") for p in paths]
        return files, [(f, k, f.get_slice(k)) for f in files for k in f.keys()]

    def test_whole_files_start_at_the_first_bind(self):
        # A loader that slices every key: its first bind onto a GPU starts
        # both files whole, before any tensor is asked for; a key bound to
        # the host afterwards lets its read go and reads on the host.
        self.gpu_ok()
        files, slices = self.loader_files()
        spawn = spawned(lambda pool, t, device=None, dtype=None, *a, **k: t)
        b0 = self.batches()
        n = hook_spec.SPECULATE_AFTER
        for _, _, s in slices[:n - 1]:
            spawn(None, s, "cuda:0", None)
        self.assertEqual(set(files[1]._starts.of(0)[0]), set(), f"not before the {n}th bind in a row")
        spawn(None, slices[n - 1][2], "cuda:0", None)
        for f in files:
            self.assertEqual(set(f._starts.of(0)[0]), set(f.keys()), "started whole at the first bind")
        for r in self.readers:
            r.wait_prefetched()  # the tasks' ioctls go from the I/O threads: all of them sent
        started = self.batches() - b0
        self.assertGreater(started, 0)
        host_f, host_k, host_s = slices[-1]
        other_f, other_k, other_s = slices[-2]
        for _, _, s in slices[n:-2]:
            spawn(None, s, "cuda:0", None)
        spawn(None, host_s, "cpu", None)
        self.assertNotIn(host_k, host_f._starts.of(0)[0], "bound to the host: no longer read onto the GPU")
        self.gpu_ok(1)
        spawn(None, other_s, "cuda:1", None)
        self.assertNotIn(other_k, other_f._starts.of(0)[0], "bound to cuda:1: no longer read onto cuda:0")
        for f, k, s in slices[:-2]:
            self.assertTrue(same(s[...], self.layers[k]), k)
        self.assertTrue(same(other_s[...], self.layers[other_k]))
        self.assertTrue(same(host_s[...], self.layers[host_k]))
        on1 = [r for r, d in zip(self.readers, self.reader_devs) if d == 1]
        self.assertEqual(len(on1), 1, "the cuda:1 tensor read onto cuda:1")
        self.assertEqual(self.batches() - b0, started + 1, "every cuda:0 tensor from the whole start")
        served = sum(r.served_from_prefetch for r in self.readers)
        for f in files:
            f.__exit__(None, None, None)
        self.assertEqual(served, len(slices) - 1, "all but the host tensor from what started")
        self.assertEqual(Served.tensors, 1, "the host tensor from safetensors")

    def test_a_cast_breaks_the_row(self):
        # A loader that binds a tensor to another dtype (or the host) in
        # between is not binding its files whole: the row starts again.
        self.gpu_ok()
        files, slices = self.loader_files()
        spawn = spawned(lambda pool, t, device=None, dtype=None, *a, **k: t)
        n = hook_spec.SPECULATE_AFTER
        for i, (_, _, s) in enumerate(slices[:2 * n - 2]):
            spawn(None, s, "cpu" if i == n - 2 else "cuda:0", None)
        self.assertEqual(set(files[1]._starts.of(0)[0]), set(), "the row was broken")
        spawn(None, slices[2 * n - 2][2], "cuda:0", None)
        self.assertEqual(set(files[1]._starts.of(0)[0]), set(files[1].keys()))
        for f, k, s in slices[:2 * n - 1]:
            self.assertTrue(same(s[...], self.layers[k]), k)
        for f in files:
            f.__exit__(None, None, None)

    def test_no_whole_files_ahead_without_room_or_every_key(self):
        self.gpu_ok()
        spawn = spawned(lambda pool, t, device=None, dtype=None, *a, **k: t)
        for why in ("no room", "a key not sliced", "off"):
            with self.subTest(why):
                hook_spec.streak.broken()
                env = {"PHXMOUNT_HOOK_SPECULATE": "0" if why == "off" else "1"}
                with mock.patch.dict(os.environ, env):
                    files, slices = self.loader_files()
                    if why == "a key not sliced":
                        files[0].spec.sliced.discard(slices[1][1])
                        files[1].spec.sliced.discard(slices[-1][1])
                    room = mock.patch("phxmount.hook_spec.room_for", return_value=why != "no room")
                    with room:
                        for _, _, s in slices[:hook_spec.SPECULATE_AFTER + 1]:
                            spawn(None, s, "cuda:0", None)
                    self.assertEqual(set(files[0]._starts.of(0)[0]), set(), why)
                    self.assertEqual(set(files[1]._starts.of(0)[0]), set(), why)
                    self.assertTrue(same(slices[0][2][...], self.layers[slices[0][1]]))
                    for f in files:
                        f.__exit__(None, None, None)

    def test_unbound_cpu_slices_stay_host(self):
        self.gpu_ok()
        f = self.fake.safe_open(self.path, "pt", device="cpu")
        s = f.get_slice("a.w")
        spawned(lambda *a, **k: None)(None, s, "cpu", None)
        self.assertTrue(same(s[2:5, 7], self.arrays["a.w"][2:5, 7]))
        self.assertEqual(Served.tensors, 1)

    def test_engine_loop_reads_ahead(self):
        self.gpu_ok()
        hook.install(hook.Mode(True, "cuda:0"))
        with self.fake.safe_open(self.path, "pt") as f:
            f._ahead.window = 1 << 20
            keys = f.keys()
            first = f.get_tensor(keys[0])
            r = self.readers[0]
            ahead = [k for k in keys[1:] if r.landing(k)]
            self.assertGreater(len(ahead), 0, "nothing read ahead")
            self.assertLessEqual(sum(f.tensors[k].nbytes for k in ahead), f._ahead.window)
            self.assertTrue(same(first, self.arrays[keys[0]]))
            for k in keys[1:]:
                self.assertTrue(same(f.get_tensor(k), self.arrays[k]), k)
            self.assertGreaterEqual(r.served_from_prefetch, len(ahead))
        self.assertEqual(Served.tensors, 0)

    def rank_index(self, name):
        return RANK[name.split(".", 3)[3]]

    def test_engine_slices_read_ahead(self):
        # vLLM's loop for a tensor-parallel rank: get_slice in key order.
        self.gpu_ok()
        hook.install(hook.Mode(True, "cuda:0"))
        b0 = self.batches()
        with self.fake.safe_open(self.m.path("layers.safetensors"), "pt") as f:
            keys = f.keys()
            for n, k in enumerate(keys):
                got = f.get_slice(k)[self.rank_index(k)]
                self.assertTrue(same(got, self.layers[k][self.rank_index(k)]), k)
                if n == 2:  # one of each role seen: the rest of the rank is on its way
                    r = self.readers[0]
                    ahead = [j for j in keys[n + 1:] if r.landing(j, self.rank_index(j))]
                    self.assertEqual(len(ahead), len(keys) - 3, "every later slice guessed")
                    whole = [j for j in keys[n + 1:] if r.landing(j) and not j.endswith("norm.weight")]
                    self.assertEqual(whole, [], "a whole tensor read ahead where a slice was asked for")
            self.assertEqual(r.served_from_prefetch, len(keys) - 3)
            self.assertEqual(r._landing, {}, "a guess was not taken")
        self.assertEqual(Served.tensors, 0)
        self.assertLess(self.batches() - b0, len(keys) // 2, "the guesses went together")

    def test_the_next_file_is_guessed_from_its_first_slice(self):
        # A checkpoint's second file: its roles were learned in the first,
        # so its first request starts the guesses of every role.
        self.gpu_ok()
        hook.install(hook.Mode(True, "cuda:0"))
        planned = []
        real_plan = Fetcher.plan

        def plan(fe, name, index=None):
            planned.append(name)
            return real_plan(fe, name, index)
        for n, path in enumerate((self.m.path("layers.safetensors"), self.m.path("layers2.safetensors"))):
            with self.fake.safe_open(path, "pt") as f, mock.patch.object(Fetcher, "plan", plan):
                keys = f.keys()
                for j, k in enumerate(keys):
                    got = f.get_slice(k)[self.rank_index(k)]
                    self.assertTrue(same(got, self.layers[k][self.rank_index(k)]), k)
                    if n == 1 and j == 0:
                        r = self.readers[-1]
                        planned.clear()
                        ahead = [x for x in keys[1:] if r.landing(x, self.rank_index(x))]
                        self.assertEqual(ahead, keys[1:], "a role learned in the first file not guessed")
                        planned.clear()
                self.assertEqual(self.readers[-1]._landing, {}, "a guess was not taken")
        self.assertEqual(self.readers[1].served_from_prefetch, len(keys) - 1)
        self.assertEqual(planned, [], "a request its guess answered was planned again")
        self.assertEqual(Served.tensors, 0)

    def test_another_rank_in_the_next_file(self):
        # The first file's slices guessed wrong for the second (another
        # rank): every slice is still right, and the wrong guesses go.
        self.gpu_ok()
        hook.install(hook.Mode(True, "cuda:0"))
        other = {"attn.q.weight": (slice(0, 16),), "attn.o.weight": (slice(None), slice(0, 64)),
                 "norm.weight": Ellipsis}
        for path, rank in ((self.m.path("layers.safetensors"), RANK), (self.m.path("layers2.safetensors"), other)):
            with self.fake.safe_open(path, "pt") as f:
                keys = f.keys()
                for k in keys:
                    idx = rank[k.split(".", 3)[3]]
                    self.assertTrue(same(f.get_slice(k)[idx], self.layers[k][idx]), k)
                self.assertEqual(self.readers[-1]._landing, {}, "a wrong guess was kept")
                self.assertEqual(f._ahead.held, {})
        # A guess from the first file that missed taught the second, rather
        # than stopping its guesses: only the roles' first requests waited.
        self.assertGreaterEqual(self.readers[-1].served_from_prefetch, len(keys) - 3)
        self.assertEqual(Served.tensors, 0)

    def test_one_open_a_file(self):
        # An open of a file on the mount is a FUSE round trip (and slow
        # while loads run): the header's descriptor serves the reads too.
        self.gpu_ok()
        hook.install(hook.Mode(True, "cuda:0"))
        with opens_counted() as opened:
            with self.fake.safe_open(self.path, "pt") as f:
                for k in f.keys():
                    self.assertTrue(same(f.get_tensor(k), self.arrays[k]), k)
        self.assertEqual(opened.count(self.path), 1, opened)
        hook.closing.drain()
        self.assertEqual(Served.tensors, 0)

    def test_slice_guesses_from_threads(self):
        # Four threads asking for the rank's slices at once: every slice
        # right, every guess taken once (none started twice, none left).
        self.gpu_ok()
        hook.install(hook.Mode(True, "cuda:0"))
        out, errs = {}, []
        with self.fake.safe_open(self.m.path("layers.safetensors"), "pt") as f:
            keys = f.keys()

            def load(part):
                try:
                    for k in part:
                        out[k] = f.get_slice(k)[self.rank_index(k)]
                except Exception as e:  # noqa: BLE001
                    errs.append(e)
            ts = [threading.Thread(target=load, args=(keys[i::4],)) for i in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            self.assertEqual(errs, [])
            self.assertEqual(self.readers[0]._landing, {}, "a guess started twice, or never taken")
            self.assertEqual(f._ahead.held, {})
        for k in keys:
            self.assertTrue(same(out[k], self.layers[k][self.rank_index(k)]), k)
        self.assertEqual(Served.tensors, 0)

    def test_a_wrong_slice_guess_is_dropped(self):
        self.gpu_ok()
        hook.install(hook.Mode(True, "cuda:0"))
        with self.fake.safe_open(self.m.path("layers.safetensors"), "pt") as f:
            f._ahead.window = 1 << 16  # a few guesses at a time
            keys = f.keys()
            other = (slice(0, 16),)  # not the rank's rows of q
            miss = [n for n, k in enumerate(keys) if k.endswith("q.weight")][3]
            for n, k in enumerate(keys):
                idx = other if n == miss else self.rank_index(k)
                got = f.get_slice(k)[idx]
                self.assertTrue(same(got, self.layers[k][idx]), k)
                self.assertLessEqual(f._ahead.bytes, f._ahead.window)
                if n == miss:
                    r = self.readers[0]
                    self.assertFalse(r.landing(k, self.rank_index(k)), "the wrong guess still held")
                    later = [j for j in keys[n + 1:] if j.endswith("q.weight")]
                    self.assertFalse(any(r.landing(j, self.rank_index(j)) for j in later), "q guessed after a miss")
            self.assertEqual(r._landing, {}, "a guess was not taken")
        self.assertEqual(Served.tensors, 0)

    def test_a_failing_read_falls_back_once(self):
        self.gpu_ok()

        def broken(path, dev, availability=None, header=None, fd=None):
            r = open_emu(path, fd=fd)

            def fail(*a):
                raise PhxError(5, "injected")
            r.get_planned = r.get_planned_at = fail
            self.readers.append(r)
            return r
        hook._open_reader = broken
        with self.fake.safe_open(self.path, "pt", device="cuda:0") as f:
            for n, want in self.arrays.items():
                got = f.get_tensor(n)
                self.assertTrue(same(np.asarray(got), want), n)
        said = self.err.getvalue()
        self.assertEqual(said.count("injected"), 1, said)
        self.assertEqual(hook.report.fallbacks, 1)

    def test_get_tensors_failing_midway_falls_back_once(self):
        # One start for the file; the third tensor's read fails: the two
        # before it stay phxmount's, the rest come from safetensors, and
        # every one is the file's.
        self.gpu_ok()

        def third_fails(path, dev, availability=None, header=None, fd=None):
            r = open_emu(path, fd=fd)
            real = r.read

            def read(plans, flush_bytes=None):
                pends = real(plans, flush_bytes)

                def fail():
                    raise PhxError(5, "injected")
                pends[2].result = fail
                return pends
            r.read = read
            self.readers.append(r)
            return r
        hook._open_reader = third_fails
        with self.fake.safe_open(self.path, "pt", device="cuda:0") as f:
            got = f.get_tensors()
        self.assertEqual(list(got), [n for n, _, _ in SPECS])
        for n, want in self.arrays.items():
            self.assertTrue(same(np.asarray(got[n]), want), n)
        self.assertEqual(hook.report.fallbacks, 1)
        self.assertEqual(hook.report.tensors, 2)
        self.assertEqual(Served.tensors, len(SPECS) - 2)

    def test_get_tensors_after_get_tensor(self):
        # A file read from before is not fresh: what its read-ahead holds is
        # taken, not read twice, and every tensor is the file's.
        self.gpu_ok()
        with self.fake.safe_open(self.path, "pt", device="cuda:0") as f:
            first = f.get_tensor(SPECS[0][0])
            got = f.get_tensors()
        self.assertTrue(same(np.asarray(first), self.arrays[SPECS[0][0]]))
        for n, want in self.arrays.items():
            self.assertTrue(same(np.asarray(got[n]), want), n)
        self.assertEqual(Served.tensors, 0)
        self.assertEqual(hook.report.fallbacks, 0)

    def test_an_index_the_planner_refuses_goes_to_safetensors(self):
        self.gpu_ok()
        with self.fake.safe_open(self.path, "pt", device="cuda:0") as f:
            got = f.get_slice("a.w")[::-1]  # a negative step: the stand-in (numpy) takes it
        self.assertTrue(same(np.ascontiguousarray(got), np.ascontiguousarray(self.arrays["a.w"][::-1])))
        self.assertEqual(hook.report.fallbacks, 0)


if __name__ == "__main__":
    unittest.main()

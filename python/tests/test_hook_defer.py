"""The hook's deferral (hook_defer) on a real emu mount, with torch's CPU
tensors standing in for GPU memory: vLLM's loop (get_tensor, narrow to the
rank, copy_ into the parameter) reads only the rank's bytes and gets
stock's values; the regions of the next keys are guessed and read ahead;
a role used whole goes back to whole tensors read ahead; a caller that
collects tensors stops the deferral; PHXMOUNT_HOOK_DEFER=0 turns it off.
Needs torch (Debian's python3-torch where the interpreter has none)."""

import os
import unittest
from unittest import mock

from hookutil import LAYERS, HookedCase
from mountutil import as_array, make_file, np, torch_or_none

torch = torch_or_none()
WHY = None if torch is not None and np is not None else "torch or numpy is not importable (scripts/deps.sh installs them)"

from phxmount import deferred, hook, hook_defer  # noqa: E402
from phxmount.client import EmuBuffer  # noqa: E402

if torch is not None and not hasattr(torch.Tensor, "nbytes"):
    # Debian's torch (1.13) predates Tensor.nbytes (2.1), which the hook's
    # report reads of what landed.
    torch.Tensor.nbytes = property(lambda t: t.numel() * t.element_size())

SHAPES = {n: shape for n, _, shape in LAYERS}
DTYPES = {n: dt for n, dt, _ in LAYERS}
TORCH = {"BF16": "bfloat16", "F32": "float32", "F16": "float16"}
# A rank of world 4 (hookutil.RANK): rows of q, columns of o, the norm whole.
NARROW = {"attn.q.weight": (0, 32, 16), "attn.o.weight": (1, 128, 64)}


def as_torch(x, st_dtype):
    """The emu reader's numpy result as the torch tensor of its bytes."""
    a = np.ascontiguousarray(x)
    return torch.frombuffer(bytearray(a.tobytes()), dtype=getattr(torch, TORCH[st_dtype])).reshape(a.shape)


class TorchReader:
    """The emu reader, its results as torch tensors (a CUDA reader's are)."""

    def __init__(self, inner):
        self._inner = inner

    def get_planned(self, p, then=None):
        return self.get_planned_at(p, then)[0]

    def get_planned_at(self, p, then=None):
        r, at = self._inner.get_planned_at(p, then)
        return as_torch(r, p.dtype), at

    def read_in_place(self, plans, mems, urgent=False, **kw):
        pends = self._inner.read_in_place(plans, mems, urgent, **kw)
        for pend in pends:
            if not pend.given:  # read packed: its result as torch's
                pend.result = (lambda r, dt: lambda: as_torch(r(), dt))(pend.result, pend.plan.dtype)
        return pends

    def __getattr__(self, name):
        return getattr(self._inner, name)


def emu_storage(shape, st_dtype, dev):
    """A deferred tensor's storage on the emulated device: a torch tensor
    over an emu buffer's memory (what the in-place reads land in)."""
    dtype = getattr(torch, TORCH[st_dtype])
    n = dtype_size(dtype)
    for s in shape:
        n *= s
    buf = EmuBuffer(n)
    plain = torch.frombuffer(buf.map, dtype=torch.uint8, count=n).view(dtype).reshape(shape)
    return plain, buf


def dtype_size(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def same(a, b) -> bool:
    """Equal shape, dtype and bytes (random bytes hold NaNs, which equal nothing)."""
    return (a.shape == b.shape and a.dtype == b.dtype and
            torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def role_of(name):
    return name.split(".", 3)[3]


@unittest.skipIf(WHY, WHY)
class DeferTest(HookedCase):
    strategy = "auto"  # the planner's: column regions read in place by covering reads here
    def setUp(self):
        super().setUp()
        inner = hook._open_reader

        def open_reader(*a, **k):
            r = inner(*a, **k)
            r.fetcher.strategy = self.strategy
            return TorchReader(r)
        hook._open_reader = open_reader
        self.storage = mock.patch.object(hook_defer, "_storage", emu_storage)
        self.storage.start()
        self.use(self.real, hook.Mode(True, "cuda:0"))
        self.gpu_ok()
        self.elsewhere = []  # Source._fill_elsewhere's calls: a read into the storage failed
        orig = hook_defer.Source._fill_elsewhere
        self.fills = mock.patch.object(hook_defer.Source, "_fill_elsewhere",
                                       lambda src, dest, regions: (self.elsewhere.append((src.name, src.failed)),
                                                                   orig(src, dest, regions)))
        self.fills.start()
        self.expect_elsewhere = False
        stock_to = hook.HookedFile._stock_to  # the stand-in safetensors gives numpy: torch's, as the real one
        self.stock = mock.patch.object(hook.HookedFile, "_stock_to",
                                       lambda f, info, index, dev: as_torch(stock_to(f, info, index, dev), info.dtype))
        self.stock.start()

    def tearDown(self):
        self.storage.stop()
        self.fills.stop()
        self.stock.stop()
        super().tearDown()
        if not self.expect_elsewhere:
            self.assertEqual([e for e in self.elsewhere if e[1] is not None][:3], [],
                             "a deferred tensor's read into its storage failed")

    def want(self, k):
        return as_torch(self.layers[k], DTYPES[k])

    def read_bytes(self):
        return sum(r.fetcher.read_bytes for r in self.readers)

    def vllm_loop(self, f, check=True):
        """get_tensor, narrow to the rank (or the whole), copy_ into a
        parameter; returns {name: parameter}."""
        out = {}
        for k in f.keys():
            t = f.get_tensor(k)
            self.assertEqual(tuple(t.shape), SHAPES[k])
            n = NARROW.get(role_of(k))
            part = t.narrow(*n) if n else t
            p = torch.empty(part.shape, dtype=part.dtype)
            p.copy_(part)
            out[k] = p
            if check:
                w = self.want(k)
                self.assertTrue(same(p, w.narrow(*n) if n else w), k)
        return out

    def test_the_narrow_loop_reads_the_rank(self):
        with self.fake.safe_open(self.m.path("layers.safetensors"), "pt") as f:
            self.vllm_loop(f)
            f_defer = f._defer
        # What the planner reads in place for the rank's slice of each
        # narrowed tensor (a covering read where extents cost more than
        # bytes), the norms whole, and each role's scout (its first
        # tensor in key order, layer 0's here) whole: no other narrowed
        # tensor whole.
        fe = self.readers[0].fetcher
        keys = sorted(n for n, _, _ in LAYERS)
        scouts = {min((k for k in keys if role_of(k) == r), key=keys.index) for r in map(role_of, keys)}
        self.assertEqual(scouts, {"model.layers.0." + r for r in ("attn.q.weight", "attn.o.weight", "norm.weight")})
        want = 0
        for n, dt, shape in LAYERS:
            cut = NARROW.get(role_of(n))
            index = None if cut is None or n in scouts else (slice(None),) * cut[0] + (slice(cut[1], cut[1] + cut[2]),)
            want += fe.plan(n, index, in_place=index is not None).read_bytes
        self.assertEqual(self.read_bytes(), want, "bytes read: the rank's slices as planned, the norms and scouts whole")
        self.assertLess(want, sum(fe.info(n).nbytes for n, _, _ in LAYERS))
        narrowed = sum(1 for n, _, _ in LAYERS if role_of(n) in NARROW)
        self.assertEqual(f_defer.handed_ahead, narrowed - 1 + 1,
                         "every narrowed tensor but the first key was made ahead, its region (a scout: the whole)"
                         " started, and the norms' scout")
        self.assertEqual(hook.uses_seen.get("model.layers.#.attn.q.weight", (64, 96), 0), hook_defer.NARROW)
        self.assertEqual(hook.uses_seen.get("model.layers.#.norm.weight", (96,), 0), hook_defer.WHOLE)

    def test_a_wrong_guess_costs_bytes_not_values(self):
        # Another rank's loop on the second file: every region guessed from
        # the first file's is wrong, read ahead all the same (its bytes
        # land at their own place); the caller gets its own region's.
        global NARROW
        with self.fake.safe_open(self.m.path("layers.safetensors"), "pt") as f:
            self.vllm_loop(f)
        saved, NARROW = NARROW, {"attn.q.weight": (0, 0, 16), "attn.o.weight": (1, 0, 64)}
        try:
            with self.fake.safe_open(self.m.path("layers2.safetensors"), "pt") as f:
                self.vllm_loop(f)
                self.assertGreater(f._defer.handed_ahead, 0, "nothing was guessed")
        finally:
            NARROW = saved

    def test_guesses_hold_the_window(self):
        # A guessed column region planned as a covering read takes more
        # than its region: what the read-ahead holds never exceeds the
        # window whatever the plans turn out to be.
        with self.fake.safe_open(self.m.path("layers.safetensors"), "pt") as f:
            self.vllm_loop(f)
        with self.fake.safe_open(self.m.path("layers2.safetensors"), "pt") as f:
            f._ahead.window = 2 * 40 * 256 * 4  # two o.weight tensors, whole
            peak = 0
            for k in f.keys():
                t = f.get_tensor(k)
                peak = max(peak, f._ahead.bytes)
                self.assertLessEqual(f._ahead.bytes, f._ahead.window, k)
                n = NARROW.get(role_of(k))
                w = self.want(k)
                self.assertTrue(same((t.narrow(*n) if n else t).clone(), w.narrow(*n) if n else w), k)
            self.assertGreater(peak, 0, "nothing was held ahead")

    def test_a_failed_read_in_place_reads_elsewhere(self):
        def refuse(*a, **k):
            raise OSError(5, "refused in place")
        self.expect_elsewhere = True
        with mock.patch.object(hook_defer.RegionReads, "start", refuse):
            with self.fake.safe_open(self.m.path("layers.safetensors"), "pt") as f:
                self.vllm_loop(f)
        self.assertTrue([e for e in self.elsewhere if e[1] is not None], "the fall-back was not taken")

    def test_writes_through_a_narrowed_view_are_kept(self):
        with self.fake.safe_open(self.m.path("layers.safetensors"), "pt") as f:
            self.vllm_loop(f)  # learned: the next file's regions are read ahead
        with self.fake.safe_open(self.m.path("layers2.safetensors"), "pt") as f:
            k = "model.layers.3.attn.o.weight"
            for name in f.keys():
                t = f.get_tensor(name)
                if name == k:
                    break
            self.assertTrue(deferred.is_deferred(t))
            t.narrow(1, 128, 64).fill_(7)
            want = self.want(k).clone()
            want.narrow(1, 128, 64).fill_(7)
            self.assertTrue(same(t.clone(), want), "the rest read later overwrote the caller's writes")

    def test_used_after_the_file_is_closed(self):
        # As stock's tensors outlive their safe_open, a deferred one read
        # after the close gets its bytes (the file's reads are gone: the
        # hooked file's own way, safetensors' where phxmount cannot).
        self.expect_elsewhere = True
        with self.fake.safe_open(self.m.path("layers.safetensors"), "pt") as f:
            self.vllm_loop(f)
        with self.fake.safe_open(self.m.path("layers2.safetensors"), "pt") as f:
            got = [(k, f.get_tensor(k)) for k in list(f.keys())[:2]]
        self.assertTrue(any(deferred.is_deferred(t) for _, t in got))
        for k, t in got:
            n = NARROW.get(role_of(k))
            self.assertTrue(same(t.narrow(*n) if n else t.clone(), self.want(k).narrow(*n) if n else self.want(k)), k)
            self.assertTrue(same(t.clone(), self.want(k)), k)

    def test_views_are_stocks(self):
        with self.fake.safe_open(self.m.path("layers.safetensors"), "pt") as f:
            k = "model.layers.0.attn.o.weight"
            t = f.get_tensor(k)
            self.assertTrue(deferred.is_deferred(t))
            v = t.narrow(1, 128, 64)
            w = self.want(k).narrow(1, 128, 64)
            self.assertEqual((v.stride(), v.storage_offset(), v.is_contiguous()), (w.stride(), w.storage_offset(), False))
            self.assertTrue(same(v, w))
            self.assertTrue(same(t.t(), self.want(k).t()))  # the rest read, kept values
            self.assertIs(type(t), torch.Tensor)

    def test_a_role_used_whole_is_read_ahead_whole(self):
        with self.fake.safe_open(self.m.path("layers.safetensors"), "pt") as f:
            keys = f.keys()
            kinds = []
            for k in keys:
                t = f.get_tensor(k)
                kinds.append(deferred.is_deferred(t))
                p = torch.empty(t.shape, dtype=t.dtype)
                p.copy_(t)
                self.assertTrue(same(p, self.want(k)), k)
        self.assertEqual(kinds[:3], [True] * 3, "the first tensor of each role is deferred")
        self.assertEqual(kinds[3:], [False] * (len(keys) - 3), "a role used whole is not deferred again")
        self.assertGreater(self.readers[0].served_from_prefetch, len(keys) // 2, "whole tensors not read ahead")

    def many_roles(self):
        """A file of WHOLE_PRIOR roles of one small tensor each, on the
        mount (removed at the test's end): (its path, {name: tensor})."""
        specs = [(f"model.extra.r{i}.weight", "BF16", (16, 8)) for i in range(hook_defer.WHOLE_PRIOR)]
        path = os.path.join(self.backing, "many.safetensors")
        _, ts = make_file(path, seed=11, specs=specs)
        self.addCleanup(os.remove, path)
        return self.m.path("many.safetensors"), {n: as_torch(as_array(*v), v[0]) for n, v in ts.items()}

    def copy_all(self, path, want):
        """The engines' loop over path: get_tensor, copy_ whole; whether each was deferred."""
        kinds = []
        with self.fake.safe_open(path, "pt") as f:
            for k in f.keys():
                t = f.get_tensor(k)
                kinds.append(deferred.is_deferred(t))
                p = torch.empty(t.shape, dtype=t.dtype)
                p.copy_(t)
                self.assertTrue(same(p, want(k)), k)
        return kinds

    def test_unmet_roles_after_whole_ones_are_read_ahead_whole(self):
        # An engine that has copied WHOLE_PRIOR roles whole (and narrowed
        # none) gets a role it has not met yet read ahead whole, not
        # deferred and read inside its copy_ (the head after the experts).
        path, many = self.many_roles()
        self.assertTrue(all(self.copy_all(path, many.get)), "a role met for the first time is deferred")
        kinds = self.copy_all(self.m.path("layers.safetensors"), self.want)
        self.assertEqual(kinds, [False] * len(kinds), "an unmet role was deferred after only whole uses")
        self.assertGreater(self.readers[-1].served_from_prefetch, len(kinds) // 2, "whole tensors not read ahead")

    def test_a_narrow_keeps_unmet_roles_deferred(self):
        # One narrow anywhere before, and every role met later is deferred
        # (vLLM narrows its first tensor): only what the caller keeps is read.
        with self.fake.safe_open(self.m.path("layers.safetensors"), "pt") as f:
            self.vllm_loop(f)
        path, many = self.many_roles()
        self.copy_all(path, many.get)
        kinds = self.copy_all(path, many.get)  # met now: used whole, read ahead
        self.assertEqual(kinds, [False] * len(kinds))
        self.assertEqual(hook.uses_seen.whole_run.get(0), -1)
        self.assertIsNone(hook.uses_seen.guess("model.extra.unmet.weight", (16, 8), 0))

    def test_a_caller_that_collects_stops_the_deferral(self):
        with self.fake.safe_open(self.m.path("layers.safetensors"), "pt") as f:
            got = {k: f.get_tensor(k) for k in f.keys()}
            # The first key, and the scouts read ahead with it (layer 0's
            # other roles) before the caller showed that it collects.
            self.assertEqual([k for k, t in got.items() if deferred.is_deferred(t)],
                             ["model.layers.0." + r for r in ("attn.o.weight", "attn.q.weight", "norm.weight")])
            for k, t in got.items():
                self.assertTrue(same(t.clone(), self.want(k)), k)

    def test_off(self):
        with mock.patch.dict(os.environ, {hook_defer.DEFER_ENV: "0"}):
            with self.fake.safe_open(self.m.path("layers.safetensors"), "pt") as f:
                got = [f.get_tensor(k) for k in f.keys()]
        self.assertFalse(any(deferred.is_deferred(t) for t in got))


class UsesTest(unittest.TestCase):
    """hook_defer.Uses without a mount: the whole-use prior's counting."""

    def test_the_prior_counts_whole_roles_until_a_narrow(self):
        u = hook_defer.Uses()
        for i in range(hook_defer.WHOLE_PRIOR - 1):
            u.learn(f"r{i}", (4,), 0, hook_defer.WHOLE)
        self.assertIsNone(u.guess("unmet", (4,), 0), "the prior before WHOLE_PRIOR roles")
        u.learn("last", (4,), 0, hook_defer.WHOLE)
        self.assertEqual(u.guess("unmet", (4,), 0), hook_defer.WHOLE)
        self.assertIsNone(u.guess("unmet", (4,), 1), "another device's uses count for it")
        u.learn("q", (8, 4), 0, hook_defer.NARROW)
        self.assertEqual(u.guess("q", (8, 4), 0), hook_defer.NARROW, "what was learned wins")
        self.assertIsNone(u.guess("unmet", (4,), 0), "the prior after a narrow")
        for i in range(2 * hook_defer.WHOLE_PRIOR):
            u.learn(f"more{i}", (4,), 0, hook_defer.WHOLE)
        self.assertIsNone(u.guess("unmet", (4,), 0), "a narrow ends the prior for good")
        u.forget()
        self.assertIsNone(u.guess("r0", (4,), 0))
        self.assertEqual(u.whole_run, {})


class DeferExactTest(DeferTest):
    """The same with exact reads: a column region is read packed, as
    get_slice reads it, and copied into place (RegionReads.start)."""
    strategy = "exact"


if __name__ == "__main__":
    unittest.main()

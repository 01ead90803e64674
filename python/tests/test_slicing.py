"""The read planner (phxmount.slicing, phxmount.extents) against numpy:
index semantics, the bytes every level reads (applied to the tensor's raw
bytes, byte for byte), coalescing, the cost model's choice, shards. No
mount needed."""

import random
import unittest

from mountutil import WHY_NO_NUMPY, np

from phxmount import abi  # noqa: E402
from phxmount.extents import Cols, Run, coalesce, cut, to_cols  # noqa: E402
from phxmount.stformat import DTYPE_SIZES, TensorInfo  # noqa: E402
from phxmount.slicing import (CostModel, Plan, choose, exact_level, fit, level_runs, level_size,  # noqa: E402
                              native_plan, normalize, random_index, shard_bounds, shard_index, whole_plan)

SHAPES = [(5,), (4, 6), (3, 4, 5), (), (0, 3), (2, 1, 3, 4), (7, 1), (1, 9)]


def level_plan(info, index, L):
    """The plan of level L (choose() picks one level; tests want all)."""
    sel = normalize(index, info.shape)
    es = DTYPE_SIZES[info.dtype]
    ex = exact_level(sel)
    return Plan(info, sel, L, ex, level_runs(sel, es, L), level_size(sel, es, L)[1], "test")


def apply(plan, raw):
    """The bytes plan's pieces gather from raw (the tensor's bytes)."""
    out = bytearray(plan.read_bytes)
    for r in plan.runs:
        for k in range(r.count):
            s, d = r.src + k * r.src_step, r.dst + k * r.dst_step
            out[d:d + r.length] = raw[s:s + r.length]
    return bytes(out)


@unittest.skipIf(WHY_NO_NUMPY, f"SKIP: {WHY_NO_NUMPY}")
class SlicingTest(unittest.TestCase):
    def test_normalize_matches_numpy(self):
        rng = random.Random(3)
        for shape in SHAPES:
            a = np.empty(shape)
            for _ in range(300):
                idx = random_index(rng, shape)
                self.assertEqual(normalize(idx, shape).out_shape, a[idx].shape, (shape, idx))

    def test_bad_indices(self):
        for idx, err in [((slice(None, None, -1),), ValueError), ((slice(None, None, 0),), ValueError),
                         ((True,), TypeError), (([1, 2],), TypeError), ((0, 0, 0), IndexError),
                         ((Ellipsis, Ellipsis), IndexError), ((4,), IndexError), ((-5,), IndexError), ("a", TypeError)]:
            with self.assertRaises(err, msg=repr(idx)):
                normalize(idx, (4, 6))
        self.assertEqual(normalize((np.int64(-1), None), (4, 6)).out_shape, (1, 6))

    def test_every_level_reads_the_slice(self):
        rng = random.Random(5)
        for shape in SHAPES:
            for dtype in ("U8", "F32", "BF16"):
                info = TensorInfo("t", dtype, shape, 0, 0)
                raw = rng.randbytes(DTYPE_SIZES[dtype] * int(np.prod(shape, dtype=np.int64)))
                want_all = np.frombuffer(raw, dtype={"U8": "u1", "F32": "<f4", "BF16": "<u2"}[dtype]).reshape(shape)
                for _ in range(40):
                    idx = random_index(rng, shape)
                    want = want_all[idx]
                    sel = normalize(idx, shape)
                    for L in range(exact_level(sel) + 1):
                        got = self.result(level_plan(info, idx, L), raw)
                        self.assertEqual(got.shape, want.shape, (shape, idx, L))
                        self.assertEqual(got.tobytes(), np.ascontiguousarray(want).tobytes(), (shape, idx, L))

    def result(self, plan, raw):
        from phxmount.hostbackends import host_result
        return host_result(apply(plan, raw), plan)

    def test_exact_plans(self):
        info = TensorInfo("w", "F32", (100, 64), 1000, 1000 + 100 * 64 * 4)
        rows = choose(info, (slice(10, 20),), CostModel())
        self.assertEqual((rows.strategy, rows.extents, rows.read_bytes), ("exact", 1, 10 * 64 * 4))
        self.assertEqual(rows.runs, [Run(1, 10 * 256, 2560, 0, 2560, 2560)])
        cols = choose(info, (slice(None), slice(8, 16)), CostModel(extent_s=0))
        self.assertEqual((cols.strategy, cols.extents, cols.read_bytes), ("exact", 100, 100 * 8 * 4))
        c = cols.cols(7, 4096, 64, 1 << 20)  # one strided extent: a column of every row
        self.assertEqual((len(c), c.counts[0], c.fsteps[0], c.bsteps[0], c.nbytes), (1, 100, 256, 32, 100 * 32))
        p = c.expanded()
        self.assertEqual(p.extent(0), (7, 4096, 32, 64 + 1000 + 32))
        self.assertEqual(p.extent(99), (7, 4096 + 99 * 32, 32, 64 + 1000 + 99 * 256 + 32))
        whole = choose(info, None, CostModel())
        self.assertEqual((whole.strategy, whole.extents, whole.read_bytes, whole.post()), ("exact", 1, 25600, None))

    def test_cover_chosen_when_extents_cost(self):
        info = TensorInfo("w", "BF16", (4096, 4096), 0, 4096 * 4096 * 2)
        col = (slice(None), slice(0, 512))
        cheap = choose(info, col, CostModel(extent_s=1e-9, bytes_per_s=10e9))
        self.assertEqual((cheap.strategy, cheap.extents), ("exact", 4096))
        dear = choose(info, col, CostModel(extent_s=20e-6, bytes_per_s=50e9))
        self.assertEqual((dear.strategy, dear.extents, dear.read_bytes), ("cover", 1, 4096 * 4096 * 2))
        self.assertIn("whole rows then slice on the device", dear.why)
        self.assertIn("exact: 4096 extent(s)", dear.why)
        small = choose(info, col, CostModel(extent_s=20e-6, bytes_per_s=50e9), max_temp=1 << 20)
        self.assertEqual(small.strategy, "exact", "a cover bigger than max_temp is not taken")
        self.assertEqual(choose(info, col, CostModel(extent_s=1e-9), strategy="cover").strategy, "cover")
        self.assertEqual(choose(info, col, CostModel(extent_s=1), strategy="exact").strategy, "exact")
        self.assertEqual(choose(info, (slice(5, 5),), CostModel()).strategy, "empty")

    def test_fit_recovers_the_model(self):
        a, bw = 3e-6, 40e9
        k, small, big = 409, 2048, 409 * 16384
        m = fit(k, small, k * (a + small / bw), big, a + big / bw, "synthetic")
        self.assertAlmostEqual(m.extent_s, a, delta=1e-9)
        self.assertAlmostEqual(m.bytes_per_s / bw, 1, delta=1e-6)
        self.assertTrue(m.source.startswith("measured"))

    def test_coalesce_and_cut(self):
        self.assertEqual(coalesce([Run(4, 0, 10, 0, 10, 10)]), [Run(1, 0, 40, 0, 40, 40)])
        self.assertEqual(coalesce([Run(1, 0, 5, 0, 5, 5), Run(1, 5, 7, 5, 7, 7), Run(1, 20, 3, 12, 3, 3)]),
                         [Run(1, 0, 12, 0, 12, 12), Run(1, 20, 3, 12, 3, 3)])
        self.assertEqual(coalesce([Run(3, 0, 20, 0, 10, 10)]), [Run(3, 0, 20, 0, 10, 10)])
        self.assertEqual(cut([Run(1, 100, 25, 0, 25, 25)], 10),
                         [Run(2, 100, 10, 0, 10, 10), Run(1, 120, 5, 20, 5, 5)])
        c = to_cols(cut([Run(1, 100, 25, 0, 25, 25)], 10), 9, 1000, 5)
        self.assertEqual(list(c), [(9, 1000, 10, 105), (9, 1010, 10, 115), (9, 1020, 5, 125)])
        # A full-width slice of a 3-D tensor coalesces into one extent.
        info = TensorInfo("c", "U8", (4, 5, 6), 0, 120)
        p = choose(info, (slice(1, 3),), CostModel())
        self.assertEqual(p.runs, [Run(1, 30, 60, 0, 60, 60)])

    def test_shards(self):
        for size in range(0, 21):
            for world in range(1, 10):
                parts = np.array_split(np.arange(size), world)
                for rank in range(world):
                    lo, hi = shard_bounds(size, rank, world)
                    self.assertEqual(list(range(lo, hi)), list(parts[rank]))
        self.assertIsNone(shard_index((5,), 1, 0, 2))
        self.assertEqual(shard_index((10, 6), 1, 1, 4), (slice(None), slice(2, 4)))
        for bad in [(0, 2, 2), (0, -1, 2), (0, 0, 0), (-1, 0, 2)]:
            with self.assertRaises(ValueError):
                shard_index((4, 4), *bad)

    def test_random_index_covers_the_kinds(self):
        rng = random.Random(1)
        kinds = set()
        for _ in range(2000):
            for x in random_index(rng, (40, 50)):
                if x is Ellipsis or x is None:
                    kinds.add(repr(x))
                elif isinstance(x, int):
                    kinds.add("negative int" if x < 0 else "int")
                elif x.step:
                    kinds.add("step")
                else:
                    kinds.add("slice")
        self.assertEqual(kinds, {"Ellipsis", "None", "int", "negative int", "step", "slice"})


class BatchColsTest(unittest.TestCase):
    def test_same_bytes_as_encode_batch(self):
        rng = random.Random(2)
        ext = [abi.Extent(rng.randrange(1, 9), rng.randrange(1 << 40), rng.randrange(1, 1 << 30), rng.randrange(1 << 50))
               for _ in range(300)]
        cols = Cols()
        for e in ext:
            cols.add(e.id, e.buf_offset, e.length, e.file_offset)
        for cap in (300, 409):
            self.assertEqual(abi.encode_batch_cols(cap, cols), abi.encode_batch(cap, ext))
        b = abi.encode_batch_cols(300, cols)
        failed, res = abi.decode_batch_cols(b, 300)
        self.assertEqual((failed, list(res)), (0, [0] * 300))
        with self.assertRaises(ValueError):
            bad = Cols()
            bad.add(1, 0, 1, (1 << 63) - 1)
            abi.encode_batch_cols(1, bad)

    def test_runs_as_columns(self):
        c = Cols()
        c.add_run(3, 4, 100, 10, 10, 5000, 4096)  # strided: one extent of 4 pieces
        self.assertTrue(c.strided)
        self.assertEqual((len(c), c.nbytes, c.want(0)), (1, 40, 40))
        self.assertEqual(list(c.pieces()), [(3, 100 + 10 * k, 10, 5000 + 4096 * k) for k in range(4)])
        self.assertEqual(list(c.expanded()), list(c.pieces()))
        c.add_run(3, 5, 200, 10, 10, 9000, 10)  # pieces that follow on: five plain extents
        self.assertEqual((len(c), c.nbytes), (6, 90))
        self.assertEqual([len(p) for p in c.split(4)], [4, 2])
        self.assertEqual(list(c.part(1, 3)), [(3, 200, 10, 9000), (3, 210, 10, 9010)])
        b = abi.encode_strided_batch_cols(6, c)
        failed, res = abi.decode_strided_batch_cols(b, 6)
        self.assertEqual((failed, list(res)), (0, [0] * 6))
        with self.assertRaises(ValueError):  # overlapping pieces
            bad = Cols()
            bad.add_run(1, 2, 0, 5, 10, 0, 20)
            abi.encode_strided_batch_cols(1, bad)


if __name__ == "__main__":
    unittest.main()


class WholePlanTest(unittest.TestCase):
    """whole_plan is choose()'s answer for index None, made without the
    search (a whole tensor's plan is on every small tensor's path)."""

    def test_same_as_choose(self):
        fields = ("sel", "level", "exact", "runs", "read_bytes", "strategy", "index", "key", "trivial")
        for shape in SHAPES + [(4096, 14336), (1,)]:
            for dtype in ("BF16", "F32", "U8"):
                n = DTYPE_SIZES[dtype]
                for s in shape:
                    n *= s
                info = TensorInfo("t", dtype, shape, 64, 64 + n)
                for cost in (CostModel(), CostModel(extent_s=1.0, bytes_per_s=1.0)):
                    for strategy in ("auto", "exact", "cover"):
                        want, got = choose(info, None, cost, strategy), whole_plan(info)
                        for f in fields:
                            self.assertEqual(getattr(got, f), getattr(want, f), (shape, dtype, strategy, f))
                        self.assertEqual(len(got.alternatives), len(want.alternatives))
                if n:
                    self.assertIn(f"{n} B read", whole_plan(info).why)

    def test_shared_parts_own_plans(self):
        # Tensors of one shape share the selection and run (frozen), never
        # the plan: each has its own info, and a key that finds it alone.
        a = whole_plan(TensorInfo("a", "BF16", (8, 4), 0, 64))
        b = whole_plan(TensorInfo("b", "BF16", (8, 4), 64, 128))
        self.assertIs(a.sel, b.sel)
        self.assertIsNot(a, b)
        self.assertIsNot(a.runs, b.runs)
        self.assertEqual((a.name, b.name, a.info.begin, b.info.begin), ("a", "b", 0, 64))
        found = {a.key: 1, b.key: 2}
        self.assertEqual(found[whole_plan(TensorInfo("b", "BF16", (8, 4), 64, 128)).key], 2)

    def test_selection_hash(self):
        # The remembered hash is the one of its fields: equal selections,
        # however made, find each other in a dict.
        for shape in SHAPES:
            for index in ((), (Ellipsis,)) + (((slice(None),),) if shape else ()):
                x, y = normalize(index, shape), normalize(index, shape)
                self.assertIsNot(x, y)
                self.assertEqual(hash(x), hash(y))
                self.assertEqual(hash(x), hash((x.dims, x.out_shape)))
                self.assertEqual({x: 1}[y], 1)
        self.assertNotEqual(normalize((slice(0, 1),), (4, 4)), normalize((slice(1, 2),), (4, 4)))


@unittest.skipIf(WHY_NO_NUMPY, f"SKIP: {WHY_NO_NUMPY}")
class NativePlanTest(unittest.TestCase):
    """native_plan's pieces land at their own offsets (a deferred tensor's
    storage): every byte of the selection is read, every byte read is
    where it belongs, and exact reads nothing else."""

    def test_pieces_land_in_place(self):
        rng = random.Random(7)
        for shape in SHAPES:
            n = 1
            for x in shape:
                n *= x
            elems = np.arange(n, dtype=np.int64).reshape(shape)
            info = TensorInfo("t", "F32", shape, 0, 4 * n)
            for _ in range(60):
                index = random_index(rng, shape)
                try:
                    wanted = set(np.asarray(elems[index]).ravel().tolist())
                except (IndexError, ValueError):
                    continue
                for strategy, cost in (("exact", CostModel()), ("cover", CostModel()), ("auto", CostModel(extent_s=1.0))):
                    p = native_plan(info, index, cost, strategy)
                    self.assertTrue(p.in_place and p.trivial)
                    got = set()
                    for r in p.runs:
                        self.assertEqual((r.src, r.src_step), (r.dst, r.dst_step), (shape, index, strategy))
                        for k in range(r.count):
                            a = r.src + k * r.src_step
                            self.assertEqual(a % 4, 0)
                            got.update(range(a // 4, (a + r.length) // 4))
                    self.assertLessEqual(wanted, got, (shape, index, strategy))
                    self.assertLessEqual(got, set(range(n)))
                    self.assertEqual(sum(r.count * r.length for r in p.runs), p.read_bytes)
                    if p.strategy == "exact":
                        self.assertEqual(got, wanted, (shape, index))
                    self.assertNotEqual(p.key, choose(info, index, CostModel()).key)

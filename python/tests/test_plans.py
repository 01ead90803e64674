"""The process's remembered plans (phxmount.plans): a plan made for one
tensor is given to every tensor of the same shape, dtype and index, with
that tensor's own info, and equals what the planner makes for it; what
the plan depends on (the index, the cost model's figures, the strategy,
the kind) makes another; indexes that are not plain are planned every
time. No mount."""

import unittest

from phxmount.plans import Plans
from phxmount.slicing import CostModel, choose, native_plan
from phxmount.stformat import TensorInfo


def info(name, begin, shape=(64, 96), dtype="BF16"):
    n = 2
    for s in shape:
        n *= s
    return TensorInfo(name, dtype, shape, begin, begin + n)


class PlansTest(unittest.TestCase):
    FIELDS = ("sel", "level", "exact", "runs", "read_bytes", "strategy", "in_place", "key", "index")

    def same(self, got, want):
        for f in self.FIELDS:
            self.assertEqual(getattr(got, f), getattr(want, f), f)
        self.assertIs(got.info, want.info)

    def test_every_layers_tensor_gets_its_own(self):
        p, cost = Plans(), CostModel()
        for idx in ((slice(None), slice(48, 96)), (slice(8, 16),), 3, (Ellipsis, 5), (None, slice(1, 3))):
            for in_place in (False, True):
                for k in range(4):
                    t = info(f"model.layers.{k}.o.weight", 1000 + k * 12288)
                    want = (native_plan(t, idx, cost) if in_place else choose(t, idx, cost))
                    self.same(p.plan(t, idx, cost, "auto", in_place, 1 << 30), want)
        self.assertEqual(len(p.memo), 10, "one entry a shape, index and kind")

    def test_what_it_depends_on_makes_another(self):
        p, t = Plans(), info("w", 0)
        idx = (slice(None), slice(10, 20))
        cheap_extents, dear_extents = CostModel(extent_s=0.0), CostModel(extent_s=1.0)
        a = p.plan(t, idx, cheap_extents, "auto", False, 1 << 30)
        b = p.plan(t, idx, dear_extents, "auto", False, 1 << 30)
        self.assertEqual((a.strategy, b.strategy), ("exact", "cover"))
        self.assertEqual(p.plan(t, idx, cheap_extents, "cover", False, 1 << 30).strategy, "cover")
        self.assertEqual(p.plan(info("w", 0, (64, 97)), idx, cheap_extents, "auto", False, 1 << 30).sel.dims[1].size, 97)

    def test_an_index_that_is_not_plain_is_planned_every_time(self):
        class Three:
            def __index__(self):
                return 3
        p, cost, t, idx = Plans(), CostModel(), info("w", 0), (Three(), slice(None))
        self.same(p.plan(t, idx, cost, "auto", False, 1 << 30), choose(t, idx, cost))
        self.assertEqual(p.memo, {})


if __name__ == "__main__":
    unittest.main()

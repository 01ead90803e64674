"""Deferred tensors (phxmount.deferred) against stock: every operation an
engine's loader applies to a tensor it took whole gets the bytes, dtype,
shape, strides and device a tensor read whole gets, and a narrow reads
only the region it keeps. On the CPU with torch (Debian's python3-torch
where the interpreter has none: scripts/deps.sh installs it)."""

import os
import sys
import unittest

from mountutil import torch_or_none

torch = torch_or_none()
WHY_NO_TORCH = None if torch is not None else "torch is not importable (scripts/deps.sh installs python3-torch)"

if torch is not None:
    from phxmount import deferred


class Source:
    """Reads regions of ref; counts the elements it read and hears the uses."""

    def __init__(self, ref):
        self.ref, self.read, self.calls, self.uses = ref, 0, [], []

    def fill(self, dest, regions):
        self.calls.append(list(regions))
        for d, s, n in regions:
            if d == -1:
                dest.copy_(self.ref)
                self.read += self.ref.numel()
            else:
                dest.narrow(d, s, n).copy_(self.ref.narrow(d, s, n))
                self.read += self.ref.narrow(d, s, n).numel()

    def used(self, how):
        self.uses.append(how)


def fresh(shape=(16, 24), dtype=None):
    dtype = dtype or torch.float32
    ref = (torch.arange(int(torch.tensor(shape).prod())) % 251).to(dtype).reshape(shape)
    src = Source(ref)
    return ref, src, deferred.make(torch.empty(shape, dtype=dtype), src)


def same_view(test, got, want):
    test.assertIs(type(got), torch.Tensor)
    test.assertEqual(got.dtype, want.dtype)
    test.assertEqual(tuple(got.shape), tuple(want.shape))
    test.assertEqual(got.stride(), want.stride())
    test.assertEqual(got.storage_offset(), want.storage_offset())
    test.assertEqual(got.is_contiguous(), want.is_contiguous())
    test.assertEqual(got.device, want.device)
    test.assertTrue(torch.equal(got, want))


@unittest.skipIf(WHY_NO_TORCH, WHY_NO_TORCH)
class TestDeferred(unittest.TestCase):
    def test_metadata_reads_nothing(self):
        ref, src, t = fresh()
        self.assertEqual(t.shape, ref.shape)
        self.assertEqual((t.dtype, t.device, t.ndim, t.dim(), t.numel(), t.stride(), len(t)),
                         (ref.dtype, ref.device, 2, 2, ref.numel(), ref.stride(), 16))
        self.assertTrue(t.is_contiguous())
        self.assertIsInstance(t, torch.Tensor)
        self.assertEqual(t.element_size(), 4)
        self.assertEqual(src.read, 0)
        self.assertTrue(deferred.is_deferred(t))

    def test_a_rank_of_eight_reads_an_eighth(self):
        for dim in (0, 1):
            for rank in (0, 7):
                ref, src, t = fresh()
                n = ref.shape[dim] // 8
                got = t.narrow(dim, rank * n, n)
                same_view(self, got, ref.narrow(dim, rank * n, n))
                self.assertEqual(src.read, ref.numel() // 8)
                self.assertEqual(src.uses, [("narrow", dim, rank * n, n)])
                self.assertTrue(deferred.is_deferred(t))  # the rest is still unread

    def test_slicing_is_a_narrow(self):
        for index in (slice(2, 6), (slice(None), slice(3, 9)), (slice(None), slice(-6, None)),
                      (slice(0, 16), slice(None))):
            ref, src, t = fresh()
            got = t[index]
            same_view(self, got, ref[index])
            self.assertEqual(src.read, ref[index].numel(), index)
        ref, src, t = fresh()
        same_view(self, torch.narrow(t, 1, 4, 4), ref.narrow(1, 4, 4))
        self.assertEqual(src.read, 16 * 4)

    def test_what_is_not_a_narrow_reads_the_whole(self):
        ops = {
            "t()": lambda x: x.t(),
            "to": lambda x: x.to(torch.float64),
            "view": lambda x: x.view(-1),
            "cat": lambda x: torch.cat([x, x]),
            "add": lambda x: x + 1,
            "chunk": lambda x: x.chunk(4)[1],
            "stepped": lambda x: x[::2],
            "index": lambda x: x[3],
            "list": lambda x: x[[1, 2]],
            "sum": lambda x: x.sum(),
            "clone": lambda x: x.clone(),
            "contiguous": lambda x: x.contiguous(),
            "data": lambda x: x.data,
        }
        for name, op in ops.items():
            ref, src, t = fresh()
            got, want = op(t), op(ref)
            self.assertTrue(torch.equal(got, want), name)
            self.assertEqual(src.read, ref.numel(), name)
            self.assertIs(type(t), torch.Tensor, name)
            self.assertFalse(deferred.is_deferred(t), name)
            self.assertEqual(src.uses, [("whole",)], name)

    def test_copy_into_a_parameter(self):
        ref, src, t = fresh()
        p = torch.nn.Parameter(torch.zeros(16, 24), requires_grad=False)
        p.data.copy_(t)
        self.assertTrue(torch.equal(p, ref))
        ref, src, t = fresh()
        p.data[:8].copy_(t.narrow(0, 8, 8))
        self.assertTrue(torch.equal(p.data[:8], ref[8:]))
        self.assertEqual(src.read, ref.numel() // 2)

    def test_a_parameter_of_it_is_a_parameter(self):
        ref, src, t = fresh()
        p = torch.nn.Parameter(t, requires_grad=False)
        self.assertIs(type(p), torch.nn.Parameter)
        self.assertTrue(torch.equal(p, ref))
        self.assertIs(type(t), torch.Tensor)
        m = torch.nn.Linear(24, 16, bias=False)
        ref, src, t = fresh()
        m.weight = torch.nn.Parameter(t)
        x = torch.ones(2, 24)
        self.assertTrue(torch.equal(m(x), x @ ref.t()))

    def test_in_place_ops_and_writes_through_a_view_survive(self):
        ref, src, t = fresh()
        v = t.narrow(0, 0, 4)
        v.fill_(-1)
        t.mul_(2)  # reads the rest, not the rows written
        want = ref.clone()
        want[:4] = -1
        want.mul_(2)
        self.assertTrue(torch.equal(t, want))
        self.assertEqual(src.read, ref.numel())

    def test_narrows_of_one_dim_read_each_byte_once(self):
        ref, src, t = fresh()
        t.narrow(1, 0, 8)
        t.narrow(1, 4, 8)  # overlaps: reads 8..12 only
        self.assertEqual(src.read, 16 * 12)
        t[:, 2:6].fill_(7)
        whole = t.clone()
        want = ref.clone()
        want[:, 2:6] = 7
        self.assertTrue(torch.equal(whole, want))
        self.assertEqual(src.read, ref.numel())

    def test_narrows_of_two_dims(self):
        ref, src, t = fresh()
        t.narrow(0, 0, 2).fill_(5)
        got = t.narrow(1, 0, 3)
        want = ref.clone()
        want[:2] = 5
        same_view(self, got, want.narrow(1, 0, 3))
        self.assertTrue(torch.equal(t + 0, want))

    def test_other_dtypes_and_shapes(self):
        for shape, dtype in (((64,), torch.bfloat16), ((4, 6, 8), torch.int64), ((3, 5), torch.float16),
                             ((), torch.float32), ((0, 4), torch.float32), ((7, 3), torch.bool)):
            ref, src, t = fresh(shape, dtype)
            self.assertTrue(torch.equal(t.clone(), ref), (shape, dtype))
        ref, src, t = fresh((4, 6, 8), torch.int64)
        same_view(self, t.narrow(2, 2, 4), ref.narrow(2, 2, 4))
        self.assertEqual(src.read, 4 * 6 * 4)

    def test_a_bad_narrow_raises_as_torch_does(self):
        ref, src, t = fresh()
        for args in ((0, 10, 10), (2, 0, 1), (0, -20, 2)):
            with self.assertRaises((IndexError, RuntimeError)) as want:
                ref.narrow(*args)
            with self.assertRaises(type(want.exception)):
                fresh()[2].narrow(*args)

    def test_materialize_and_is_deferred(self):
        ref, src, t = fresh()
        self.assertIs(deferred.materialize(t), t)
        self.assertIs(type(t), torch.Tensor)
        self.assertEqual(t.__dict__, {})
        self.assertTrue(torch.equal(t, ref))
        deferred.materialize(t)  # a plain tensor: nothing to do
        self.assertEqual(src.read, ref.numel())


if __name__ == "__main__":
    unittest.main()

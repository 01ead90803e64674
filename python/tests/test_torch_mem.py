"""CudaBackend.locate's memory of the last allocation (torch_mem), with
stand-ins for tensors, the driver's answer and the registration cache: no
GPU, no torch, no mount. A tensor inside the remembered allocation is
located without asking the driver while a tensor of it lives; once none
does, or outside it, the driver is asked again."""

import gc
import unittest
from unittest import mock

from phxmount import torch_mem
from phxmount.regcache import Alloc, Entry


class FakeTensor:
    def __init__(self, ptr, nbytes):
        self.ptr, self.n = ptr, nbytes

    def data_ptr(self):
        return self.ptr

    def numel(self):
        return self.n

    def element_size(self):
        return 1

    @property
    def nbytes(self):
        return self.n


class FakeCache:
    """RegCache's answers: an allocation's registration is its key."""
    registered = hits = 0
    register_seconds = 0.0

    def __init__(self):
        self.entries, self.located = {}, 0

    def locate(self, alloc, ptr, nbytes):
        self.located += 1
        if alloc.base not in self.entries:
            self.entries[alloc.base] = Entry(alloc.key, alloc.base, alloc.size, alloc.key, "fake")
        return self.entries[alloc.base].id, ptr - alloc.base

    def entry(self, base):
        return self.entries.get(base)

    def current(self, e):
        return self.entries.get(e.base) is e


class LocateTest(unittest.TestCase):
    def setUp(self):
        self.asked = []
        segments = [(0x10000, 1 << 20, 7), (0x200000, 1 << 20, 8)]

        def tensor_alloc(t):
            self.asked.append(t.ptr)
            for base, size, key in segments:
                if base <= t.ptr < base + size:
                    return Alloc(base, size, key, lambda: b"")
            raise ValueError("not device memory")
        p = mock.patch.object(torch_mem, "tensor_alloc", tensor_alloc)
        p.start()
        self.addCleanup(p.stop)
        self.b = torch_mem.CudaBackend(0, FakeCache())

    def test_the_driver_is_asked_once_a_live_allocation(self):
        first = FakeTensor(0x10000, 4096)
        self.assertEqual(self.b.locate(first), (7, 0))
        for k in range(1, 20):
            self.assertEqual(self.b.locate(FakeTensor(0x10000 + k * 4096, 4096)), (7, k * 4096))
        self.assertEqual(len(self.asked), 1, "asked the driver per tensor")
        self.assertEqual(self.b.locate(FakeTensor(0x200000, 64)), (8, 0))
        self.assertEqual(len(self.asked), 2, "another allocation: asked")

    def test_tensors_of_a_few_segments_in_turn(self):
        keep = []
        for k in range(12):
            base = 0x10000 if k % 2 == 0 else 0x200000
            t = FakeTensor(base + (k // 2) * 4096, 4096)
            keep.append(t)
            self.assertEqual(self.b.locate(t)[0], 7 if k % 2 == 0 else 8)
        self.assertEqual(len(self.asked), 2, "asked the driver again for a segment it was told of")

    def test_asked_again_once_no_tensor_of_it_lives(self):
        t = FakeTensor(0x10000, 4096)
        self.b.locate(t)
        del t
        gc.collect()
        self.b.locate(FakeTensor(0x10000 + 4096, 4096))
        self.assertEqual(len(self.asked), 2, "a freed allocation's range was trusted")

    def test_a_tensor_past_the_end_is_asked(self):
        t = FakeTensor(0x10000, 4096)
        self.b.locate(t)
        self.b.locate(FakeTensor(0x10000 + (1 << 20) - 16, 64))  # crosses the end: the driver is asked
        self.assertEqual(len(self.asked), 2)

    def test_a_remembered_registration_is_used_while_current(self):
        # Located again without the cache's lookup while the registration
        # stands; once it is dropped (or replaced) the cache is asked.
        c = self.b.cache
        t = FakeTensor(0x10000, 4096)
        self.assertEqual(self.b.locate(t), (7, 0))
        self.assertEqual(self.b.locate(FakeTensor(0x10000 + 4096, 64)), (7, 4096))
        self.assertEqual(c.located, 1, "the cache was asked for a remembered registration")
        c.entries[0x10000] = Entry(70, 0x10000, 1 << 20, 7, "fake")  # registered anew (another id)
        self.assertEqual(self.b.locate(FakeTensor(0x10000 + 8192, 64)), (70, 8192))
        self.assertEqual(c.located, 2)
        del c.entries[0x10000]
        self.b.locate(FakeTensor(0x10000 + 8192, 64))
        self.assertEqual(c.located, 3)
        self.assertEqual(len(self.asked), 1)

"""hook_warm: the first deferred tensor onto a device has a chore thread
load that device's strided copy kernels, once per process, device and
floating dtype of the file; the copies are column slices both ways. No
mount or GPU needed (torch's CPU tensors stand in for the copies)."""

import types
import unittest
from unittest import mock

from mountutil import torch_or_none

from phxmount import hook_defer, hook_warm


class File:
    """A hooked file's stand-in (RegionReads holds it weakly)."""


class WarmCopiesTest(unittest.TestCase):
    def setUp(self):
        hook_warm.forget()
        self.addCleanup(hook_warm.forget)
        self.asked = []
        soon = mock.patch.object(hook_warm.threadpools, "soon", self.asked.append)
        soon.start()
        self.addCleanup(soon.stop)

    def test_each_device_and_float_dtype_is_warmed_once_off_the_callers_thread(self):
        with mock.patch.object(hook_warm, "strided_copies") as copies:
            self.assertEqual(hook_warm.warm_copies(0, {"F32", "BF16", "I64", "U8"}), ["BF16", "F32"])
            self.assertEqual(len(self.asked), 1)
            copies.assert_not_called()  # handed to a chore, not run here
            self.assertEqual(hook_warm.warm_copies(0, {"BF16", "F32"}), [])
            self.assertEqual(hook_warm.warm_copies(0, {"F16", "BF16"}), ["F16"])
            self.assertEqual(hook_warm.warm_copies(1, {"BF16"}), ["BF16"])
            self.assertEqual(hook_warm.warm_copies(2, {"I8", "BOOL"}), [])
            self.assertEqual(len(self.asked), 3)
            for chore in self.asked:
                chore()
            self.assertEqual([c.args for c in copies.call_args_list],
                             [("cuda:0", ["BF16", "F32"]), ("cuda:0", ["F16"]), ("cuda:1", ["BF16"])])

    def test_a_finalizing_interpreter_warms_nothing_and_raises_nothing(self):
        def finalizing(fn):
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        with mock.patch.object(hook_warm.threadpools, "soon", finalizing):
            self.assertEqual(hook_warm.warm_copies(0, {"BF16"}), ["BF16"])

    def test_the_first_deferred_tensor_of_a_file_asks_once_per_device(self):
        header = types.SimpleNamespace(tensors=[types.SimpleNamespace(dtype=d) for d in ("BF16", "F32", "BF16")])
        f = File()
        f.header, f._defer = header, types.SimpleNamespace(on=True)
        reads = hook_defer.RegionReads(f)
        info = types.SimpleNamespace(name="w", shape=(4, 4), dtype="BF16")
        with mock.patch.object(hook_defer, "warm_copies") as warm, \
                mock.patch.object(hook_defer, "deferred_tensor", return_value=("t", "src")):
            for dev in (0, 0, 1, 0):
                self.assertEqual(reads.make(info, dev), ("t", "src"))
        self.assertEqual([c.args for c in warm.call_args_list], [(0, {"BF16", "F32"}), (1, {"BF16", "F32"})])


class StridedCopiesTest(unittest.TestCase):
    def test_a_column_slice_is_copied_into_a_contiguous_tensor_and_back(self):
        torch = torch_or_none()
        if torch is None:
            self.skipTest("torch is not importable (scripts/deps.sh installs python3-torch)")
        done = hook_warm.strided_copies("cpu", ["BF16", "F32"])
        self.assertEqual(len(done), 4)
        for (dst, src), dt in zip(done, (torch.bfloat16, torch.bfloat16, torch.float32, torch.float32)):
            self.assertEqual((dst.dtype, src.dtype), (dt, dt))
            self.assertNotEqual(dst.is_contiguous(), src.is_contiguous())  # one side a column slice
            self.assertTrue(torch.equal(dst.contiguous().view(torch.uint8), src.contiguous().view(torch.uint8)))


if __name__ == "__main__":
    unittest.main()

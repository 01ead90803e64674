"""hook_warm: the first narrow of a deferred tensor onto a device has a
chore thread load that device's strided copy kernel for its dtype, once
per process, device and floating dtype; the copies are column slices
both ways; a tensor used whole asks for nothing. No
mount or GPU needed (torch's CPU tensors stand in for the copies)."""

import types
import unittest
from unittest import mock

from mountutil import torch_or_none

from phxmount import hook_defer, hook_guess, hook_warm


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

    def test_a_deferred_tensor_that_is_narrowed_asks_for_its_dtype_and_one_used_whole_does_not(self):
        plain = types.SimpleNamespace(data_ptr=lambda: 4096)
        made = []
        with mock.patch.object(hook_defer, "_storage", return_value=(plain, plain)), \
                mock.patch("phxmount.deferred.make", lambda p, src: made.append(src) or "t"), \
                mock.patch.object(hook_defer, "uses_seen", hook_defer.Uses()), \
                mock.patch.object(hook_defer, "regions_seen", hook_guess.RoleMemory()), \
                mock.patch.object(hook_defer, "warm_copies") as warm:
            for name, dtype, dev in (("a.weight", "BF16", 0), ("b.weight", "F32", 1), ("c.weight", "BF16", 0)):
                info = types.SimpleNamespace(name=name, shape=(4, 4), dtype=dtype)
                self.assertEqual(hook_defer.deferred_tensor(info, dev, None, None)[0], "t")
            made[0].used(("narrow", 1, 0, 2))
            made[1].used(("whole",))
            made[2].used(("narrow", 0, 2, 2))
        self.assertEqual([c.args for c in warm.call_args_list], [(0, ("BF16",)), (0, ("BF16",))])


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

"""torch_load.open_reader opens a file on the mount once: that descriptor
gives the header, answers the availability check and carries every
thread's reads (an open of a file on a FUSE mount is a round trip to the
daemon). No torch here: the emulated device's backend stands in for the
CUDA one."""

import os
import unittest

from mountutil import WHY_NO_NUMPY, MountedCase, as_array, make_file, opens_counted, same, why_not

from phxmount import abi, torch_load  # noqa: E402
from phxmount.availability import available  # noqa: E402
from phxmount.hostbackends import EmuBackend  # noqa: E402
from phxmount.regcache import cache_for  # noqa: E402

WHY = why_not() or WHY_NO_NUMPY


class Ok:
    ok, transport, reason = True, "staged", "stands in for a GPU"


@unittest.skipIf(WHY, f"SKIP: {WHY}")
class OpenOnceTest(MountedCase):
    staged = True

    @classmethod
    def populate(cls, backing):
        _, ts = make_file(os.path.join(backing, "m.safetensors"))
        cls.arrays = {n: as_array(*v) for n, v in ts.items()}

    def setUp(self):
        path = self.m.path("m.safetensors")
        saved = (torch_load.CudaBackend, torch_load.cuda_cache, torch_load.route, torch_load.parse_device)
        torch_load.CudaBackend = lambda idx, cache: EmuBackend(cache_for(path, abi.VENDOR_EMU, 0))
        torch_load.cuda_cache = lambda path, idx: None
        torch_load.parse_device = lambda device: ("cuda", 0)
        self.asked = []

        def route(path, kind, idx, fd=None):
            self.asked.append(fd)
            self.assertTrue(available(path, idx, fd).on_mount, "the INFO ioctl on the descriptor given")
            return Ok()
        torch_load.route = route

        def restore():
            torch_load.CudaBackend, torch_load.cuda_cache, torch_load.route, torch_load.parse_device = saved
        self.addCleanup(restore)
        self.path = path

    def test_one_open(self):
        with opens_counted() as opened:
            with torch_load.open_reader(self.path, 0, threads=4) as f:
                for name, want in self.arrays.items():
                    self.assertTrue(same(f.get_tensor(name), want), name)
                fd = f.fetcher.io._h.fd
        self.assertEqual(opened.count(self.path), 1, opened)
        self.assertEqual(self.asked, [fd], "the availability check asked on another descriptor")
        with self.assertRaises(OSError, msg="the reader's descriptor outlived it"):
            os.fstat(fd)


if __name__ == "__main__":
    unittest.main()

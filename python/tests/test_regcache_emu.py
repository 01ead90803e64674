"""The registration cache and the threaded BATCH submission on a real emu
mount: a registration is made once per allocation, a stale one (the same
address, another allocation) is replaced, freed ones are pruned, close
releases all; several client threads each with their own descriptor land
every byte. Needs root, /dev/fuse and bin/phxmount."""

import errno
import os
import random
import time
import unittest

from mountutil import MountedCase, why_not

from phxmount import abi  # noqa: E402
from phxmount.batchio import BatchIO, wait_all  # noqa: E402
from phxmount.client import EmuBuffer, PhxError, mount_counters  # noqa: E402
from phxmount.extents import Cols  # noqa: E402
from phxmount.hostbackends import emu_alloc  # noqa: E402
from phxmount.regcache import Alloc, RegCache, cache_for, close_caches, mount_root  # noqa: E402

MiB = 1 << 20


@unittest.skipIf(why_not(), f"SKIP: {why_not()}")
class RegCacheTest(MountedCase):
    @classmethod
    def populate(cls, backing):
        cls.data = random.Random(4).randbytes(8 * MiB)
        with open(os.path.join(backing, "blob.bin"), "wb") as f:
            f.write(cls.data)

    @property
    def path(self):
        return self.m.path("blob.bin")

    def live(self):
        return self.counters()["buffers_live"]

    def test_one_registration_per_allocation(self):
        self.assertEqual(mount_root(self.path), os.path.realpath(self.m.mnt))
        buf = EmuBuffer(MiB)
        c = RegCache(self.m.mnt, abi.VENDOR_EMU, 0)
        try:
            a = emu_alloc(buf)
            n0 = mount_counters(self.m.mnt)["buffers_registered"]
            ids = set()
            t0 = time.perf_counter()
            ids.add(c.locate(a, a.base, 4096)[0])
            spent = time.perf_counter() - t0
            self.assertTrue(0 < c.register_seconds <= spent, (c.register_seconds, spent))
            secs = c.register_seconds
            ids |= {c.locate(a, a.base + k * 4096, 4096)[0] for k in range(1, 10)}
            self.assertEqual((len(ids), c.registered, c.hits), (1, 1, 9))
            self.assertEqual(c.register_seconds, secs, "a hit counted as REGISTER time")
            self.assertEqual(mount_counters(self.m.mnt)["buffers_registered"], n0 + 1)
            with self.assertRaises(ValueError):
                c.locate(a, a.base + MiB - 10, 11)
            # The same address, another allocation: the old registration goes.
            other = Alloc(a.base, a.size, a.key + 1, buf.handle)
            self.assertNotIn(c.get(other).id, ids)
            self.assertEqual((c.stale, len(c)), (1, 1))
            # Freed allocations are let go by prune(); prune(every=...)
            # right after a prune asks nothing (a load prunes before each
            # request).
            probes = []
            key = c.get(other).key
            c.probe = lambda base: probes.append(base) or key  # alive
            self.assertEqual(c.prune(every=60), 0)  # no prune before it: it probes
            self.assertEqual(len(probes), 1)
            self.assertEqual(c.prune(every=60), 0)
            self.assertEqual(len(probes), 1, "a prune within the interval probed again")
            c.probe = lambda base: None  # freed
            live = self.live()
            self.assertEqual(c.prune(), 1)  # without every: always
            self.assertEqual(self.live(), live - 1)
        finally:
            c.close()
            buf.close()

    def test_device_by_pci(self):
        from phxmount.client import PhxFile, normalize_pci
        self.assertEqual(normalize_pci("00000000:3B:00.0"), "0000:3b:00.0")
        self.assertEqual(normalize_pci("not pci"), "not pci")
        with PhxFile(self.m.mnt) as f:
            pci = f.info(0).pci_address
            dom, rest = pci.split(":", 1)
            self.assertEqual(f.device_by_pci(f"0000{dom}:{rest}".upper()), 0)
            with self.assertRaises(PhxError) as e:
                f.device_by_pci("0000:ff:1f.7")
            self.assertEqual(e.exception.errno, errno.ENODEV)

    def test_close_releases_everything(self):
        live0 = self.live()
        c = cache_for(self.path, abi.VENDOR_EMU, 0)
        self.assertIs(cache_for(self.m.mnt, abi.VENDOR_EMU, 0), c, "one cache per mount, vendor and device")
        bufs = [EmuBuffer(256 << 10) for _ in range(5)]
        try:
            for b in bufs:
                c.get(emu_alloc(b))
            self.assertEqual(self.live(), live0 + 5)
            close_caches()  # the daemon releases on the descriptor's release, which close(2) does not wait for
            deadline = time.monotonic() + 10
            while self.live() != live0 and time.monotonic() < deadline:
                time.sleep(0.02)
            self.assertEqual(self.live(), live0)
            self.assertIsNot(cache_for(self.path, abi.VENDOR_EMU, 0), c)
        finally:
            close_caches()
            for b in bufs:
                b.close()

    def test_threads_share_one_descriptor(self):
        rng = random.Random(9)
        bs, n = 16 << 10, 300
        src = [rng.randrange(len(self.data) // bs) for _ in range(n)]
        slots = list(range(n))
        rng.shuffle(slots)
        buf = EmuBuffer(n * bs)
        c = cache_for(self.path, abi.VENDOR_EMU, 0)
        try:
            buf_id = c.get(emu_alloc(buf)).id
            cols = Cols()
            for s, d in zip(src, slots):
                cols.add(buf_id, d * bs, bs, s * bs)
            given = os.open(self.path, os.O_RDONLY)
            with BatchIO(self.path, threads=4, fd=given) as io:
                wait_all([io.submit(part) for part in cols.split(40)], 30, "kv blocks")
                self.assertEqual(io.calls, 8)
                self.assertEqual(io._h.fd, given, "the threads' ioctls went on the descriptor given")
            with self.assertRaises(OSError, msg="the pool closes the descriptor it was given"):
                os.fstat(given)
            for s, d in zip(src, slots):
                self.assertEqual(bytes(buf.view[d * bs:(d + 1) * bs]), self.data[s * bs:(s + 1) * bs])
            unused = os.open(self.path, os.O_RDONLY)
            BatchIO(self.path, fd=unused).close()
            with self.assertRaises(OSError, msg="a descriptor given to a pool that never ran stays open"):
                os.fstat(unused)
        finally:
            close_caches()
            buf.close()


if __name__ == "__main__":
    unittest.main()

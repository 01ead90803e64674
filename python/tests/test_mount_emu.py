"""The client against a real phxmount mount on the emulated device (--vendor
emu, host and staged memory): the whole ioctl path without a GPU. Needs
root, /dev/fuse and bin/phxmount (make build); skips with the reason
otherwise."""

import errno
import os
import time
import unittest
from unittest import mock

from mountutil import MountedCase, make_file, why_not

import phxmount  # noqa: E402
from phxmount import abi, availability  # noqa: E402
from phxmount.availability import known  # noqa: E402
from phxmount.client import EmuBuffer, PhxError, PhxFile  # noqa: E402
from phxmount.loader import LoadStats, load_safetensors_emu  # noqa: E402

# Big enough for more than 409 extents of 4 KiB (test_load_many_extents).
MODEL = [("embed", "BF16", (300, 1000)), ("odd", "U8", (13,)), ("w1", "F32", (513, 1001)), ("flag", "BOOL", (7,)),
         ("none", "F16", (0, 3)), ("bias", "I64", (4099,)), ("w2", "F64", (77777,))]


@unittest.skipIf(why_not(), f"SKIP: {why_not()}")
class EmuMountTest(MountedCase):
    @classmethod
    def populate(cls, backing):
        cls.header, ts = make_file(os.path.join(backing, "model.safetensors"), specs=MODEL)
        cls.data = {name: data for name, (_, _, data) in ts.items()}
        with open(os.path.join(backing, "small.bin"), "wb") as f:
            f.write(bytes(range(256)) * 1000 + b"tail")

    @property
    def path(self):
        return self.m.path("model.safetensors")

    def test_available_is_honest(self):
        a = phxmount.available(self.path)
        self.assertFalse(a.ok)
        self.assertTrue(a.on_mount)
        self.assertEqual(a.vendor, "emu")
        self.assertEqual(a.transport, "staged" if self.staged else "host")
        self.assertIn("not an NVIDIA GPU", a.reason)
        self.assertEqual(a.xattr.get("transport"), a.transport)
        off = phxmount.available(self.m.backing)
        self.assertFalse(off.ok or off.on_mount)
        self.assertIn("not on a phxmount mount", off.reason)

    def test_known_asks_a_mount_once(self):
        known.forget()
        self.addCleanup(known.forget)
        with mock.patch.object(availability, "available", wraps=availability.available) as asked:
            a = known.get(self.path)
            self.assertFalse(a.ok)
            self.assertEqual(a.vendor, "emu")
            before = self.counters()["ioctl_calls"]
            with open(self.m.path("small.bin"), "rb") as f:  # another file of the mount, by descriptor
                self.assertIs(known.get(self.m.path("small.bin"), 0, f.fileno()), a)
            self.assertIs(known.get(self.path), a)
            self.assertEqual(asked.call_count, 1)
            # Only the counters' own INFO reached the daemon.
            self.assertEqual(self.counters()["ioctl_calls"] - before, 1)
            known.get(self.path, 1)
            self.assertEqual(asked.call_count, 2, "another device is asked on its own")
            # Off the mount nothing is remembered; available() itself always asks.
            for _ in range(2):
                self.assertFalse(known.get(self.m.backing).on_mount)
            self.assertEqual(asked.call_count, 4)
            gone = known.get(os.path.join(self.m.mnt, "no-such-dir", "x.safetensors"))
            self.assertFalse(gone.ok)
            self.assertIn("cannot open", gone.reason)
        c0 = self.counters()["ioctl_calls"]
        self.assertTrue(phxmount.available(self.path).on_mount)
        self.assertGreater(self.counters()["ioctl_calls"] - c0, 1)

    def test_load_one_batch(self):
        s = LoadStats()
        out = load_safetensors_emu(self.path, chunk=128 << 20, stats=s)
        self.assertEqual(out, self.data)
        self.assertEqual(s.ioctls, 1)
        self.assertEqual(s.extents, len([t for t in self.header.tensors if t.nbytes]))
        self.assertEqual(s.transport, "staged" if self.staged else "host")

    def test_load_many_extents(self):
        # Small chunks: more than 409 extents, so several BATCH ioctls.
        s = LoadStats()
        out = load_safetensors_emu(self.path, chunk=(4 << 10) + 3, stats=s)
        self.assertEqual(out, self.data)
        self.assertGreater(s.extents, abi.MAX_EXTENTS)
        self.assertGreater(s.ioctls, 1)

    def test_read_and_errors(self):
        small = os.path.join(self.m.mnt, "small.bin")
        want = bytes(range(256)) * 1000 + b"tail"
        buf = EmuBuffer(len(want))
        try:
            with PhxFile(small) as f:
                r = f.register(abi.VENDOR_EMU, 0, buf.handle(), buf.size)
                self.assertEqual(f.read(r.id, 64, 1000, 5), 1000)
                self.assertEqual(bytes(buf.view[64:1064]), want[5:1005])
                # Short at end of file.
                self.assertEqual(f.read(r.id, 0, 4096, len(want) - 4), 4)
                self.assertEqual(bytes(buf.view[:4]), b"tail")
                # Past the buffer: EFAULT, nothing moves.
                with self.assertRaises(PhxError) as e:
                    f.read(r.id, buf.size - 10, 11, 0)
                self.assertEqual(e.exception.errno, errno.EFAULT)
                with self.assertRaises(PhxError) as e:
                    f.read(r.id + 1000, 0, 10, 0)
                self.assertEqual(e.exception.errno, errno.ENOENT)
                # A batch with one bad extent: the others move, and the client names it.
                ext = [abi.Extent(r.id, 0, 100, 0), abi.Extent(r.id, buf.size, 1, 0)]
                with self.assertRaises(PhxError) as e:
                    f.batch_read_all(ext)
                self.assertEqual(e.exception.errno, errno.EFAULT)
                self.assertEqual(ext[0].result, 100)
                # An NVIDIA handle on an emu mount: refused.
                with self.assertRaises(PhxError) as e:
                    f.register(abi.VENDOR_NVIDIA, 0, bytes(64), 1 << 16)
                self.assertEqual(e.exception.errno, errno.ENODEV)
                f.deregister(r.id)
                with self.assertRaises(PhxError) as e:
                    f.read(r.id, 0, 10, 0)
                self.assertEqual(e.exception.errno, errno.ENOENT)
        finally:
            buf.close()

    def test_timeout_releases_when_done(self):
        real = PhxFile.batch

        def slow(f, *a, **k):  # a load that takes longer than its timeout
            time.sleep(0.5)
            return real(f, *a, **k)

        with PhxFile(self.m.mnt) as root:
            live0 = root.info().counters["buffers_live"]
            with mock.patch.object(PhxFile, "batch", slow):
                with self.assertRaises(TimeoutError):
                    load_safetensors_emu(self.path, chunk=4096, timeout=0.1)
            deadline = time.time() + 20
            while root.info().counters["buffers_live"] != live0 and time.time() < deadline:
                time.sleep(0.05)
            self.assertEqual(root.info().counters["buffers_live"], live0, "the abandoned load's buffer was not released")


class EmuStagedMountTest(EmuMountTest):
    staged = True


if __name__ == "__main__":
    unittest.main()

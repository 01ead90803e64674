"""Saving a safetensors file through BATCH_WRITE (phxmount.savefile) from
the emulated device's memory on a real emu mount: the file is byte for
byte what safetensors.write_file writes for the same tensors (header
layout, padding, data order), with and without fsync, and a bad source
names its extent. Needs root, /dev/fuse and bin/phxmount."""

import errno
import os
import struct
import sys
import time
import unittest

from mountutil import HERE, SPECS, MountedCase, make_file, why_not

from phxmount import abi, stformat as st  # noqa: E402
from phxmount.client import EmuBuffer, PhxError, phx_info_xattr  # noqa: E402
from phxmount.hostbackends import emu_alloc  # noqa: E402
from phxmount.regcache import cache_for, close_caches  # noqa: E402
from phxmount.savefile import Source, save  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))
import gpu_bench_save  # noqa: E402


@unittest.skipIf(why_not(), f"SKIP: {why_not()}")
class SaveEmuTest(MountedCase):
    @classmethod
    def populate(cls, backing):
        cls.want = os.path.join(cls.work, "want.safetensors")
        _, cls.tensors = make_file(cls.want, seed=3, metadata={"format": "pt"})

    def sources(self, buf, buf_id, pad=4099):
        """Each tensor's bytes in buf at an odd offset, as save sources."""
        out, pos = [], 0
        for name, _, _ in SPECS:
            dt, shape, data = self.tensors[name]
            buf.view[pos:pos + len(data)] = data
            out.append(Source(name, dt, tuple(shape), len(data), buf_id, pos))
            pos += len(data) + pad
        return out

    def save_and_read(self, name, fsync):
        total = sum(len(d) + 4099 for _, _, d in self.tensors.values())
        buf = EmuBuffer(total)
        try:
            buf_id = cache_for(self.m.mnt, abi.VENDOR_EMU, 0).get(emu_alloc(buf)).id
            c0 = self.counters()
            stats = save(self.m.path(name), self.sources(buf, buf_id), {"format": "pt"}, fsync=fsync, threads=3)
            written = self.counters()["ioctl_bytes_written"] - c0["ioctl_bytes_written"]
        finally:
            close_caches()
            buf.close()
        with open(os.path.join(self.backing, name), "rb") as f:
            return f.read(), stats, written

    def test_same_bytes_as_safetensors_layout(self):
        with open(self.want, "rb") as f:
            want = f.read()
        for fsync in (False, True):
            got, stats, written = self.save_and_read(f"out-{fsync}.safetensors", fsync)
            self.assertEqual(got, want, f"fsync={fsync}")
            nbytes = sum(len(d) for _, _, d in self.tensors.values())
            self.assertEqual((stats.bytes, written), (nbytes, nbytes))
            self.assertEqual(stats.tensors, len(SPECS))
            (n,) = struct.unpack_from("<Q", got)
            self.assertEqual((8 + n) % 8, 0)
            self.assertTrue(got[8:8 + n].rstrip(b" ").endswith(b"}"))
            h = st.parse_header_bytes(got, len(got))
            self.assertEqual([t.name for t in h.tensors], [s[0] for s in SPECS])
            if fsync:
                self.assertGreaterEqual(stats.fsync_seconds, 0)

    def test_nothing_to_save(self):
        stats = save(self.m.path("empty.safetensors"), [])
        with open(os.path.join(self.backing, "empty.safetensors"), "rb") as f:
            got = f.read()
        self.assertEqual(st.parse_header_bytes(got, len(got)).tensors, ())
        self.assertEqual(stats.bytes, 0)

    def test_a_bad_buffer_names_the_extent(self):
        with self.assertRaises(PhxError) as e:
            save(self.m.path("bad.safetensors"), [Source("x", "U8", (10,), 10, 999999, 0)])
        self.assertEqual(e.exception.errno, errno.ENOENT)
        self.assertIn("buffer 999999", str(e.exception))


class SaveEmuStagedTest(SaveEmuTest):
    staged = True

    def test_large_tensors_start_writeback(self):
        """The daemon starts the kernel's writeback of each bounce buffer's
        worth of a large tensor as soon as it is written (PHX_WRITEBACK):
        user.phx.info reports the policy and counts the bytes, without an
        fsync; the file holds the tensor."""
        n = 16 << 20
        data = os.urandom(n)
        buf = EmuBuffer(n)
        try:
            buf.view[:n] = data
            buf_id = cache_for(self.m.mnt, abi.VENDOR_EMU, 0).get(emu_alloc(buf)).id
            before = phx_info_xattr(self.m.mnt)
            save(self.m.path("big.safetensors"), [Source("big", "U8", (n,), n, buf_id, 0)])
        finally:
            close_caches()
            buf.close()
        bounce = int(before["bounce_size"])
        self.assertIn("start the kernel's writeback at once", before["writeback"])
        # The kicks run on the daemon's own thread: wait for them (every
        # bounce window of the tensor but its partial first and last),
        # through the counters gpu_bench_save.py notes.
        w0 = gpu_bench_save.writeback(self.m.mnt)
        deadline = time.monotonic() + 20
        while True:
            w = gpu_bench_save.writeback(self.m.mnt)
            started = w["writeback_started_bytes"] - int(before["writeback_started_bytes"])
            if started >= n - 2 * bounce or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertGreaterEqual(started, n - 2 * bounce, w)
        self.assertLessEqual(started, n)
        self.assertGreater(w["writeback_started"], int(before["writeback_started"]))
        self.assertEqual(w0["writeback_dropped"], int(before["writeback_dropped"]))
        self.assertEqual(phx_info_xattr(self.m.mnt)["writeback_failed"], before["writeback_failed"])
        with open(os.path.join(self.backing, "big.safetensors"), "rb") as f:
            got = f.read()
        h = st.parse_header_bytes(got, len(got))
        self.assertEqual(got[h.data_start:], data)


if __name__ == "__main__":
    unittest.main()

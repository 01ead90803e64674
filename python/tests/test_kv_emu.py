"""tools/gpu_kv.py (the KV-cache benchmark) end to end on an emu mount with
small sizes: random blocks into shuffled slots from 1 and 4 client threads
(restore), the slots written to distinct random blocks of a second file
(offload) by BATCH_WRITE and by the reverse reference pipeline, every block
verified, and the rows gpu_rows.py makes of it; and the checks catch a
wrong block. Needs root, /dev/fuse and bin/phxmount."""

import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import unittest

from mountutil import HERE, Mount, why_not

sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))

import gpu_kv  # noqa: E402
import gpu_rows  # noqa: E402


class PlanTest(unittest.TestCase):
    def test_plan_and_check(self):
        src, slots = gpu_kv.plan(10 * 4096, 4096, 6 * 4096, seed=1)
        self.assertEqual(sorted(slots), list(range(6)))
        self.assertTrue(all(0 <= s < 10 for s in src))
        self.assertEqual((src, slots), gpu_kv.plan(10 * 4096, 4096, 6 * 4096, seed=1), "seeded")
        data = random.Random(2).randbytes(10 * 4096)
        buf = bytearray(6 * 4096)
        for s, d in zip(src, slots):
            buf[d * 4096:(d + 1) * 4096] = data[s * 4096:(s + 1) * 4096]
        self.assertEqual(gpu_kv.verify(memoryview(buf), data, 4096, src, slots), [])
        buf[slots[3] * 4096 + 100] ^= 1
        self.assertEqual(gpu_kv.verify(memoryview(buf), data, 4096, src, slots), [3])
        cols = gpu_kv.columns(5, 0, 4096, src, slots)
        self.assertEqual([len(p) for p in gpu_kv.split(cols, 4)], [6])
        big = gpu_kv.columns(5, 0, 16, [0] * 2000, list(range(2000)))
        self.assertEqual([len(p) for p in gpu_kv.split(big, 4)], [818, 818, 364])
        self.assertEqual(gpu_kv.ranges(2000, 4), [(0, 818), (818, 1636), (1636, 2000)])

    def test_plan_writes(self):
        dst, slots = gpu_kv.plan_writes(10 * 4096, 4096, 6 * 4096, seed=1)
        self.assertEqual(len(set(dst)), 6, "distinct destinations")
        self.assertTrue(all(0 <= d < 10 for d in dst))
        self.assertEqual(sorted(slots), list(range(6)))
        self.assertEqual((dst, slots), gpu_kv.plan_writes(10 * 4096, 4096, 6 * 4096, seed=1), "seeded")
        with self.assertRaises(ValueError):
            gpu_kv.plan_writes(5 * 4096, 4096, 6 * 4096, seed=1)
        # The check of a write: every destination block holds its slot's
        # bytes; one never written (the file as it was) is caught.
        buf = bytearray(random.Random(4).randbytes(6 * 4096))
        f = bytearray(10 * 4096)
        for d, s in zip(dst[1:], slots[1:]):
            f[d * 4096:(d + 1) * 4096] = buf[s * 4096:(s + 1) * 4096]
        self.assertEqual(gpu_kv.verify(memoryview(buf), bytes(f), 4096, dst, slots), [0])


@unittest.skipIf(why_not(), f"SKIP: {why_not()}")
class KVEmuTest(unittest.TestCase):
    def test_tool_on_emu(self):
        work = tempfile.mkdtemp(prefix="phxpy-", dir="/var/tmp")
        try:
            backing = os.path.join(work, "backing")
            os.mkdir(backing)
            with open(os.path.join(backing, "kv.bin"), "wb") as f:
                f.write(random.Random(3).randbytes(4 << 20))
            m = Mount(backing, staged=True)
            try:
                out = os.path.join(work, "kv.json")
                with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                    rc = gpu_kv.main(["--emu", "--mount-file", m.path("kv.bin"), "--backing-file",
                                      os.path.join(backing, "kv.bin"), "--out", out, "--total", "1MiB",
                                      "--sizes", "1,16,64", "--timeout", "30"])
            finally:
                m.close()
            self.assertEqual(rc, 0)
            with open(out) as f:
                doc = json.load(f)
            res = doc["results"]
            reads = [r for r in res if r["direction"] == "read"]
            writes = [r for r in res if r["direction"] == "write"]
            self.assertEqual(len(reads) + len(writes), len(res))
            # The rows' runs (4 ioctls in flight per client thread), then one
            # at a time for comparison.
            self.assertEqual([(r["block"], r["threads"], r["inflight"], r["row"]) for r in reads],
                             [(b << 10, t, n, n == 4) for b in (1, 16, 64) for n in (4, 1) for t in (1, 4)])
            # Writes: the same runs by BATCH_WRITE, then the reverse reference
            # at each thread count.
            self.assertEqual([(r["block"], r["side"], r["threads"], r.get("inflight"), r["row"]) for r in writes],
                             [(b << 10, side, t, n, n != 1) for b in (1, 16, 64)
                              for side, t, n in [("phxmount", t, n) for n in (4, 1) for t in (1, 4)] +
                              [("reference", t, None) for t in (1, 4)]])
            for r in res:
                self.assertEqual((r["mismatches"], r["verified"]), (0, (1 << 20) // r["block"]), r["name"])
                self.assertGreater(r["gbps"], 0)
            # The file the writes went to holds the last run's blocks and
            # kept its size.
            self.assertEqual(os.path.getsize(os.path.join(backing, "kv-write.bin")), 4 << 20)
            rows = {r["name"]: r for r in gpu_rows.kv_write_rows({"kv": doc}, {})}
            for name in ("kv_write_16k", "kv_write_64k"):
                self.assertEqual(rows[name]["status"], "measured", name)
                self.assertGreater(rows[name]["ratio"], 0)
        finally:
            shutil.rmtree(work)


if __name__ == "__main__":
    unittest.main()

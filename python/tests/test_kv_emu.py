"""tools/gpu_kv.py (the KV-cache restore benchmark) end to end on an emu
mount with small sizes: random blocks into shuffled slots from 1 and 4
client threads, every block verified; and the check catches a wrong
block. Needs root, /dev/fuse and bin/phxmount."""

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
                res = json.load(f)["results"]
            # The rows' runs (4 ioctls in flight per client thread), then one
            # at a time for comparison.
            self.assertEqual([(r["block"], r["threads"], r["inflight"], r["row"]) for r in res],
                             [(b << 10, t, n, n == 4) for b in (1, 16, 64) for n in (4, 1) for t in (1, 4)])
            for r in res:
                self.assertEqual((r["mismatches"], r["verified"]), (0, (1 << 20) // r["block"]), r["name"])
                self.assertGreater(r["gbps"], 0)
        finally:
            shutil.rmtree(work)


if __name__ == "__main__":
    unittest.main()

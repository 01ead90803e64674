"""The Python ABI against the Go encoder's bytes (golden_abi.json, written by
goldengen from package client)."""

import json
import os
import shutil
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from phxmount import abi  # noqa: E402

GOLDEN = os.path.join(HERE, "golden_abi.json")
ROOT = os.path.dirname(os.path.dirname(HERE))


def load():
    with open(GOLDEN) as f:
        g = json.load(f)
    return g, {v["name"]: v for v in g["vectors"]}


class GoldenTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.g, cls.v = load()

    def want(self, name):
        return bytes.fromhex(self.v[name]["hex"])

    def test_commands(self):
        c = self.g["commands"]
        self.assertEqual(abi.CMD_REGISTER, c["register"])
        self.assertEqual(abi.CMD_DEREGISTER, c["deregister"])
        self.assertEqual(abi.CMD_READ, c["read"])
        self.assertEqual(abi.CMD_WRITE, c["write"])
        self.assertEqual(abi.CMD_INFO, c["info"])
        self.assertEqual(abi.MAX_EXTENTS, c["max_extents"])
        # The doc's table.
        self.assertEqual((abi.CMD_REGISTER, abi.CMD_DEREGISTER, abi.CMD_READ, abi.CMD_INFO),
                         (0xC080E501, 0x4020E502, 0xC030E503, 0xC200E507))
        for cap, r, w in ((16, 0xC290E505, 0xC290E506), (128, 0xD410E505, 0xD410E506), (400, 0xFE90E505, 0xFE90E506)):
            self.assertEqual(abi.cmd_batch(False, cap), r)
            self.assertEqual(abi.cmd_batch(True, cap), w)
        with self.assertRaises(ValueError):
            abi.cmd_batch(False, 410)

    def test_register(self):
        a = self.v["register"]["args"]
        got = abi.encode_register(a["vendor"], a["device"], a["size"], bytes.fromhex(a["handle"]))
        self.assertEqual(bytes(got), self.want("register"))
        r = abi.decode_register_resp(self.want("register_resp"))
        ra = self.v["register_resp"]["args"]
        self.assertEqual((r.id, r.token.hex(), r.transport, r.transport_name), (ra["id"], ra["token"], ra["transport"], "staged"))
        with self.assertRaises(ValueError):
            abi.encode_register(2, 0, 1 << 20, b"short")

    def test_deregister(self):
        self.assertEqual(bytes(abi.encode_deregister(77)), self.want("deregister"))

    def test_io(self):
        a = self.v["io"]["args"]
        got = abi.encode_io(a["id"], a["buf_offset"], a["length"], a["file_offset"])
        self.assertEqual(bytes(got), self.want("io"))
        self.assertEqual(abi.decode_io_resp(self.want("io_resp")), -5)
        with self.assertRaises(ValueError):
            abi.encode_io(1, 0, 1 << 63, 0)
        with self.assertRaises(ValueError):
            abi.encode_io(1, 0, 1 << 62, 1 << 62)

    def test_batches(self):
        for cap in (3, 16, 409):
            a = self.v[f"batch_{cap}"]["args"]
            ext = [abi.Extent(e["id"], e["buf_offset"], e["length"], e["file_offset"]) for e in a["extents"]]
            self.assertEqual(bytes(abi.encode_batch(cap, ext)), self.want(f"batch_{cap}"), f"capacity {cap}")
            self.assertEqual(abi.cmd_batch(False, cap), a["cmd"])
            self.assertEqual(abi.cmd_batch(True, cap), a["cmd_write"])
        failed, res = abi.decode_batch_resp(self.want("batch_resp_16"), 3)
        ra = self.v["batch_resp_16"]["args"]
        self.assertEqual((failed, res), (ra["failed"], ra["results"]))
        with self.assertRaises(abi.ABIError):
            abi.decode_batch_resp(self.want("batch_resp_16"), 2)
        with self.assertRaises(ValueError):
            abi.encode_batch(2, [abi.Extent(1, 0, 1, 0)] * 3)

    def test_strided_batches(self):
        from phxmount.extents import Cols
        for cap in (3, 255):
            a = self.v[f"strided_{cap}"]["args"]
            c = Cols()
            for e in a["extents"]:
                c.ids.append(e["id"])
                c.bufs.append(e["buf_offset"])
                c.lens.append(e["length"])
                c.files.append(e["file_offset"])
                c.counts.append(e["count"])
                c.fsteps.append(e["file_stride"])
                c.bsteps.append(e["buf_stride"])
            self.assertEqual(bytes(abi.encode_strided_batch_cols(cap, c)), self.want(f"strided_{cap}"), f"capacity {cap}")
            self.assertEqual(abi.cmd_strided_batch(False, cap), a["cmd"])
            self.assertEqual(abi.cmd_strided_batch(True, cap), a["cmd_write"])
        failed, res = abi.decode_strided_batch_cols(self.want("strided_resp_3"), 3)
        ra = self.v["strided_resp_3"]["args"]
        self.assertEqual((failed, list(res)), (ra["failed"], ra["results"]))
        self.assertEqual(abi.MAX_STRIDED_EXTENTS, self.g["commands"]["max_strided_extents"])
        self.assertEqual(abi.MAX_PIECES, self.g["commands"]["max_pieces"])

    def test_batch_bounds(self):
        """Every field a batch carries is checked, the wide values that
        take the exact checks (past 2^56, 2^24 pieces, 2^32 file strides)
        and the ones just inside them alike."""
        from array import array
        from phxmount.extents import Cols
        big = 1 << 62
        for ext, field in (([abi.Extent(1, 1 << 63, 1, 0)], "buf_offset"), ([abi.Extent(1, 0, 1 << 63, 0)], "length"),
                           ([abi.Extent(1, 0, 1, 1 << 63)], "file_offset"), ([abi.Extent(1, 0, big, big)], "2^63"),
                           ([abi.Extent(1, 0, 1, 0), abi.Extent(1, -1, 1, 0)], "buf_offset"),
                           ([abi.Extent(1 << 64, 0, 1, 0)], "id")):
            with self.assertRaisesRegex(ValueError, field.replace("^", r"\^")):
                abi.encode_batch(len(ext), ext)
        ok = abi.encode_batch(1, [abi.Extent(1, (1 << 56) + 5, big - 1, big)])  # wide, and valid
        self.assertEqual(abi.decode_batch_resp(ok, 1), (0, [0]))

        def strided(buf, length, file, count, fstep, bstep):
            Q = lambda v: array("Q", [v])  # noqa: E731
            return Cols(Q(1), Q(buf), Q(length), Q(file), Q(count), Q(fstep), Q(bstep))
        for args, what in (((0, 8, 0, 0, 8, 8), "at least one piece"), ((0, 8, 0, 2, 4, 8), "shorter than a piece"),
                           ((0, 8, 0, 2, 8, 4), "shorter than a piece"), ((1 << 63, 8, 0, 1, 8, 8), "buf_offset"),
                           ((0, 8, 0, 1 << 30, 1 << 40, 8), "past 2\\^63"), ((0, 8, big, 2, big, 8), "past 2\\^63")):
            with self.assertRaisesRegex(ValueError, what):
                abi.encode_strided_batch_cols(1, strided(*args))
        abi.encode_strided_batch_cols(1, strided(0, 8, 0, abi.MAX_PIECES, 1 << 33, 8))  # wide, and valid
        for args, what in (((0, 8, 0, abi.MAX_PIECES + 1, 8, 8), "pieces"), ((0, 8, 0, 1 << 25, 1 << 33, 8), "pieces"),
                           ((0, 0, 0, 2, 0, 0), "empty pieces")):
            with self.assertRaisesRegex(ValueError, what):
                abi.encode_strided_batch_cols(1, strided(*args))

    def test_info(self):
        self.assertEqual(bytes(abi.encode_info_req(2)), self.want("info_req"))
        i = abi.decode_info(self.want("info"))
        a = self.v["info"]["args"]
        for k in ("device", "transport", "flags", "workers", "page_size", "bounce_size", "dio_mem_align",
                  "dio_offset_align", "devices", "vendor", "engine", "pci_address", "device_name", "passthrough_why"):
            self.assertEqual(getattr(i, k), a[k], k)
        self.assertEqual(list(abi.COUNTER_NAMES), a["counter_names"])
        self.assertEqual([i.counters[n] for n in abi.COUNTER_NAMES], list(range(1, len(abi.COUNTER_NAMES) + 1)))
        self.assertTrue(i.passthrough and i.read_only and not i.host_addressable)
        self.assertEqual(i.transport_name, "staged")
        bad = bytearray(self.want("info"))
        bad[0] ^= 1
        with self.assertRaises(abi.ABIError):
            abi.decode_info(bytes(bad))

    def test_emu_handle(self):
        h = abi.emu_handle(1234, 5, 1 << 20, 99, 1)
        self.assertEqual(len(h), 64)
        self.assertEqual(h[:8], b"PHXEMU01")
        self.assertEqual(h[8:36], (1234).to_bytes(4, "little") + (5).to_bytes(4, "little") + (1 << 20).to_bytes(8, "little")
                         + (99).to_bytes(8, "little") + (1).to_bytes(4, "little"))
        self.assertEqual(h[36:], bytes(28))


class GoldenFreshTest(unittest.TestCase):
    def test_golden_file_matches_the_go_encoder(self):
        """Regenerates the vectors with Go when PHX_GOLDEN_GO=1 (slow: a Go
        build). `go test ./python/tests/goldengen` checks the same in the Go
        unit tier, so the committed file cannot drift from package client."""
        go = shutil.which("go")
        if os.environ.get("PHX_GOLDEN_GO") != "1":
            self.skipTest("SKIP: set PHX_GOLDEN_GO=1 to regenerate with Go; go test ./python/tests/goldengen checks it")
        if go is None or not os.path.exists(os.path.join(ROOT, "go.mod")):
            self.skipTest("SKIP: no Go toolchain here; checked against the committed golden_abi.json only")
        p = subprocess.run([go, "run", "-ldflags=-checklinkname=0", "./python/tests/goldengen"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300, env=dict(os.environ, CGO_ENABLED="0"))
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(GOLDEN) as f:
            self.assertEqual(json.loads(p.stdout), json.load(f), "python/tests/golden_abi.json is stale: regenerate it")


if __name__ == "__main__":
    unittest.main()

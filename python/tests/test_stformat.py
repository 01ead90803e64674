"""The safetensors format module (phxmount.stformat): the header parser
and the whole-file load planner."""

import json
import os
import struct
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from phxmount import stformat as st  # noqa: E402

MiB = 1 << 20


def header_bytes(obj, pad=0):
    body = json.dumps(obj).encode() + b" " * pad
    return struct.pack("<Q", len(body)) + body


class ParseTest(unittest.TestCase):
    def test_round_trip(self):
        ts = [("a", "U8", (3,), b"abc"), ("b", "F32", (2, 2), bytes(range(16))), ("c", "BF16", (), b"xy"),
              ("empty", "F16", (0, 5), b"")]
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "m.safetensors")
            h = st.write_file(p, ts, metadata={"format": "pt"})
            self.assertEqual(h.data_start % 8, 0)
            r = st.read_header(p)
            self.assertEqual(r, st.read_header(os.open(p, os.O_RDONLY)))
            self.assertEqual(r.metadata, {"format": "pt"})
            self.assertEqual([(t.name, t.dtype, t.shape, t.begin, t.end) for t in r.tensors],
                             [("a", "U8", (3,), 0, 3), ("b", "F32", (2, 2), 3, 19), ("c", "BF16", (), 19, 21),
                              ("empty", "F16", (0, 5), 21, 21)])
            self.assertEqual(r.data_len, 21)
            with open(p, "rb") as f:
                raw = f.read()
            self.assertEqual(raw[r.data_start + 3:r.data_start + 19], bytes(range(16)))

    def test_metadata_none_or_empty(self):
        # safetensors' metadata() is None without __metadata__ (or with
        # null) and {} with an empty one; its serialize writes {} for {}.
        t = {"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}
        for hdr, want in ((t, None), (dict(t, __metadata__=None), None), (dict(t, __metadata__={}), {}),
                          (dict(t, __metadata__={"k": "v"}), {"k": "v"})):
            self.assertEqual(st.parse_header_bytes(header_bytes(hdr)).metadata, want, hdr)
        for meta in (None, {}, {"k": "v"}):
            head, _ = st.encode_header([("t", "U8", (1,), 1)], meta)
            self.assertEqual(st.parse_header_bytes(head).metadata, meta, meta)
            self.assertEqual(b"__metadata__" in head, meta is not None, meta)

    def test_order_is_data_order(self):
        h = st.parse_header_bytes(header_bytes({
            "z": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
            "a": {"dtype": "U8", "shape": [3], "data_offsets": [2, 5]}}))
        self.assertEqual([t.name for t in h.tensors], ["z", "a"])

    def test_errors(self):
        bad = [
            b"\x01\x00",  # shorter than the length
            struct.pack("<Q", 200) + b"{}",  # header runs past the bytes
            struct.pack("<Q", st.MAX_HEADER + 1),
            header_bytes([1, 2]),
            struct.pack("<Q", 3) + b"{x}",
            header_bytes({"t": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}),
            header_bytes({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}),  # 4 bytes for 8
            header_bytes({"t": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}}),
            header_bytes({"t": {"dtype": "U8", "shape": [1], "data_offsets": [2, 1]}}),
            header_bytes({"t": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}),
            header_bytes({"t": {"dtype": ["U8"], "shape": [1], "data_offsets": [0, 1]}}),  # was a TypeError
            header_bytes({"t": {"dtype": "U8", "shape": [1.0], "data_offsets": [0, 1]}}),
            header_bytes({"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, True]}}),
            header_bytes({"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}}),
            header_bytes({"t": {"dtype": "U8", "shape": 1, "data_offsets": [0, 1]}}),
            header_bytes({"t": [1]}),
            header_bytes({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                          "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}),  # overlap
            header_bytes({"__metadata__": {"k": 1}}),
            # What safetensors refuses (InvalidOffset): data not tiling the
            # section from its start.
            header_bytes({"t": {"dtype": "U8", "shape": [1], "data_offsets": [3, 4]}}),  # bytes before it
            header_bytes({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                          "b": {"dtype": "U8", "shape": [2], "data_offsets": [6, 8]}}),  # a gap between
        ]
        for b in bad:
            with self.assertRaises(st.SafetensorsError, msg=repr(b[:60])):
                st.parse_header_bytes(b)
        ok = header_bytes({"t": {"dtype": "U8", "shape": [10], "data_offsets": [0, 10]}})
        with self.assertRaises(st.SafetensorsError):
            st.parse_header_bytes(ok, file_size=len(ok) + 9)  # file too short for the data
        with self.assertRaises(st.SafetensorsError):
            st.parse_header_bytes(ok, file_size=len(ok) + 11)  # bytes after the data (MetadataIncompleteBuffer)
        st.parse_header_bytes(ok, file_size=len(ok) + 10)

    def test_refused_files_are_refused_on_disk(self):
        # read_header says what safetensors says of the whole file: a byte
        # appended after the data, or a gap, is an error, not a file.
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "m.safetensors")
            st.write_file(p, [("a", "U8", (3,), b"abc"), ("z", "F16", (0,), b"")])
            st.read_header(p)
            with open(p, "ab") as f:
                f.write(b"\0")
            with self.assertRaisesRegex(st.SafetensorsError, "the file has"):
                st.read_header(p)


class PlanTest(unittest.TestCase):
    def test_chunks_at_128MiB(self):
        h = st.parse_header_bytes(header_bytes({
            "small": {"dtype": "U8", "shape": [5], "data_offsets": [0, 5]},
            "big": {"dtype": "F32", "shape": [100 * MiB], "data_offsets": [5, 5 + 400 * MiB]},
            "tail": {"dtype": "I64", "shape": [3], "data_offsets": [5 + 400 * MiB, 29 + 400 * MiB]}}))
        ext = st.plan_extents(h)
        self.assertEqual(len(ext), 1 + 4 + 1)
        self.assertTrue(all(e.length <= st.DEFAULT_CHUNK for e in ext))
        self.assertEqual([e.length for e in ext[1:5]], [128 * MiB, 128 * MiB, 128 * MiB, 16 * MiB])
        # Contiguous, exactly the data section, file offset = data start + buffer offset.
        pos = 0
        for e in ext:
            self.assertEqual(e.buf_offset, pos)
            self.assertEqual(e.file_offset, h.data_start + e.buf_offset)
            pos += e.length
        self.assertEqual(pos, h.data_len)
        # Another chunk size and a base offset.
        ext = st.plan_extents(h, chunk=3 * MiB + 7, base=64)
        self.assertEqual(sum(e.length for e in ext), h.data_len)
        self.assertEqual(ext[0].buf_offset, 64)
        self.assertEqual(ext[0].length, 5)
        with self.assertRaises(ValueError):
            st.plan_extents(h, chunk=0)


if __name__ == "__main__":
    unittest.main()

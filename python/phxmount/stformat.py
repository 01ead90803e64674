"""The safetensors file format: its header parser and encoder, and the
extents of a whole-file load. Pure Python, no torch. (Named stformat, not
safetensors: phxmount.hook adapts the safetensors package itself.)

The format: an 8-byte little-endian header length N, N bytes of JSON
({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}),
then the data section; offsets are relative to its start (8 + N).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

# Bytes per element of each safetensors dtype.
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}

MAX_HEADER = 100 * 1000 * 1000  # the format's own limit
DEFAULT_CHUNK = 128 << 20  # bytes per extent: the 128 MiB of the NIXL GDS loader


class SafetensorsError(ValueError):
    pass


class TensorInfo(NamedTuple):
    """One tensor of a header. A named tuple, not a frozen dataclass: a
    header of thousands of tensors makes one per tensor at every open, and
    a frozen dataclass's __init__ costs four times a tuple's."""
    name: str
    dtype: str
    shape: Tuple[int, ...]
    begin: int  # offset in the data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    header_len: int
    data_start: int  # file offset of the data section: 8 + header_len
    data_len: int  # bytes of the data section that tensors use
    tensors: Tuple[TensorInfo, ...]  # in data order
    # __metadata__: None where the header has none (or null), as safetensors'
    # metadata() answers; {} where it is empty.
    metadata: Optional[Dict[str, str]]


def parse_header_bytes(prefix: bytes, file_size: Optional[int] = None) -> Header:
    """Parses a header from the file's first bytes (8 + N at least)."""
    if len(prefix) < 8:
        raise SafetensorsError("file shorter than the 8-byte header length")
    (n,) = struct.unpack_from("<Q", prefix)
    if n > MAX_HEADER:
        raise SafetensorsError(f"header length {n} exceeds {MAX_HEADER}")
    if len(prefix) < 8 + n:
        raise SafetensorsError(f"header of {n} bytes, only {len(prefix) - 8} present")
    try:
        obj = json.loads(prefix[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"header is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise SafetensorsError("header is not a JSON object")
    meta = obj.pop("__metadata__", None)
    if meta is not None and (not isinstance(meta, dict) or
                             not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())):
        raise SafetensorsError("__metadata__ must map strings to strings")
    tensors: List[TensorInfo] = []
    for name, d in obj.items():  # type() is, not isinstance: a bool is not a size (and this runs per tensor)
        if type(d) is not dict:
            raise SafetensorsError(f"{name}: entry is not an object")
        dtype, shape, offs = d.get("dtype"), d.get("shape"), d.get("data_offsets")
        es = DTYPE_SIZES.get(dtype) if type(dtype) is str else None
        if es is None:
            raise SafetensorsError(f"{name}: unsupported dtype {dtype!r}")
        if type(shape) is not list:
            raise SafetensorsError(f"{name}: bad shape {shape!r}")
        numel = 1
        for x in shape:
            if type(x) is not int or x < 0:
                raise SafetensorsError(f"{name}: bad shape {shape!r}")
            numel *= x
        if type(offs) is not list or len(offs) != 2:
            raise SafetensorsError(f"{name}: bad data_offsets {offs!r}")
        b, e = offs
        if type(b) is not int or type(e) is not int or b < 0 or b > e:
            raise SafetensorsError(f"{name}: bad data_offsets {offs!r}")
        if e - b != numel * es:
            raise SafetensorsError(f"{name}: {e - b} bytes for {dtype}{shape}, want {numel * es}")
        tensors.append(TensorInfo(name, dtype, tuple(shape), b, e))
    # As safetensors validates a file: the tensors, in data order, tile the
    # data section from its start with no gap and no overlap, and it ends
    # where the file does. A file it refuses is refused here too (the hook
    # then hands it to safetensors, whose error the caller gets), never
    # read as if it were whole.
    tensors.sort(key=lambda t: (t.begin, t.end))
    pos = 0
    for t in tensors:
        if t.begin != pos:
            what = "overlaps the previous tensor" if t.begin < pos else f"leaves bytes [{pos}, {t.begin}) to no tensor"
            raise SafetensorsError(f"{t.name}: data [{t.begin}, {t.end}) {what}")
        pos = t.end
    data_start = 8 + n
    if file_size is not None and data_start + pos != file_size:
        raise SafetensorsError(f"the header and tensors take {data_start + pos} bytes, the file has {file_size}")
    return Header(n, data_start, pos, tuple(tensors), None if meta is None else dict(meta))


def read_header(f: Union[int, str, os.PathLike]) -> Header:
    """Reads and parses the header of a file (a path or an open descriptor)."""
    own = not isinstance(f, int)
    fd = os.open(f, os.O_RDONLY | os.O_CLOEXEC) if own else f
    try:
        size = os.fstat(fd).st_size
        first = os.pread(fd, 8, 0)
        if len(first) < 8:
            raise SafetensorsError("file shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", first)
        if n > MAX_HEADER or 8 + n > size:
            raise SafetensorsError(f"header length {n} does not fit a file of {size} bytes")
        body = b""
        while len(body) < n:
            part = os.pread(fd, n - len(body), 8 + len(body))
            if not part:
                raise SafetensorsError("file ended inside the header")
            body += part
        return parse_header_bytes(first + body, size)
    finally:
        if own:
            os.close(fd)


@dataclass(frozen=True)
class Extent:
    buf_offset: int
    length: int
    file_offset: int


def plan_extents(h: Header, chunk: int = DEFAULT_CHUNK, base: int = 0) -> List[Extent]:
    """Every tensor's bytes, cut at chunk bytes: the buffer holds the data
    section as laid out in the file, starting at buffer offset base."""
    if chunk <= 0:
        raise ValueError("chunk must be positive")
    out: List[Extent] = []
    for t in h.tensors:
        done = 0
        while done < t.nbytes:
            n = min(chunk, t.nbytes - done)
            out.append(Extent(base + t.begin + done, n, h.data_start + t.begin + done))
            done += n
    return out


def encode_header(tensors: Sequence[Tuple[str, str, Sequence[int], int]],
                  metadata: Optional[Dict[str, str]] = None, align: int = 8) -> Tuple[bytes, List[int]]:
    """The first bytes of a safetensors file whose tensors, (name, dtype,
    shape, nbytes), follow in this order: the 8-byte little-endian header
    length and the JSON header, padded with spaces so the data starts at a
    multiple of align. Returns them and each tensor's data offset. An empty
    metadata is written as an empty __metadata__, None as none (as
    safetensors' serialize does)."""
    hdr: Dict[str, object] = {}
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise SafetensorsError("metadata must map strings to strings")
        hdr["__metadata__"] = dict(metadata)
    pos, offsets = 0, []
    for name, dtype, shape, nbytes in tensors:
        numel = 1
        for x in shape:
            numel *= x
        if dtype not in DTYPE_SIZES or numel * DTYPE_SIZES[dtype] != nbytes:
            raise SafetensorsError(f"{name}: {nbytes} bytes for {dtype}{list(shape)}")
        if name in hdr:
            raise SafetensorsError(f"tensor name {name!r} twice")
        hdr[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        offsets.append(pos)
        pos += nbytes
    body = json.dumps(hdr, separators=(",", ":")).encode()
    body += b" " * ((-(8 + len(body))) % align)
    return struct.pack("<Q", len(body)) + body, offsets


def write_file(path: Union[str, os.PathLike], tensors: Sequence[Tuple[str, str, Sequence[int], bytes]],
               metadata: Optional[Dict[str, str]] = None, align: int = 8) -> Header:
    """Writes a safetensors file from (name, dtype, shape, raw bytes) in order
    (tests and tools). The header is padded with spaces to a multiple of align."""
    head, _ = encode_header([(n, dt, sh, len(data)) for n, dt, sh, data in tensors], metadata, align)
    with open(path, "wb") as f:
        f.write(head)
        for _, _, _, data in tensors:
            f.write(data)
    return parse_header_bytes(head)

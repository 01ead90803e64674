"""The phxmount ioctl ABI, version 1, written from docs/abi.md.

Pure data: command numbers and the packing and unpacking of every struct
(little-endian, no padding). No system calls here; see client.py.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass, field
from operator import lt as _lt
from typing import List, Sequence, Tuple

MAGIC = 0x4D584850  # the bytes "PHXM"
VERSION = 1
TYPE = 0xE5

NR_REGISTER = 0x01
NR_DEREGISTER = 0x02
NR_READ = 0x03
NR_WRITE = 0x04
NR_BATCH_READ = 0x05
NR_BATCH_WRITE = 0x06
NR_INFO = 0x07
NR_BATCH_READ_STRIDED = 0x08
NR_BATCH_WRITE_STRIDED = 0x09

REGISTER_SIZE = 128
DEREGISTER_SIZE = 32
IO_SIZE = 48
BATCH_HEADER = 16
EXTENT_SIZE = 40
INFO_SIZE = 512
MAX_IOCTL_SIZE = 16383
MAX_EXTENTS = (MAX_IOCTL_SIZE - BATCH_HEADER) // EXTENT_SIZE  # 409
STRIDED_EXTENT_SIZE = 64
MAX_STRIDED_EXTENTS = (MAX_IOCTL_SIZE - BATCH_HEADER) // STRIDED_EXTENT_SIZE  # 255
# The most pieces one strided batch moves (its extents' counts summed):
# the daemon refuses more with E2BIG (docs/abi.md, "Limits").
MAX_PIECES = 1 << 16
HANDLE_SIZE = 64
TOKEN_SIZE = 16
MAX_OFFSET = (1 << 63) - 1

_IOC_WRITE = 1
_IOC_READ = 2

VENDOR_ANY, VENDOR_EMU, VENDOR_NVIDIA, VENDOR_PCIBAR = 0, 1, 2, 3
VENDORS = {VENDOR_ANY: "any", VENDOR_EMU: "emu", VENDOR_NVIDIA: "nvidia", VENDOR_PCIBAR: "pcibar"}

TRANSPORT_KMOD, TRANSPORT_HOST, TRANSPORT_STAGED = 1, 2, 3
TRANSPORTS = {TRANSPORT_KMOD: "kmod", TRANSPORT_HOST: "host", TRANSPORT_STAGED: "staged"}

INFO_PASSTHROUGH = 1 << 0
INFO_READ_ONLY = 1 << 1
INFO_HOST_ADDRESSABLE = 1 << 2
INFO_CACHESTAT = 1 << 3
INFO_ENGINE_FALLBACK = 1 << 4
INFO_NETWORK_BACKING = 1 << 5

# INFO's cache field (offset 52; 0 from a daemon older than it).
CACHES = {0: "unknown", 1: "off", 2: "watch", 3: "revalidate", 4: "exclusive"}

# INFO's counters in wire order (docs/abi.md; the golden vectors carry the
# Go table's names, and test_abi checks these against them).
COUNTER_NAMES = (
    "buffers_live", "buffers_registered", "released_deregister", "released_close",
    "released_death", "ioctl_bytes_read", "ioctl_bytes_written", "ioctl_extents",
    "ioctl_failed_extents", "ioctl_rejected", "ioctl_calls", "lib_bytes_read",
    "lib_bytes_written", "lib_requests", "lib_ops", "lib_coalesced", "lib_failed",
    "lib_batches", "xattr_loads", "staged_direct_reads", "staged_direct_bytes",
    "staged_buffered_reads", "staged_buffered_bytes", "staged_fallbacks",
)
COUNTERS_OFFSET = 312


def ioc(direction: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (TYPE << 8) | nr


CMD_REGISTER = ioc(_IOC_READ | _IOC_WRITE, NR_REGISTER, REGISTER_SIZE)  # 0xC080E501
CMD_DEREGISTER = ioc(_IOC_WRITE, NR_DEREGISTER, DEREGISTER_SIZE)  # 0x4020E502
CMD_READ = ioc(_IOC_READ | _IOC_WRITE, NR_READ, IO_SIZE)  # 0xC030E503
CMD_WRITE = ioc(_IOC_READ | _IOC_WRITE, NR_WRITE, IO_SIZE)  # 0xC030E504
CMD_INFO = ioc(_IOC_READ | _IOC_WRITE, NR_INFO, INFO_SIZE)  # 0xC200E507


def batch_size(capacity: int) -> int:
    return BATCH_HEADER + capacity * EXTENT_SIZE


def cmd_batch(write: bool, capacity: int) -> int:
    if not 1 <= capacity <= MAX_EXTENTS:
        raise ValueError(f"batch capacity {capacity} not in 1..{MAX_EXTENTS}")
    return ioc(_IOC_READ | _IOC_WRITE, NR_BATCH_WRITE if write else NR_BATCH_READ, batch_size(capacity))


def strided_batch_size(capacity: int) -> int:
    return BATCH_HEADER + capacity * STRIDED_EXTENT_SIZE


def cmd_strided_batch(write: bool, capacity: int) -> int:
    if not 1 <= capacity <= MAX_STRIDED_EXTENTS:
        raise ValueError(f"strided batch capacity {capacity} not in 1..{MAX_STRIDED_EXTENTS}")
    nr = NR_BATCH_WRITE_STRIDED if write else NR_BATCH_READ_STRIDED
    return ioc(_IOC_READ | _IOC_WRITE, nr, strided_batch_size(capacity))


_HEADER = struct.Struct("<IHH")
_REGISTER = struct.Struct("<IHHIIQ64sQ16sI12s")
_DEREGISTER = struct.Struct("<IHHQ16s")
_IO = struct.Struct("<IHHQQQQq")
_BATCH_HEAD = struct.Struct("<IHHII")
_EXTENT = struct.Struct("<QQQQq")
_INFO_HEAD = struct.Struct("<IHHiIIIQQIIII16s16s32s64s128s")
_INFO_REQ = struct.Struct("<IHHi")
assert _REGISTER.size == REGISTER_SIZE and _DEREGISTER.size == DEREGISTER_SIZE
assert _IO.size == IO_SIZE and _BATCH_HEAD.size == BATCH_HEADER and _EXTENT.size == EXTENT_SIZE
assert _INFO_HEAD.size == COUNTERS_OFFSET


class ABIError(ValueError):
    """A reply that does not decode (wrong magic, version or size)."""


def _check_header(b: bytes, size: int, what: str) -> None:
    if len(b) != size:
        raise ABIError(f"{what}: {len(b)} bytes, want {size}")
    magic, version, flags = _HEADER.unpack_from(b)
    if magic != MAGIC or version != VERSION or flags != 0:
        raise ABIError(f"{what}: header {magic:#x}/{version}/{flags}")


def _u64(name: str, v: int) -> int:
    if not 0 <= v <= MAX_OFFSET:
        raise ValueError(f"{name} {v} is not in [0, 2^63)")
    return v


# --- REGISTER ---------------------------------------------------------------

def encode_register(vendor: int, device: int, size: int, handle: bytes) -> bytearray:
    if len(handle) != HANDLE_SIZE:
        raise ValueError(f"handle of {len(handle)} bytes, want {HANDLE_SIZE}")
    if not 0 <= device < 1 << 32 or not 0 <= vendor < 1 << 32:
        raise ValueError("vendor/device out of range")
    return bytearray(_REGISTER.pack(MAGIC, VERSION, 0, vendor, device, _u64("size", size), bytes(handle),
                                    0, b"", 0, b""))


@dataclass
class Registered:
    id: int
    token: bytes
    transport: int

    @property
    def transport_name(self) -> str:
        return TRANSPORTS.get(self.transport, f"transport({self.transport})")


def decode_register_resp(b: bytes) -> Registered:
    _check_header(bytes(b), REGISTER_SIZE, "REGISTER reply")
    f = _REGISTER.unpack(bytes(b))
    return Registered(id=f[7], token=f[8], transport=f[9])


# --- DEREGISTER -------------------------------------------------------------

def encode_deregister(buf_id: int) -> bytearray:
    return bytearray(_DEREGISTER.pack(MAGIC, VERSION, 0, buf_id, b""))


# --- READ / WRITE -----------------------------------------------------------

def encode_io(buf_id: int, buf_offset: int, length: int, file_offset: int) -> bytearray:
    _check_extent(buf_offset, length, file_offset)
    return bytearray(_IO.pack(MAGIC, VERSION, 0, buf_id, buf_offset, length, file_offset, 0))


def decode_io_resp(b: bytes) -> int:
    _check_header(bytes(b), IO_SIZE, "READ/WRITE reply")
    return _IO.unpack(bytes(b))[7]


def _check_extent(buf_offset: int, length: int, file_offset: int) -> None:
    _u64("buf_offset", buf_offset)
    _u64("length", length)
    _u64("file_offset", file_offset)
    if file_offset + length > MAX_OFFSET:
        raise ValueError("file_offset + length is not below 2^63")


# --- BATCH ------------------------------------------------------------------

@dataclass
class Extent:
    """One batch extent: length bytes at file_offset <-> buffer id at buf_offset."""
    id: int
    buf_offset: int
    length: int
    file_offset: int
    result: int = 0


def encode_batch(capacity: int, extents: Sequence[Extent]) -> bytearray:
    if not 1 <= capacity <= MAX_EXTENTS:
        raise ValueError(f"batch capacity {capacity} not in 1..{MAX_EXTENTS}")
    if len(extents) > capacity:
        raise ValueError(f"{len(extents)} extents do not fit a batch of {capacity}")
    return encode_batch_cols(capacity, _ExtentColumns(extents))


class _ExtentColumns:
    """Extent objects as the columns encode_batch_cols packs (a BATCH of
    409 extents is a few slice assignments, not 409 struct calls: the
    client's threads share one GIL)."""

    def __init__(self, extents: Sequence[Extent]):
        self.extents = extents
        try:
            self.ids = array("Q", [e.id for e in extents])
            self.bufs = array("Q", [e.buf_offset for e in extents])
            self.lens = array("Q", [e.length for e in extents])
            self.files = array("Q", [e.file_offset for e in extents])
        except OverflowError:
            for e in extents:  # name the bad field
                if not 0 <= e.id < 1 << 64:
                    raise ValueError(f"id {e.id} is not a u64") from None
                _check_extent(e.buf_offset, e.length, e.file_offset)
            raise

    def __len__(self) -> int:
        return len(self.extents)

    def __iter__(self):
        return ((e.id, e.buf_offset, e.length, e.file_offset) for e in self.extents)


def decode_batch_resp(b: bytes, count: int) -> Tuple[int, List[int]]:
    """Returns (failed, per-extent results: bytes moved or -errno)."""
    if len(b) < BATCH_HEADER or (len(b) - BATCH_HEADER) % EXTENT_SIZE:
        raise ABIError(f"batch reply of {len(b)} bytes")
    failed, results = _batch_results(b, count, EXTENT_SIZE, "BATCH")
    return failed, results.tolist()


def encode_batch_cols(capacity: int, cols) -> bytearray:
    """encode_batch from extent columns (extents.Cols): the same bytes,
    packed by slice assignment rather than one struct call per extent."""
    n = len(cols)
    b = _batch_payload(capacity, n, MAX_EXTENTS, batch_size, "batch")
    if n == 0:
        return b
    raw = _interleave((cols.ids, cols.bufs, cols.lens, cols.files), EXTENT_SIZE // 8, n)
    b[BATCH_HEADER:BATCH_HEADER + n * EXTENT_SIZE] = raw
    if _wide(raw, EXTENT_SIZE, ((1, 7), (2, 7), (3, 7))):
        for _, off, length, fo in cols:
            _check_extent(off, length, fo)  # names the bad field
    return b


def _interleave(columns, width: int, n: int) -> bytes:
    """The n extents of width u64 each, the given columns (array('Q'))
    first in each and zeros after: an array's strided slice assignment is
    a C loop of item copies, where a memoryview's is a conversion per item
    (7x slower: 50 us of a 409-extent batch's 100, per ioctl of a KV
    client, under the interpreter's lock)."""
    out = array("Q", bytes(8 * width * n))
    for k, col in enumerate(columns):
        out[k::width] = col
    return out.tobytes()


_NUL = b"\0"


def _wide(raw: bytes, size: int, fields) -> bool:
    """Whether some extent of a packed batch body has a field whose bytes
    from the given one up are not all zero: (field, byte) pairs, fields
    numbered by u64 in the extent, bytes little-endian. Values below the
    bounds cannot overflow (2^56 for offsets and lengths), so the exact
    checks, one extent at a time, run only for the rare batch that is
    not below them; a max() over each column costs more than the ioctl's
    payload is worth."""
    for f, first in fields:
        for k in range(first, 8):
            if raw[8 * f + k::size].strip(_NUL):
                return True
    return False


def decode_batch_cols(b: bytes, count: int):
    """(failed, results as an array('q')) of a batch reply of count extents."""
    return _batch_results(b, count, EXTENT_SIZE, "batch")


def _batch_results(b: bytes, count: int, extent_size: int, what: str):
    """(failed, results) of a plain or strided batch reply: the result is
    each extent's last u64."""
    if len(b) < BATCH_HEADER + count * extent_size:
        raise ABIError(f"{what} reply of {len(b)} bytes for {count} extents")
    _check_header(bytes(b[:8]), 8, f"{what} reply")
    _, _, _, n, failed = _BATCH_HEAD.unpack_from(b, 0)
    if n != count:
        raise ABIError(f"{what} reply counts {n} extents, {count} sent")
    res = array("q")
    res.frombytes(memoryview(b)[BATCH_HEADER:BATCH_HEADER + count * extent_size])
    q = extent_size // 8
    return failed, res[q - 1::q]


def _batch_payload(capacity: int, n: int, most: int, size, what: str) -> bytearray:
    """A batch payload of this capacity with its header for n extents."""
    if not 1 <= capacity <= most:
        raise ValueError(f"{what} capacity {capacity} not in 1..{most}")
    if n > capacity:
        raise ValueError(f"{n} extents do not fit a {what} of {capacity}")
    b = bytearray(size(capacity))
    _BATCH_HEAD.pack_into(b, 0, MAGIC, VERSION, 0, n, 0)
    return b


def encode_strided_batch_cols(capacity: int, cols) -> bytearray:
    """A BATCH_READ_STRIDED / BATCH_WRITE_STRIDED payload from extent
    columns (extents.Cols, counts and strides included)."""
    n = len(cols)
    b = _batch_payload(capacity, n, MAX_STRIDED_EXTENTS, strided_batch_size, "strided batch")
    if n == 0:
        return b
    raw = _interleave((cols.ids, cols.bufs, cols.lens, cols.files, cols.counts, cols.fsteps, cols.bsteps),
                      STRIDED_EXTENT_SIZE // 8, n)
    b[BATCH_HEADER:BATCH_HEADER + n * STRIDED_EXTENT_SIZE] = raw
    # Below 2^56 (offsets, lengths, buffer strides), 2^24 pieces and 2^32
    # file strides nothing can pass 2^63; the rest is checked one by one.
    if (_wide(raw, STRIDED_EXTENT_SIZE, ((1, 7), (2, 7), (3, 7), (6, 7), (4, 3), (5, 4))) or 0 in cols.counts
            or (_maybe_overlapping(cols) and any(c > 1 and (ln == 0 or f < ln or bs < ln)
                                                 for c, f, bs, ln in zip(cols.counts, cols.fsteps, cols.bsteps, cols.lens)))):
        for i in range(n):
            _check_strided(cols.bufs[i], cols.lens[i], cols.files[i], cols.counts[i], cols.fsteps[i], cols.bsteps[i])
    if sum(cols.counts) > MAX_PIECES:
        raise ValueError(f"{sum(cols.counts)} pieces: one strided batch moves at most {MAX_PIECES}")
    return b


def _maybe_overlapping(cols) -> bool:
    """Whether some extent could have pieces of no length or overlapping
    ones (a stride below the length): looked at in C loops over whole
    columns, so that a batch of well-formed extents (every stride at
    least its length, as plans make them) skips the exact Python loop,
    some 75 us of a 255-extent batch."""
    return 0 in cols.lens or any(map(_lt, cols.fsteps, cols.lens)) or any(map(_lt, cols.bsteps, cols.lens))


def _check_strided(buf_offset: int, length: int, file_offset: int, count: int, fstep: int, bstep: int) -> None:
    _check_extent(buf_offset, length, file_offset)
    if count < 1:
        raise ValueError("a strided extent has at least one piece")
    if count > 1 and length == 0:
        raise ValueError(f"a strided extent of {count} empty pieces")
    if count > 1 and (fstep < length or bstep < length):
        raise ValueError(f"strides {fstep} (file) and {bstep} (buffer) shorter than a piece of {length}")
    if file_offset + (count - 1) * fstep + length > MAX_OFFSET:
        raise ValueError("the last piece ends past 2^63 in the file")


def decode_strided_batch_cols(b: bytes, count: int):
    """(failed, results as an array('q')) of a strided batch reply."""
    return _batch_results(b, count, STRIDED_EXTENT_SIZE, "strided batch")


def batch_capacity_for(n: int) -> int:
    """The capacity a batch of n extents is sent with: exactly n (any 1..409 is valid)."""
    if not 1 <= n <= MAX_EXTENTS:
        raise ValueError(f"{n} extents: one batch carries 1..{MAX_EXTENTS}")
    return n


# --- INFO -------------------------------------------------------------------

def encode_info_req(device: int) -> bytearray:
    b = bytearray(INFO_SIZE)
    _INFO_REQ.pack_into(b, 0, MAGIC, VERSION, 0, device)
    return b


def _cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


@dataclass
class Info:
    device: int
    transport: int
    flags: int
    workers: int
    page_size: int
    bounce_size: int
    dio_mem_align: int
    dio_offset_align: int
    devices: int
    cache: int  # how the kernel caches the file (CACHES)
    vendor: str
    engine: str
    pci_address: str
    device_name: str
    passthrough_why: str
    counters: dict = field(default_factory=dict)

    @property
    def transport_name(self) -> str:
        return TRANSPORTS.get(self.transport, f"transport({self.transport})")

    @property
    def cache_name(self) -> str:
        return CACHES.get(self.cache, f"cache({self.cache})")

    @property
    def passthrough(self) -> bool:
        return bool(self.flags & INFO_PASSTHROUGH)

    @property
    def read_only(self) -> bool:
        return bool(self.flags & INFO_READ_ONLY)

    @property
    def host_addressable(self) -> bool:
        return bool(self.flags & INFO_HOST_ADDRESSABLE)


def decode_info(b: bytes) -> Info:
    b = bytes(b)
    _check_header(b, INFO_SIZE, "INFO reply")
    f = _INFO_HEAD.unpack_from(b, 0)
    counters = dict(zip(COUNTER_NAMES, struct.unpack_from(f"<{len(COUNTER_NAMES)}Q", b, COUNTERS_OFFSET)))
    return Info(device=f[3], transport=f[4], flags=f[5], workers=f[6], page_size=f[7], bounce_size=f[8],
                dio_mem_align=f[9], dio_offset_align=f[10], devices=f[11], cache=f[12], vendor=_cstr(f[13]),
                engine=_cstr(f[14]), pci_address=_cstr(f[15]), device_name=_cstr(f[16]),
                passthrough_why=_cstr(f[17]), counters=counters)


# --- the emu handle (docs/abi.md, informative) -------------------------------

EMU_HANDLE_MAGIC = b"PHXEMU01"


def emu_handle(pid: int, fd: int, size: int, inode: int, device: int) -> bytes:
    h = struct.pack("<8sIIQQI", EMU_HANDLE_MAGIC, pid, fd, size, inode, device)
    return h + bytes(HANDLE_SIZE - len(h))

"""Backends of the fetch engine whose results are numpy arrays, no torch:

* EmuBackend lands the bytes in the emulated device of a mount started
  with --vendor emu (BATCH ioctls, registrations through the cache): the
  whole GPU path, planner included, on a machine without a GPU;
* HostBackend preads them into host memory: safe_open(framework="np").

numpy is imported when a result is built. bfloat16 and the float8 types,
which numpy lacks, come back as their bit patterns (uint16 / uint8)."""

from __future__ import annotations

import itertools
import os
from typing import Dict, Optional, Union

from . import abi
from .availability import available
from .batchio import BatchIO, PreadIO
from .client import EmuBuffer
from .fetch import Fetcher
from .safeopen import SafeOpen
from .regcache import PAGE, Alloc, cache_for
from .slicing import Plan

NP_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U8": "u1", "BOOL": "?", "U16": "<u2", "U32": "<u4", "U64": "<u8", "C64": "<c8",
    "F8_E4M3": "u1", "F8_E5M2": "u1", "F8_E8M0": "u1",
}


def host_result(raw, plan: Plan):
    """The numpy array of plan from the bytes it read (a copy that owns
    its memory)."""
    import numpy as np
    dt = np.dtype(NP_DTYPES[plan.dtype])
    if plan.out_bytes == 0:
        return np.empty(plan.out_shape, dt)
    shape = plan.temp_shape()
    count = 1
    for s in shape:
        count *= s
    a = np.frombuffer(raw, dtype=dt, count=count).reshape(shape)
    post = plan.post()
    if post is not None:
        a = a[post]
    return np.array(a, order="C").reshape(plan.out_shape)


def emu_alloc(buf: EmuBuffer) -> Alloc:
    """An emu buffer as the registration cache sees an allocation: its
    memfd's inode is its identity (and, times 64 KiB, its address)."""
    ino = os.fstat(buf.fd).st_ino
    return Alloc(ino * PAGE, buf.size, ino, buf.handle)


class EmuBackend:
    """Destinations in the emulated device's memory, one memfd a request."""

    def __init__(self, cache):
        self.cache = cache

    def prepare(self, plans) -> None:
        pass

    def alloc(self, plan: Plan) -> EmuBuffer:
        return EmuBuffer(plan.read_bytes)

    def scratch(self, nbytes: int) -> EmuBuffer:
        return EmuBuffer(nbytes)

    def locate(self, buf: EmuBuffer):
        a = emu_alloc(buf)
        return self.cache.locate(a, a.base, buf.size)

    def finish(self, buf: EmuBuffer, plan: Plan):
        try:
            return host_result(buf.view[:plan.read_bytes], plan)
        finally:
            self.release(buf)

    def release(self, buf: EmuBuffer) -> None:
        self.cache.forget(emu_alloc(buf).base)
        buf.close()


class HostMemory:
    """Destinations in host memory, filled with pread (batchio.PreadIO):
    each is (id, memory), its bytes writable through views[id]. A subclass
    says how to allocate (new) and what a result is (finish)."""

    def __init__(self):
        self.views: Dict[int, memoryview] = {}
        self._ids = itertools.count(1)

    def new(self, nbytes: int):
        """(memory, a writable memoryview of its bytes)."""
        b = bytearray(nbytes)
        return b, memoryview(b)

    def prepare(self, plans) -> None:
        pass

    def alloc(self, plan: Plan):
        return self.scratch(plan.read_bytes)

    def scratch(self, nbytes: int):
        i, (mem, view) = next(self._ids), self.new(nbytes)
        self.views[i] = view
        return i, mem

    def locate(self, mem):
        return mem[0], 0

    def release(self, mem) -> None:
        self.views.pop(mem[0], None)


class HostBackend(HostMemory):
    """pread into bytearrays; numpy results."""

    def finish(self, mem, plan: Plan):
        self.release(mem)
        return host_result(mem[1], plan)


def open_emu(path: Union[str, os.PathLike], threads: int = 2, owned: bool = True, fd: Optional[int] = None,
             availability=None, **kw) -> SafeOpen:
    """safe_open over the emulated device of an emu mount (tests, demos);
    numpy results always own their memory (owned is accepted and moot).
    fd: a descriptor of path for the reads (closed with the reader);
    availability: what available() said of path, when already asked."""
    backend = EmuBackend(cache_for(path, abi.VENDOR_EMU, 0))
    io = BatchIO(path, threads, fd=fd)
    try:
        return SafeOpen(Fetcher(path, backend, io, **kw), availability or available(path))
    except BaseException:
        io.close()
        raise


def open_host(path: Union[str, os.PathLike], threads: int = 2, owned: bool = True, **kw) -> SafeOpen:
    """safe_open(framework="np"): pread into host memory, numpy results."""
    av = available(path)
    av.fallback = "pread into host memory (numpy results)"
    backend = HostBackend()
    return SafeOpen(Fetcher(path, backend, PreadIO(path, backend.views, threads), **kw), av)

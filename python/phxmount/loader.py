"""The safetensors load through the mount, independent of where the buffer
lives: parse the header, plan every tensor's extent (cut at 128 MiB), submit
them all as BATCH ioctls, wait with a timeout, into one buffer registered
for the load: load_safetensors_emu (here) in the emulated device's memory.
The GPU loaders (torch_load.py) run on the fetch engine (fetch.py)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from . import abi
from .client import EmuBuffer, PhxFile
from .stformat import DEFAULT_CHUNK, Header, plan_extents, read_header

DEFAULT_TIMEOUT = 120.0  # seconds for a whole file, as the NIXL GDS loader


@dataclass
class LoadStats:
    path: str = ""
    bytes: int = 0
    tensors: int = 0
    extents: int = 0
    ioctls: int = 0
    transport: str = ""
    seconds: float = 0.0  # whole load: header, allocation, registration, I/O, tensors
    io_seconds: float = 0.0  # the BATCH ioctls alone
    extra: Dict[str, float] = field(default_factory=dict)
    plans: List[Tuple[str, str, str]] = field(default_factory=list)  # (tensor, strategy, why)

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


def load_registered(f: PhxFile, h: Header, buf_id: int, chunk: int = DEFAULT_CHUNK,
                    timeout: Optional[float] = DEFAULT_TIMEOUT, stats: Optional[LoadStats] = None,
                    on_abandon: Optional[Callable[[], None]] = None, base: int = 0) -> None:
    """Reads every tensor of h into the registered buffer buf_id, the data
    section laid out as in the file from buffer offset base."""
    ext = [abi.Extent(buf_id, e.buf_offset, e.length, e.file_offset) for e in plan_extents(h, chunk, base)]
    t0 = time.perf_counter()
    f.batch_read_all(ext, timeout=timeout, on_abandon=on_abandon)
    if stats is not None:
        stats.io_seconds = time.perf_counter() - t0
        stats.extents = len(ext)
        stats.ioctls = (len(ext) + abi.MAX_EXTENTS - 1) // abi.MAX_EXTENTS
        stats.bytes = sum(e.length for e in ext)
        stats.tensors = len(h.tensors)


def load_via(path: Union[str, os.PathLike], vendor: int, device: int,
              allocate: Callable[[Header], Tuple[Any, bytes]],
              tensors: Callable[[Any, Header], Dict[str, Any]],
              release: Callable[[Any], None], chunk: int = DEFAULT_CHUNK,
              timeout: Optional[float] = DEFAULT_TIMEOUT, stats: Optional[LoadStats] = None,
              t0: Optional[float] = None) -> Dict[str, Any]:
    """The load every buffer shares: open path on the mount, read its header,
    allocate(h) the buffer for the data section (it returns the buffer, with
    a size, and the vendor handle that registers it), register it, read every
    tensor in one batch, deregister, and return tensors(buf, h).

    release(buf) lets the buffer go: when the load ends, unless it timed out;
    then once the abandoned batch is over and the file's close has released
    the registration (until then the buffer must stay mapped). t0 is when
    the load started, for stats.seconds (default: now)."""
    if t0 is None:
        t0 = time.perf_counter()
    f = PhxFile(path)
    buf: Any = None
    abandoned = False
    try:
        h = read_header(f.fd)
        buf, handle = allocate(h)
        reg = f.register(vendor, device, handle, buf.size)
        if stats is not None:
            stats.transport = reg.transport_name
        keep = [buf]

        def abandon() -> None:
            f.close()  # releases the registration; then the memory may go
            while keep:
                release(keep.pop())

        try:
            load_registered(f, h, reg.id, chunk, timeout, stats, on_abandon=abandon)
        except TimeoutError:
            abandoned = True
            raise
        f.deregister(reg.id)
        out = tensors(buf, h)
        if stats is not None:
            stats.path = os.fspath(path)
            stats.seconds = time.perf_counter() - t0
        return out
    finally:
        if not abandoned:
            f.close()
            if buf is not None:
                release(buf)


def load_safetensors_emu(path: Union[str, os.PathLike], device: int = 0, chunk: int = DEFAULT_CHUNK,
                         timeout: Optional[float] = DEFAULT_TIMEOUT,
                         stats: Optional[LoadStats] = None) -> Dict[str, bytes]:
    """The same load into the emulated device (a mount started with --vendor
    emu); returns each tensor's raw bytes, for tests without a GPU."""

    def allocate(h: Header) -> Tuple[EmuBuffer, bytes]:
        buf = EmuBuffer(h.data_len, device)
        return buf, buf.handle()

    def tensors(buf: EmuBuffer, h: Header) -> Dict[str, bytes]:
        return {t.name: bytes(buf.view[t.begin:t.end]) for t in h.tensors}

    return load_via(path, abi.VENDOR_EMU, device, allocate, tensors, EmuBuffer.close,
                     chunk, timeout, stats)

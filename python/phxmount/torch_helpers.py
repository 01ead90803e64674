"""PyTorch helpers: register a tensor's CUDA memory with the mount, read a
file range into it, load a safetensors file into GPU tensors in one batch,
and say honestly whether (and how) a path can be loaded that way.

torch is imported inside the functions: available() works without it."""

from __future__ import annotations

import errno
import os
import time
import weakref
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple, Union

from . import abi, cuda
from .client import PhxError, PhxFile, phx_info_xattr
from .loader import DEFAULT_TIMEOUT, LoadStats, load_into
from .safetensors import DEFAULT_CHUNK, DTYPE_SIZES, Header, TensorInfo

PAGE = 64 << 10  # registrations: a multiple of the device page (INFO page_size)

_TORCH_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
    "U16": "uint16", "U32": "uint32", "U64": "uint64", "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
}


def torch_dtype(st_dtype: str):
    import torch
    dt = getattr(torch, _TORCH_DTYPES.get(st_dtype, "?"), None)
    if dt is None:
        raise TypeError(f"safetensors dtype {st_dtype} has no torch {torch.__version__} dtype")
    return dt


# --- availability -------------------------------------------------------------

@dataclass
class Availability:
    ok: bool  # a load of this path lands in GPU memory through phxmount
    reason: str
    on_mount: bool = False
    vendor: str = ""
    transport: str = ""  # what a registration gets now: direct, host, staged
    transport_why: str = ""
    engine: str = ""
    workers: int = 0
    bounce_size: int = 0
    passthrough: bool = False
    cuda_error: Optional[str] = None
    info: Optional[abi.Info] = None
    xattr: Dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return ("available: " if self.ok else "NOT available: ") + self.reason


def available(path: Union[str, os.PathLike], device: int = 0) -> Availability:
    """Is path on a phxmount mount, with an NVIDIA device, and a CUDA driver
    here? Asks the daemon (INFO ioctl, user.phx.info) rather than guessing,
    and reports the transport a load would take."""
    try:
        f = PhxFile(path)
    except OSError as e:
        return Availability(False, f"cannot open {os.fspath(path)}: {e.strerror}")
    try:
        try:
            info = f.info(device)
        except PhxError as e:
            if e.errno in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
                return Availability(False, f"{os.fspath(path)} is not on a phxmount mount "
                                           f"(the INFO ioctl got {errno.errorcode.get(e.errno, e.errno)})")
            if e.errno == errno.ENODEV:
                return Availability(False, f"the mount has no device {device}", on_mount=True)
            return Availability(False, f"INFO ioctl failed: {e}", on_mount=True)
    finally:
        f.close()
    try:
        x = phx_info_xattr(path)
    except OSError:
        x = {}
    a = Availability(False, "", on_mount=True, vendor=info.vendor, transport=info.transport_name,
                     transport_why=x.get("transport_why", ""), engine=info.engine, workers=info.workers,
                     bounce_size=info.bounce_size, passthrough=info.passthrough, info=info, xattr=x)
    if info.vendor != "nvidia":
        a.reason = (f"the mount's device is {info.vendor!r}, not an NVIDIA GPU: its buffers are not GPU memory "
                    f"(start phxmount with --vendor nvidia on a machine with a GPU)")
        return a
    a.cuda_error = cuda.driver_error()
    if a.cuda_error:
        a.reason = f"the mount serves NVIDIA GPUs but this process has no CUDA driver: {a.cuda_error}"
        return a
    how = {"kmod": "GPU-direct DMA through the phxfs kernel module",
           "staged": "pinned host bounce buffers and host-to-device copies (no kernel module: not GPU-direct)",
           "host": "host-addressable device memory"}.get(info.transport_name, info.transport_name)
    a.ok = True
    a.reason = (f"{info.device_name or 'GPU'} {device} ({info.pci_address}) through phxmount, transport "
                f"{info.transport_name}: {how}; engine {info.engine}, {info.workers} workers"
                + (f", bounce {info.bounce_size >> 20} MiB" if info.transport_name == "staged" else ""))
    return a


# --- GPU memory ---------------------------------------------------------------

class GpuAllocation:
    """A cuMemAlloc'd region (a multiple of 64 KiB) exposed to torch through
    __cuda_array_interface__; freed when the last tensor on it is gone."""

    def __init__(self, device: int, size: int):
        self.device = device
        self.size = max(PAGE, (size + PAGE - 1) // PAGE * PAGE)
        drv = cuda.driver()
        self.ptr = drv.mem_alloc(device, self.size)
        self._fin = weakref.finalize(self, drv.mem_free, device, self.ptr)

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.ptr, False), "version": 3, "strides": None}

    def tensor(self):
        """A uint8 tensor over the whole allocation (zero copy; it keeps the
        allocation alive)."""
        import torch
        t = torch.as_tensor(self, device=f"cuda:{self.device}")
        if t.data_ptr() != self.ptr:
            raise RuntimeError("torch copied the allocation instead of wrapping it")
        return t


@dataclass
class TensorRegistration:
    file: PhxFile
    id: int
    transport: str
    device: int
    base: int  # the allocation's device address
    size: int  # bytes registered from base
    offset: int  # the tensor's first byte, from base

    def close(self) -> None:
        self.file.deregister(self.id)


def _device_of(tensor) -> int:
    if tensor.device.type != "cuda":
        raise ValueError(f"tensor is on {tensor.device}, not a CUDA device")
    return tensor.device.index if tensor.device.index is not None else 0


def register_tensor(f: PhxFile, tensor) -> TensorRegistration:
    """Registers the CUDA allocation holding tensor's storage (torch's
    caching-allocator segment, found with cuMemGetAddressRange) with the
    mount: the allocation's base, 64 KiB-aligned, rounded down to 64 KiB.
    Register an allocation once at a time: the daemon imports it through
    CUDA IPC. tensor must be contiguous."""
    if not tensor.is_contiguous():
        raise ValueError("tensor must be contiguous")
    dev = _device_of(tensor)
    drv = cuda.driver()
    ptr = tensor.data_ptr()
    base, size = drv.address_range(dev, ptr)
    if base % PAGE:
        raise ValueError(f"the allocation at {base:#x} is not 64 KiB aligned")
    reg_size = size // PAGE * PAGE
    offset = ptr - base
    nbytes = tensor.numel() * tensor.element_size()
    if reg_size == 0 or offset + nbytes > reg_size:
        raise ValueError(f"tensor [{offset}, +{nbytes}) does not lie in the 64 KiB-rounded allocation of {size} bytes")
    r = f.register(abi.VENDOR_NVIDIA, dev, drv.ipc_handle(dev, base), reg_size)
    return TensorRegistration(f, r.id, r.transport_name, dev, base, reg_size, offset)


def read_into(tensor, path: Union[str, os.PathLike, PhxFile], file_offset: int = 0, length: Optional[int] = None,
              chunk: int = DEFAULT_CHUNK, timeout: Optional[float] = DEFAULT_TIMEOUT) -> int:
    """Reads length bytes (default: the tensor's size) of the file at
    file_offset into the tensor's bytes; returns the bytes read (fewer only
    at end of file)."""
    nbytes = tensor.numel() * tensor.element_size()
    length = nbytes if length is None else length
    if not 0 <= length <= nbytes:
        raise ValueError(f"length {length} does not fit a tensor of {nbytes} bytes")
    f = path if isinstance(path, PhxFile) else PhxFile(path)
    abandoned = False
    try:
        reg = register_tensor(f, tensor)
        try:
            ext = [abi.Extent(reg.id, reg.offset + o, min(chunk, length - o), file_offset + o)
                   for o in range(0, length, chunk)]
            groups = [ext[i:i + abi.MAX_EXTENTS] for i in range(0, len(ext), abi.MAX_EXTENTS)]
            for g in groups:
                try:
                    f.batch_read_all(g, timeout=timeout, on_abandon=(lambda: f.close()) if f is not path else None)
                except TimeoutError:
                    abandoned = True
                    raise
                except PhxError as e:
                    if e.errno != errno.EIO:  # EIO here is a short extent: end of file
                        raise
            total = 0
            for e in ext:
                if e.result < 0:
                    raise PhxError(-e.result, f"phx read {f.path}: {os.strerror(-e.result)}")
                total += e.result
                if e.result < e.length:
                    break
            return total
        finally:
            if not abandoned:
                reg.close()
    finally:
        if f is not path and not abandoned:
            f.close()


def _tensor_view(base, t: TensorInfo):
    import torch
    dt = torch_dtype(t.dtype)
    raw = base[t.begin:t.end]
    if t.begin % DTYPE_SIZES[t.dtype]:
        raw = raw.clone()  # torch views need element-aligned storage offsets
    return raw.view(dt).reshape(t.shape)


def load_safetensors(path: Union[str, os.PathLike], device: int = 0, chunk: int = DEFAULT_CHUNK,
                     timeout: Optional[float] = DEFAULT_TIMEOUT, stats: Optional[LoadStats] = None) -> Dict[str, "object"]:
    """Loads every tensor of a safetensors file on a phxmount mount into GPU
    memory in ONE batch: one allocation for the data section, one CUDA IPC
    registration, every tensor's extent cut at chunk bytes and submitted as
    BATCH ioctls (409 extents each), a timeout for the whole file. Returns
    {name: tensor} with the file's dtypes and shapes (views of the one
    allocation, as safetensors' own loader shares its mmap)."""
    import torch
    t0 = time.perf_counter()
    torch.cuda.init()

    def allocate(h: Header) -> Tuple[GpuAllocation, bytes]:
        alloc = GpuAllocation(device, h.data_len)
        return alloc, cuda.driver().ipc_handle(device, alloc.ptr)

    def tensors(alloc: GpuAllocation, h: Header) -> Dict[str, "object"]:
        base = alloc.tensor()
        return {t.name: _tensor_view(base, t) for t in h.tensors}

    # Nothing to release: the tensors are views that keep the allocation
    # alive, and an abandoned load's is freed once nothing refers to it.
    return load_into(path, abi.VENDOR_NVIDIA, device, allocate, tensors, lambda alloc: None,
                     chunk, timeout, stats, t0=t0)

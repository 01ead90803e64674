"""PyTorch helpers: say honestly whether (and how) a path can be loaded
into GPU memory through phxmount, map safetensors dtypes to torch's,
register a tensor's CUDA memory with the mount, read a file range into it.
The loaders are in torch_load.py.

torch is imported inside the functions: available() works without it."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import Dict, Optional, Union

from . import abi, cuda
from .client import PhxError, PhxFile, phx_info_xattr
from .loader import DEFAULT_TIMEOUT
from .safetensors import DEFAULT_CHUNK

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


def st_dtype(torch_dt) -> str:
    """The safetensors name of a torch dtype."""
    name = str(torch_dt).rsplit(".", 1)[-1]
    for k, v in _TORCH_DTYPES.items():
        if v == name:
            return k
    raise TypeError(f"torch dtype {torch_dt} has no safetensors dtype")


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
    fallback: str = ""  # how safe_open reads the file instead, where it is not ok
    mount_device: int = 0  # the mount's index of the device (INFO, REGISTER)
    info: Optional[abi.Info] = None
    xattr: Dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        s = ("available: " if self.ok else "NOT available: ") + self.reason
        return s + (f"; reading with {self.fallback} instead" if self.fallback else "")


def _mount_info(f: PhxFile, path, device: int):
    """(INFO of the mount's device serving this process's device, its
    index in the mount), or an Availability saying why not. On an NVIDIA
    mount the index is found by PCI address: CUDA ordinals are the
    process's own (CUDA_VISIBLE_DEVICES renumbers GPUs)."""
    try:
        info = f.info(0)
    except PhxError as e:
        if e.errno in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
            return Availability(False, f"{os.fspath(path)} is not on a phxmount mount "
                                       f"(the INFO ioctl got {errno.errorcode.get(e.errno, e.errno)})")
        return Availability(False, f"INFO ioctl failed: {e}", on_mount=True)
    try:
        idx = device
        if info.vendor == "nvidia" and cuda.driver_error() is None:
            idx = f.device_by_pci(cuda.driver().pci_bus_id(device))
        return (info if idx == 0 else f.info(idx)), idx
    except PhxError as e:
        if e.errno == errno.ENODEV:
            return Availability(False, f"the mount serves no device of this process's device {device}: {e.strerror}",
                                on_mount=True)
        return Availability(False, f"INFO ioctl failed: {e}", on_mount=True)
    except cuda.CudaError as e:
        return Availability(False, f"CUDA device {device}: {e}", on_mount=True)


def available(path: Union[str, os.PathLike], device: int = 0) -> Availability:
    """Is path on a phxmount mount, with an NVIDIA device, and a CUDA driver
    here? Asks the daemon (INFO ioctl, user.phx.info) rather than guessing,
    and reports the transport a load would take. device is this process's
    CUDA ordinal; mount_device in the answer is the mount's index of it."""
    try:
        f = PhxFile(path)
    except OSError as e:
        return Availability(False, f"cannot open {os.fspath(path)}: {e.strerror}")
    try:
        r = _mount_info(f, path, device)
    finally:
        f.close()
    if isinstance(r, Availability):
        return r
    info, idx = r
    try:
        x = phx_info_xattr(path)
    except OSError:
        x = {}
    a = Availability(False, "", on_mount=True, vendor=info.vendor, transport=info.transport_name,
                     transport_why=x.get("transport_why", ""), engine=info.engine, workers=info.workers,
                     bounce_size=info.bounce_size, passthrough=info.passthrough, info=info, xattr=x, mount_device=idx)
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
    a.reason = (f"{info.device_name or 'GPU'} cuda:{device} (the mount's device {idx}, {info.pci_address}) through "
                f"phxmount, transport {info.transport_name}: {how}; engine {info.engine}, {info.workers} workers"
                + (f", bounce {info.bounce_size >> 20} MiB" if info.transport_name == "staged" else ""))
    return a


# --- GPU memory ---------------------------------------------------------------

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


def register_tensor(f: PhxFile, tensor) -> TensorRegistration:
    """Registers the CUDA allocation holding tensor's storage with the
    mount, outside the registration cache: the caller deregisters it (close)
    or closing f does. Loads use the cache instead (torch_mem); do not
    register an allocation that the cache holds too. tensor must be
    contiguous."""
    from .torch_mem import device_index, mount_device, tensor_alloc
    if not tensor.is_contiguous():
        raise ValueError("tensor must be contiguous")
    dev, a = device_index(tensor), tensor_alloc(tensor)
    reg_size = a.size // PAGE * PAGE
    offset = tensor.data_ptr() - a.base
    nbytes = tensor.numel() * tensor.element_size()
    if a.base % PAGE or reg_size == 0 or offset + nbytes > reg_size:
        raise ValueError(f"tensor [{offset}, +{nbytes}) does not lie in the 64 KiB-aligned, 64 KiB-rounded "
                         f"allocation {a.base:#x}+{a.size}")
    r = f.register(abi.VENDOR_NVIDIA, mount_device(f"/proc/self/fd/{f.fd}", dev), a.export(), reg_size)
    return TensorRegistration(f, r.id, r.transport_name, dev, a.base, reg_size, offset)


def read_into(tensor, path: Union[str, os.PathLike, PhxFile], file_offset: int = 0, length: Optional[int] = None,
              chunk: int = DEFAULT_CHUNK, timeout: Optional[float] = DEFAULT_TIMEOUT) -> int:
    """Reads length bytes (default: the tensor's size) of the file at
    file_offset into the tensor's bytes; returns the bytes read (fewer only
    at end of file). The tensor's allocation is registered through the
    mount's cache (once for all reads into it)."""
    import torch
    from .torch_mem import cuda_cache, device_index, locate_tensor
    nbytes = tensor.numel() * tensor.element_size()
    length = nbytes if length is None else length
    if not 0 <= length <= nbytes:
        raise ValueError(f"length {length} does not fit a tensor of {nbytes} bytes")
    f = path if isinstance(path, PhxFile) else PhxFile(path)
    try:
        dev = device_index(tensor)
        torch.cuda.synchronize(dev)
        buf_id, off = locate_tensor(cuda_cache(f"/proc/self/fd/{f.fd}", dev), tensor)
        ext = [abi.Extent(buf_id, off + o, min(chunk, length - o), file_offset + o) for o in range(0, length, chunk)]
        for i in range(0, len(ext), abi.MAX_EXTENTS):
            try:  # on a timeout, tensor stays referenced until the batch is over
                f.batch_read_all(ext[i:i + abi.MAX_EXTENTS], timeout=timeout, on_abandon=lambda t=tensor: None)
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
        if f is not path:
            f.close()


def load_safetensors(*args, **kw):
    """See torch_load.load_safetensors."""
    from .torch_load import load_safetensors as load
    return load(*args, **kw)

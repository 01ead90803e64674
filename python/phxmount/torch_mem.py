"""torch tensors as the fetch engine's destinations (fetch.py), and their
registrations with the mount (register_tensor, register_tensors, and
read_into, a byte range of a file into a tensor). Kept thin: the planning, batching and
waiting are torch-free and tested on the emulated device.

A tensor's memory is registered whole-allocation at a time: the CUDA
allocation holding it (for torch, a segment of its caching allocator) is
found with cuPointerGetAttributes (RANGE_START_ADDR, RANGE_SIZE,
BUFFER_ID) and registered once through the mount's RegCache; later loads
into any tensor of that segment reuse the registration, and a segment that
torch freed and whose address came back as another allocation has another
BUFFER_ID, so it is registered afresh.

Backends (see fetch.py for the protocol):
* CudaBackend (owned=True): each request in its own torch.empty;
* ArenaBackend (owned=False): one torch.empty for a whole load, views;
* GivenBackend: the caller's tensors (load_into);
* HostTorchBackend: off a mount, pread into (pinned) host memory, then a
  copy to the device.
"""

from __future__ import annotations

import ctypes
import errno
import os
import weakref
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple, Union

from . import abi, cuda
from .client import PhxError, PhxFile
from .dtypes import torch_dtype
from .hostbackends import HostMemory
from .loader import DEFAULT_TIMEOUT
from .regcache import PAGE, Alloc, RegCache, cache_for, mount_root
from .stformat import DEFAULT_CHUNK
from .slicing import Plan

ALIGN = 256  # sub-allocations of an arena start at multiples of this
LARGE_BLOCK = 1 << 20  # torch's caching allocator takes larger blocks from its large pool
# How often a load's requests let go of registrations of freed memory: a
# stale registration is never used (the cache checks an allocation's
# identity at every lookup), it only holds the daemon's import a moment
# longer.
PRUNE_EVERY = 0.25
RECENT = 8  # allocations CudaBackend.locate remembers


def device_index(tensor) -> int:
    if tensor.device.type != "cuda":
        raise ValueError(f"tensor is on {tensor.device}, not a CUDA device")
    return tensor.device.index if tensor.device.index is not None else 0


def tensor_alloc(tensor) -> Alloc:
    """The CUDA allocation holding tensor's first byte."""
    dev, ptr, drv = device_index(tensor), tensor.data_ptr(), cuda.driver()
    pi = drv.pointer_info(dev, ptr)
    if pi.buffer_id == 0 or pi.memory_type != cuda.CU_MEMORYTYPE_DEVICE:
        raise ValueError(f"tensor memory at {ptr:#x} is not a CUDA device allocation (memory type {pi.memory_type})")

    def export() -> bytes:
        try:
            return drv.ipc_handle(dev, pi.base)
        except cuda.CudaError as e:
            hint = "" if pi.ipc_capable else (": the driver says this memory cannot use CUDA IPC (torch's "
                                              "expandable_segments, or a memory pool?)")
            raise ValueError(f"cuIpcGetMemHandle of the allocation at {pi.base:#x} (+{pi.size}): {e}{hint}") from None

    return Alloc(pi.base, pi.size, pi.buffer_id, export)


def _probe(device: int):
    drv = cuda.driver()

    def probe(base: int) -> Optional[int]:
        try:
            pi = drv.pointer_info(device, base)
        except cuda.CudaError:
            return None
        return pi.buffer_id if pi.buffer_id and pi.base == base else None

    return probe


_mount_devices: Dict[tuple, int] = {}


def mount_device(path, device: int) -> int:
    """The mount's index of this process's CUDA device (by PCI address)."""
    root = mount_root(path)
    k = (root, os.stat(root).st_dev, device)
    if k not in _mount_devices:
        with PhxFile(root) as f:
            _mount_devices[k] = f.device_by_pci(cuda.driver().pci_bus_id(device))
    return _mount_devices[k]


def cuda_cache(path, device: int) -> RegCache:
    """The registration cache of path's mount for this process's CUDA
    device device (registered under the mount's index of that GPU)."""
    return cache_for(path, abi.VENDOR_NVIDIA, mount_device(path, device), _probe(device))


def locate_tensor(cache: RegCache, tensor) -> Tuple[int, int]:
    """(buffer id, offset) of tensor's bytes, registering their allocation
    if it is not yet."""
    return cache.locate(tensor_alloc(tensor), tensor.data_ptr(), tensor.numel() * tensor.element_size())


def register_tensors(path, tensors: Iterable) -> int:
    """Registers the allocations holding tensors with the mount of path (in
    its cache): later loads into them skip REGISTER. Returns the number of
    registrations made now."""
    made = 0
    for t in tensors:
        if t.numel() == 0:
            continue  # no memory, nothing to register
        cache = cuda_cache(path, device_index(t))
        before = cache.registered
        locate_tensor(cache, t)
        made += cache.registered - before
    return made


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


def to_tensor(mem, plan: Plan):
    """plan's result from the uint8 tensor its bytes landed in: a view when
    they are the result, else the post slice copied (owning its memory)."""
    import torch
    dt = torch_dtype(plan.dtype)
    if plan.out_bytes == 0:
        return torch.empty(plan.out_shape, dtype=dt, device=mem.device)
    post = plan.post()
    if post is None:
        if mem.dtype == dt and mem.shape == plan.out_shape:
            return mem  # allocated as the result (CudaBackend.alloc)
        return mem.view(dt).reshape(plan.out_shape)
    t = mem.view(dt).reshape(plan.temp_shape())[post]
    return t.clone(memory_format=torch.contiguous_format).reshape(plan.out_shape)


# What room() keeps free beside what it is asked for: a quarter more, and
# 2 GiB (the loader's own conversions, the caching allocator's rounding).
ROOM_MARGIN, ROOM_SPARE = 1.25, 2 << 30


class CudaBackend:
    """owned=True: each request in its own torch.empty, so a result owns
    its memory (deleting it frees it to torch's caching allocator, which
    keeps the segment and its registration for the next load)."""

    def __init__(self, device: int, cache: RegCache):
        self.device, self.cache = device, cache
        self.counts0 = (cache.registered, cache.hits, cache.register_seconds)  # for a load's stats
        self._recent: list = []  # (alloc, a weakref of a tensor inside it, its Entry), newest first: see locate
        self._torch_device = None  # torch.device of cuda:device, made at the first allocation

    def prepare(self, plans) -> None:
        import torch
        # Memory that torch hands out may have been freed with kernels still
        # queued on it; the daemon's copies do not wait for the stream.
        torch.cuda.synchronize(self.device)
        self.cache.prune(every=PRUNE_EVERY)
        self.make_room(plans)

    def room(self, nbytes: int) -> bool:
        """Whether nbytes more fit on the device with a margin (ROOM_MARGIN
        of them, and ROOM_SPARE): free memory and the blocks torch holds
        cached (from_pretrained's warm-up reserves the model's size)."""
        import torch
        free, _ = torch.cuda.mem_get_info(self.device)
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return free + cached >= nbytes * ROOM_MARGIN + ROOM_SPARE

    def make_room(self, plans) -> None:
        """One segment of torch's caching allocator for the large tensors of
        a group of requests, allocated and freed at once (as transformers'
        caching_allocator_warmup does for from_pretrained): they are cut
        from it, one cudaMalloc and one registration instead of one of
        each per tensor. Where it does not fit in one piece, nothing."""
        import torch
        big = [p.read_bytes for p in plans if p.read_bytes >= LARGE_BLOCK]
        if len(big) < 2:
            return
        try:
            torch.empty(sum(-(-n // 512) * 512 for n in big), dtype=torch.uint8, device=f"cuda:{self.device}")
        except torch.cuda.OutOfMemoryError:
            pass

    def alloc(self, plan: Plan):
        if plan.trivial and plan.out_bytes == plan.read_bytes > 0:
            # The result itself, in its dtype and shape: finish has
            # nothing to make (a view and a reshape per tensor, which a
            # file of thousands of small ones pays thousands of times).
            import torch
            return torch.empty(plan.out_shape, dtype=torch_dtype(plan.dtype), device=self.torch_device)
        return self.scratch(plan.read_bytes)

    @property
    def torch_device(self):
        """torch.device of cuda:device (made once: a name is parsed per call)."""
        if self._torch_device is None:
            import torch
            self._torch_device = torch.device("cuda", self.device)
        return self._torch_device

    def scratch(self, nbytes: int):
        import torch
        return torch.empty(nbytes, dtype=torch.uint8, device=self.torch_device)

    def locate(self, mem) -> Tuple[int, int]:
        """(buffer id, offset) of mem. The CUDA allocations of the last
        RECENT tensors located are remembered while those tensors live: a
        live tensor keeps its allocation (torch frees a segment only once
        no block of it is used), so an address inside that range is inside
        that same allocation, and the driver is not asked again (tensors
        cut from a few segments, a whole file's of them: one
        cuPointerGetAttributes a segment, not one a tensor)."""
        ptr, n = mem.data_ptr(), mem.nbytes
        for a, alive, e in self._recent:
            if a.base <= ptr and ptr + n <= a.base + a.size and alive() is not None:
                if ptr + n <= e.base + e.size and self.cache.current(e):
                    self.cache.hits += 1  # (a count for the load's stats: no lock)
                    return e.id, ptr - e.base  # cache.locate's answer, without its lock
                return self.cache.locate(a, ptr, n)
        a = tensor_alloc(mem)
        got = self.cache.locate(a, ptr, n)
        self._recent = [(a, weakref.ref(mem), self.cache.entry(a.base))] + [
            r for r in self._recent[:RECENT - 1] if r[0].base != a.base]
        return got

    def finish(self, mem, plan: Plan):
        out = to_tensor(mem, plan)
        if not plan.trivial:
            import torch
            # mem goes back to torch now: the slice must have read it before
            # a later read of the daemon lands in the same memory.
            torch.cuda.current_stream(self.device).synchronize()
        return out

    def release(self, mem) -> None:
        pass


class ArenaBackend(CudaBackend):
    """owned=False: one allocation for the whole load, results are views of
    it (as safetensors' own loader shares one mmap): one registration, and
    the memory is freed when the last view is."""

    def __init__(self, device: int, cache: RegCache):
        super().__init__(device, cache)
        self.arena, self.pos = None, 0

    def make_room(self, plans) -> None:
        pass  # the arena is the room

    def reserve(self, plans: Iterable[Plan]) -> None:
        total = sum(-(-p.read_bytes // ALIGN) * ALIGN for p in plans)
        self.arena, self.pos = self.scratch(max(total, 1)), 0

    def alloc(self, plan: Plan):
        if self.arena is None:
            raise RuntimeError("ArenaBackend.reserve(plans) first")
        m = self.arena[self.pos:self.pos + plan.read_bytes]
        self.pos += -(-plan.read_bytes // ALIGN) * ALIGN
        return m


class GivenBackend(CudaBackend):
    """load_into: the caller's tensors, one per tensor of the file."""

    def __init__(self, device: int, cache: RegCache, tensors: Dict[str, object]):
        super().__init__(device, cache)
        self.tensors = tensors

    def make_room(self, plans) -> None:
        pass  # the caller's tensors are the room

    def alloc(self, plan: Plan):
        import torch
        t = self.tensors[plan.name]
        n = t.numel() * t.element_size()
        if not t.is_contiguous() or t.device.type != "cuda" or device_index(t) != self.device:
            raise ValueError(f"{plan.name}: load_into needs contiguous tensors on cuda:{self.device}, got {t.device}")
        if n != plan.read_bytes:
            raise ValueError(f"{plan.name}: the tensor holds {n} bytes, the file's {plan.read_bytes}")
        return t.as_strided((t.numel(),), (1,)).view(torch.uint8) if n else t

    def finish(self, mem, plan: Plan):
        return self.tensors[plan.name]


class HostTorchBackend(HostMemory):
    """Off a mount: pread into host memory (pinned when the result goes to
    a GPU), then a copy to the device. Slower, and said so by available()."""

    def __init__(self, device: str, pinned: bool):
        super().__init__()
        self.device, self.pinned = device, pinned

    def new(self, nbytes: int):
        import torch
        t = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pinned)
        raw = (ctypes.c_ubyte * nbytes).from_address(t.data_ptr()) if nbytes else bytearray()
        return t, memoryview(raw).cast("B")

    def finish(self, mem, plan: Plan):
        self.release(mem)
        out = to_tensor(mem[1], plan)
        return out if self.device == "cpu" else out.to(self.device)

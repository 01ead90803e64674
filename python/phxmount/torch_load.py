"""The PyTorch loaders: safe_open (safetensors' interface), load_safetensors
(whole files, named tensors, rank shards), load_into (the caller's
tensors), iter_tensors ((name, tensor) pairs for serving engines' loader
plugins).

All run on the torch-free fetch engine (fetch.py) with a torch backend
(torch_mem.py). On a phxmount mount with an NVIDIA GPU the bytes travel
through the mount's BATCH ioctls into registered GPU memory; anywhere
else they are read with pread into pinned host memory and copied, and the
caller is told: a PhxFallbackWarning at open, and available() on the
object says how and why. Nothing falls back silently."""

from __future__ import annotations

import dataclasses
import errno
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterator, Optional, Sequence, Tuple, Union

from .batchio import BatchIO, PreadIO
from .client import PhxError
from .fetch import Fetcher, select, stream
from .safeopen import SafeOpen
from .loader import DEFAULT_TIMEOUT, LoadStats
from .stformat import DEFAULT_CHUNK, read_header
from .sharded import assign_devices, shard_files
from .availability import Availability, known
from .torch_mem import ArenaBackend, CudaBackend, GivenBackend, HostTorchBackend, cuda_cache, device_index

PathLike = Union[str, os.PathLike]


class PhxFallbackWarning(UserWarning):
    """A load that does not go through phxmount (and why)."""


def parse_device(device) -> Tuple[str, int]:
    """("cuda", index) or ("cpu", 0) from an int, "cuda", "cuda:N", "cpu"
    or a torch.device."""
    import torch
    d = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    if d.type == "cuda":
        return "cuda", d.index if d.index is not None else torch.cuda.current_device()
    if d.type == "cpu":
        return "cpu", 0
    raise ValueError(f"device {device!r}: phxmount loads into CUDA devices (or the cpu)")


def route(path: PathLike, kind: str, index: int, fd: Optional[int] = None) -> Availability:
    """How a load of path onto the device goes (asked once per file
    system and device: availability.known); warns when not through
    phxmount. fd: a descriptor of path to ask on."""
    if kind == "cpu":
        return Availability(False, "device cpu: the bytes stay in host memory", fallback="pread into host memory")
    av = known.get(path, index, fd)
    if not av.ok:
        av = dataclasses.replace(av, fallback=f"pread into pinned host memory, then a copy to cuda:{index}")
        warnings.warn(f"phxmount: {os.fspath(path)}: {av}", PhxFallbackWarning, stacklevel=3)
    return av


def open_reader(path: PathLike, device=0, *, owned: bool = True, tensors: Optional[Dict[str, object]] = None,
                threads: int = 4, strategy: str = "auto", chunk: int = DEFAULT_CHUNK,
                timeout: Optional[float] = DEFAULT_TIMEOUT, flush_bytes: int = 512 << 20,
                availability: Optional[Availability] = None, header=None, fd: Optional[int] = None) -> SafeOpen:
    """A SafeOpen of path onto device with the torch backend the case
    needs: owned tensors, one arena (owned=False), or the caller's tensors.
    availability: what available() said of path's mount and this device,
    when the caller asked already (it is asked otherwise); header: the
    file's header, when the caller read it already; fd: a descriptor of
    path for the reads (the reader closes it, even when this fails). The
    file is opened once (an open of a file on the mount is a FUSE round
    trip): that descriptor answers the availability check, gives the
    header, and carries the reads."""
    try:
        if fd is None:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        if header is None:
            header = read_header(fd)
        kind, idx = parse_device(device)
        av = (availability if availability is not None and availability.ok and kind == "cuda"
              else route(path, kind, idx, fd))
        if av.ok:
            cache = cuda_cache(path, idx)
            backend = (GivenBackend(idx, cache, tensors) if tensors is not None
                       else CudaBackend(idx, cache) if owned else ArenaBackend(idx, cache))
            io = BatchIO(path, threads, fd=fd)
        elif tensors is not None:
            raise PhxError(errno.ENOTTY, f"load_into needs a phxmount mount with an NVIDIA GPU: {av.reason}")
        else:
            backend = HostTorchBackend("cpu" if kind == "cpu" else f"cuda:{idx}", pinned=kind == "cuda")
            io = PreadIO(path, backend.views, threads, fd=fd)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    try:
        fetcher = Fetcher(path, backend, io, chunk=chunk, timeout=timeout, flush_bytes=flush_bytes, header=header,
                          strategy="exact" if isinstance(backend, ArenaBackend) else strategy)
    except BaseException:
        io.close()
        raise
    return SafeOpen(fetcher, av)


def safe_open(path: PathLike, framework: str = "pt", device="cpu", *, backend: str = "mmap", **kw) -> SafeOpen:
    """safetensors.safe_open through phxmount: keys(), metadata(),
    get_tensor(name), get_slice(name)[...] (each request one BATCH of
    exactly the extents it covers), prefetch([...]), available(). backend
    is safetensors' ("mmap" or "pread"): accepted, and moot, as phxmount
    reads through the mount's ioctls (and pread where it falls back). kw:
    threads, strategy ("auto", "exact", "cover"), chunk, timeout, owned."""
    if backend not in ("mmap", "pread"):
        raise ValueError(f"backend {backend!r}: safetensors knows mmap and pread")
    fw = framework.lower()
    if fw in ("np", "numpy"):
        if device not in ("cpu", None):
            raise ValueError(f"framework {framework!r} loads into host memory, not {device!r}")
        from .hostbackends import open_host
        return open_host(path, **kw)
    if fw not in ("pt", "torch", "pytorch"):
        raise ValueError(f"framework {framework!r}: phxmount.safe_open supports pt and np")
    return open_reader(path, device, **kw)


def _stats(stats: Optional[LoadStats], f: SafeOpen, plans, t0: float, t1: float) -> None:
    if stats is None:
        return
    fe = f.fetcher
    stats.path, stats.bytes, stats.tensors = fe.path, fe.read_bytes, len(plans)
    stats.extents = sum(p.extents for p in plans)
    stats.ioctls = fe.io.calls
    stats.transport = f.available().transport if f.available().ok else f"{fe.io.kind} (not phxmount)"
    stats.seconds, stats.io_seconds = time.perf_counter() - t0, time.perf_counter() - t1
    stats.plans = [(p.name, p.strategy, p.why) for p in plans]
    for kind in ("exact", "cover"):
        stats.extra[kind] = sum(1 for p in plans if p.strategy == kind)
    cache = getattr(fe.backend, "cache", None)
    if cache is not None:  # what this load registered, and found registered
        reg0, hits0, secs0 = fe.backend.counts0
        stats.extra.update(registered=cache.registered - reg0, cache_hits=cache.hits - hits0, cached=len(cache),
                           register_s=cache.register_seconds - secs0)


def load_safetensors(path: PathLike, device=0, chunk: int = DEFAULT_CHUNK,
                     timeout: Optional[float] = DEFAULT_TIMEOUT, stats: Optional[LoadStats] = None, *,
                     names=None, shard=None, owned: bool = True,
                     threads: int = 4, strategy: str = "auto", flush_bytes: int = 512 << 20,
                     cover_window: int = 256 << 20, strict: bool = True) -> Dict[str, object]:
    """Loads a safetensors file's tensors (those names keeps: a collection
    or a predicate) onto device; with shard=(dim, rank, world), only rank's
    part of each tensor along dim (tensors with fewer dimensions whole),
    reading only its bytes; shard may also be a tensor-parallel plan, a
    function of (name, shape) giving each tensor's (dim, rank, world) or
    None (the whole tensor). owned=True: each tensor in its own allocation
    (freeing one frees its memory); owned=False: views of one allocation.
    Allocation and registration of each tensor overlap the reads of the
    ones before; registrations are cached for later loads. When the planner
    covers (whole rows, then a slice on the device), at most cover_window
    bytes of such reads are in flight, bounding their temporaries."""
    t0 = time.perf_counter()
    with open_reader(path, device, owned=owned, threads=threads, strategy=strategy, chunk=chunk,
                     timeout=timeout, flush_bytes=flush_bytes) as f:
        fe = f.fetcher
        plans = select(fe, names, shard, strict)
        if isinstance(fe.backend, ArenaBackend):
            fe.backend.reserve(plans)
        t1 = time.perf_counter()
        if any(p.strategy == "cover" for p in plans):  # bounds the covering reads' temporaries
            out = dict(stream(fe, plans, cover_window))
        else:
            out = {p.name: x.result() for p, x in zip(plans, fe.start(plans))}
        _stats(stats, f, plans, t0, t1)
    return out


def load_into(path: PathLike, tensors: Dict[str, object], chunk: int = DEFAULT_CHUNK,
              timeout: Optional[float] = DEFAULT_TIMEOUT, stats: Optional[LoadStats] = None, *,
              threads: int = 4, flush_bytes: int = 512 << 20) -> Dict[str, object]:
    """Fills the caller's tensors ({name: contiguous CUDA tensor of the
    file tensor's size}, one device) with the file's tensors of those
    names. Their allocations' registrations are cached: a second load into
    the same tensors sends no REGISTER (register_tensors does it ahead)."""
    t0 = time.perf_counter()
    devs = {device_index(t) for t in tensors.values()}
    if len(devs) != 1:
        raise ValueError(f"load_into: tensors on {len(devs)} devices, want one")
    with open_reader(path, devs.pop(), tensors=tensors, threads=threads, chunk=chunk, timeout=timeout,
                     flush_bytes=flush_bytes) as f:
        plans = select(f.fetcher, list(tensors))
        t1 = time.perf_counter()
        for x in f.fetcher.start(plans):
            x.result()
        _stats(stats, f, plans, t0, t1)
    return tensors


def iter_tensors(source: PathLike, device=0, *, names=None, shard=None,
                 owned: bool = True, window_bytes: int = 1 << 30, threads: int = 4,
                 timeout: Optional[float] = DEFAULT_TIMEOUT) -> Iterator[Tuple[str, object]]:
    """(name, tensor) pairs of a safetensors file or a sharded checkpoint
    (an index JSON, or a directory), in file and data order, keeping up to
    window_bytes of reads in flight ahead of the pair yielded; names and
    shard filter as in load_safetensors (an explicit name list may span
    shard files; a name in none of them is a KeyError at the end)."""
    seen = set()
    for path in shard_files(source):
        with open_reader(path, device, owned=owned, threads=threads, timeout=timeout) as f:
            plans = select(f.fetcher, names, shard, strict=False)
            for name, t in stream(f.fetcher, plans, window_bytes):
                seen.add(name)
                yield name, t
    if names is not None and not callable(names):
        missing = sorted(set(names) - seen)
        if missing:
            raise KeyError(f"{os.fspath(source)}: no tensor {missing[0]!r} in any shard file")


def load_sharded(checkpoint: PathLike, devices: Optional[Sequence[int]] = None, chunk: int = DEFAULT_CHUNK,
                 timeout: Optional[float] = None, stats: Optional[list] = None, *, names=None,
                 shard=None, owned: bool = True) -> Dict[str, "object"]:
    """Loads every shard file of a checkpoint on a phxmount mount, each onto
    its device (default: every visible GPU), in parallel threads (each
    BATCH ioctl lets go of the GIL, so the daemon serves every shard at
    once). Returns one
    {name: tensor} dict; a tensor name in two shard files is an error.
    names, shard and owned as in load_safetensors: only the named tensors,
    only this rank's part of each (an explicit name in no shard file is a
    KeyError)."""
    if devices is None:
        import torch
        devices = list(range(torch.cuda.device_count()))
    plan = assign_devices(shard_files(checkpoint), list(devices))
    keep = names if names is None or callable(names) else set(names).__contains__
    per = [LoadStats() for _ in plan]
    kw = dict(names=keep, shard=shard, owned=owned, strict=False)
    with ThreadPoolExecutor(max_workers=len(plan)) as pool:
        futures = [pool.submit(load_safetensors, f, d, chunk, DEFAULT_TIMEOUT if timeout is None else timeout, s, **kw)
                   for (f, d), s in zip(plan, per)]
        parts = [fu.result() for fu in futures]
    out: Dict[str, object] = {}
    for (f, _), part in zip(plan, parts):
        for k, v in part.items():
            if k in out:
                raise ValueError(f"tensor {k!r} is in two shards (again in {f})")
            out[k] = v
    if names is not None and not callable(names) and set(names) - set(out):
        raise KeyError(f"{os.fspath(checkpoint)}: no tensor {sorted(set(names) - set(out))[0]!r} in any shard file")
    if stats is not None:
        stats.extend(per)
    return out

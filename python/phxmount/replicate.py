"""Replicated weights: the same safetensors file on several GPUs (tensor
parallel ranks on one host that each hold every shared weight, or data
parallel replicas) without reading the file once per GPU. The file goes
through the mount onto the first device; each tensor, as soon as it has
landed, is copied GPU to GPU (over NVLink where the GPUs have it: torch
uses cudaMemcpyPeerAsync between peers) on one stream per other device,
so the peer copies overlap the reads of the tensors after it."""

from __future__ import annotations

import os
import time
from typing import Dict, List, Optional, Sequence, Union

from .fetch import select
from .loader import DEFAULT_TIMEOUT, LoadStats
from .stformat import DEFAULT_CHUNK
from .torch_load import open_reader

PathLike = Union[str, os.PathLike]


def load_replicated(path: PathLike, devices: Sequence[int], chunk: int = DEFAULT_CHUNK,
                    timeout: Optional[float] = DEFAULT_TIMEOUT, stats: Optional[LoadStats] = None, *,
                    names=None, threads: int = 4) -> List[Dict[str, object]]:
    """Loads path's tensors (those names keeps) onto every device of
    devices: read once, onto devices[0], then copied device to device.
    Returns one {name: tensor} dict per device, in devices' order; every
    tensor owns its memory. stats (of the read onto devices[0]) gets
    seconds for the whole, copies included."""
    import torch
    if not devices:
        raise ValueError("load_replicated: no devices")
    first, rest = devices[0], list(devices[1:])
    t0 = time.perf_counter()
    outs: List[Dict[str, object]] = [{} for _ in devices]
    streams = {d: torch.cuda.Stream(device=d) for d in rest}
    with open_reader(path, first, owned=True, threads=threads, chunk=chunk, timeout=timeout) as f:
        plans = select(f.fetcher, names, None, True)
        for p, pending in zip(plans, f.fetcher.start(plans)):
            t = pending.result()
            outs[0][p.name] = t
            for k, d in enumerate(rest, 1):
                with torch.cuda.device(d), torch.cuda.stream(streams[d]):
                    outs[k][p.name] = t.to(torch.device("cuda", d), non_blocking=True)
        for s in streams.values():
            s.synchronize()
        if stats is not None:
            stats.path, stats.tensors = os.fspath(path), len(plans)
            stats.bytes = f.fetcher.read_bytes
            stats.ioctls = f.fetcher.io.calls
            stats.seconds = time.perf_counter() - t0
    return outs

"""save_safetensors: GPU tensors to a safetensors file on a phxmount mount,
through BATCH_WRITE (savefile.py does the writing; this is the torch
side: validate, synchronize, find each tensor's registered memory)."""

from __future__ import annotations

import errno
import os
from typing import Dict, Optional, Union

from .client import PhxError
from .loader import DEFAULT_TIMEOUT
from .stformat import DEFAULT_CHUNK
from .savefile import SaveStats, Source, save
from .availability import known
from .dtypes import st_dtype
from .torch_mem import cuda_cache, device_index, locate_tensor


def save_safetensors(tensors: Dict[str, object], path: Union[str, os.PathLike],
                     metadata: Optional[Dict[str, str]] = None, fsync: bool = False, *, threads: int = 4,
                     chunk: int = DEFAULT_CHUNK, timeout: Optional[float] = DEFAULT_TIMEOUT,
                     stats: Optional[SaveStats] = None) -> SaveStats:
    """Writes {name: CUDA tensor} as a safetensors file at path (on a
    phxmount mount with an NVIDIA GPU), tensors in the dict's order, and
    fsyncs it when fsync. safetensors.torch.load_file reads it back equal.
    Non-contiguous tensors are made contiguous first (a copy)."""
    import torch
    items = []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names are strings, not {type(name).__name__}")
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}: save_safetensors writes CUDA tensors through the mount")
        items.append((name, t if t.is_contiguous() else t.contiguous()))
    where = os.path.dirname(os.path.abspath(os.fspath(path)))
    devs = sorted({device_index(t) for _, t in items}) or [0]
    av = known.get(where, devs[0])
    if not av.ok:
        raise PhxError(errno.ENOTTY, f"save_safetensors writes through a phxmount mount with an NVIDIA GPU: "
                                     f"{av.reason} (safetensors.torch.save_file writes anywhere)")
    for d in devs:
        torch.cuda.synchronize(d)  # the daemon's copies do not wait for torch's streams
    sources = []
    for name, t in items:
        n = t.numel() * t.element_size()
        buf_id, off = locate_tensor(cuda_cache(where, device_index(t)), t) if n else (0, 0)
        sources.append(Source(name, st_dtype(t.dtype), tuple(t.shape), n, buf_id, off))
    return save(path, sources, metadata, fsync, threads=threads, chunk=chunk, timeout=timeout,
                keep=[t for _, t in items], stats=stats)

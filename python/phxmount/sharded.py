"""Sharded checkpoints onto several GPUs: each shard file (a safetensors file
of a checkpoint split in several, as `model-00001-of-00004.safetensors`
with its `model.safetensors.index.json`) goes to its own device, and the
shards load in parallel threads (each batch ioctl releases the GIL, so the
daemon's workers serve every shard at once)."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple, Union

from .safetensors import DEFAULT_CHUNK

PathLike = Union[str, os.PathLike]


def shard_files(checkpoint: PathLike) -> List[str]:
    """The shard files of a checkpoint: an index JSON (its weight_map's
    files, in name order), a directory (its *.safetensors files), or a
    single file."""
    p = os.fspath(checkpoint)
    if os.path.isdir(p):
        idx = [n for n in sorted(os.listdir(p)) if n.endswith(".safetensors.index.json")]
        if idx:
            return shard_files(os.path.join(p, idx[0]))
        files = sorted(os.path.join(p, n) for n in os.listdir(p) if n.endswith(".safetensors"))
        if not files:
            raise FileNotFoundError(f"no .safetensors files in {p}")
        return files
    if p.endswith(".json"):
        with open(p) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{p}: no weight_map")
        base = os.path.dirname(p)
        return [os.path.join(base, n) for n in sorted(set(weight_map.values()))]
    return [p]


def assign_devices(files: Sequence[str], devices: Sequence[int]) -> List[Tuple[str, int]]:
    """Shard i goes to devices[i % len(devices)]: shards of similar size
    spread evenly, and every device gets its own files."""
    if not devices:
        raise ValueError("no devices")
    return [(f, devices[i % len(devices)]) for i, f in enumerate(files)]


def load_sharded(checkpoint: PathLike, devices: Optional[Sequence[int]] = None, chunk: int = DEFAULT_CHUNK,
                 timeout: Optional[float] = None, stats: Optional[list] = None, *, names=None,
                 shard: Optional[Tuple[int, int, int]] = None, owned: bool = True) -> Dict[str, "object"]:
    """Loads every shard file of a checkpoint on a phxmount mount, each onto
    its device (default: every visible GPU), in parallel. Returns one
    {name: tensor} dict; a tensor name in two shard files is an error.
    names, shard and owned as in load_safetensors: only the named tensors,
    only this rank's part of each (an explicit name in no shard file is a
    KeyError)."""
    from .loader import DEFAULT_TIMEOUT, LoadStats
    from .torch_load import load_safetensors
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

"""Sharded checkpoints: the shard files of a checkpoint split in several
(`model-00001-of-00004.safetensors` with its
`model.safetensors.index.json`), and which device each goes to
(torch_load.load_sharded loads them in parallel). No torch."""

from __future__ import annotations

import json
import os
from typing import List, Sequence, Tuple, Union

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

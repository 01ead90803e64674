"""A process's first copy kernel, loaded off the caller's thread.

CUDA loads a kernel the first time a process launches it (lazy module
loading, the default since CUDA 11.7). Run 71's probe
(scripts/gpu-probes/firstcopy.py, an H100, docs/gpu-notes.md) timed a
column slice of a bf16 matrix copied into a contiguous tensor at 16.1 ms
the first time and 0.13 ms the second, where a contiguous device copy
took 0.2 ms the first time (a memcpy: no kernel to load). An engine that
narrows each tensor to its rank (vLLM's row-parallel loaders) makes that
strided copy for its first column slice, and the hook makes its reverse
for a deferred tensor's packed columns: the load fell on the caller's
thread, inside a loop of some 70 ms at world 8 (run 69's trace).

So the first narrow of a deferred tensor onto a device (hook_defer: a
caller that narrows, the embedding first in vLLM's loop, before its
first column slice) has a chore thread (threadpools.soon) copy a tiny
column slice both ways in that tensor's dtype, once per process, device
and floating dtype: the kernel loads there while the caller's next reads
run. A caller that uses its tensors whole (the engines' default loop,
load_file) never narrows and loads nothing it would not use. Torch
releases the interpreter's lock inside the copies; a failure is the
chore's own (the caller's copy loads the kernel, as without this).
"""

from __future__ import annotations

import threading
from typing import Iterable, List, Set, Tuple

from . import threadpools
from .dtypes import torch_dtype

# The dtypes whose copies are warmed: what checkpoints hold and engines
# narrow (an integer or fp8 tensor is rare and small, and loads its own).
FLOATS = ("BF16", "F16", "F32")

_lock = threading.Lock()
_warmed: Set[Tuple[int, str]] = set()  # (device, safetensors dtype) handed to a chore


def warm_copies(dev: int, st_dtypes: Iterable[str]) -> List[str]:
    """Has a chore thread load cuda:dev's strided copy kernels for those
    of st_dtypes not warmed yet; returns them (in FLOATS' order)."""
    have = set(st_dtypes)
    if all((dev, d) in _warmed for d in have if d in FLOATS):
        return []  # every later narrow: no lock taken
    with _lock:
        todo = [d for d in FLOATS if d in have and (dev, d) not in _warmed]
        _warmed.update((dev, d) for d in todo)
    if todo:
        try:
            threadpools.soon(lambda: strided_copies(f"cuda:{dev}", todo))
        except RuntimeError:  # the interpreter is finalizing: nothing to gain
            pass
    return todo


def strided_copies(device: str, st_dtypes: Iterable[str]) -> list:
    """Copies a column slice of a small matrix into a contiguous one and
    back, on device, for each dtype; returns the (destination, source)
    pairs copied."""
    import torch
    done = []
    for d in st_dtypes:
        dt = torch_dtype(d)
        wide = torch.empty((8, 16), dtype=dt, device=device)
        col = torch.empty((8, 8), dtype=dt, device=device)
        for dst, src in ((col, wide[:, 8:]), (wide[:, :8], col)):
            dst.copy_(src)
            done.append((dst, src))
    return done


def forget() -> None:
    """Forgets what was warmed (tests)."""
    with _lock:
        _warmed.clear()

"""get_tensor's deferral: a tensor that an engine's loader may narrow to
its rank is returned deferred (phxmount.deferred), so only what the
caller keeps is read.

An engine loading its tensor-parallel rank takes each tensor whole and
narrows it (vLLM's column- and row-parallel loaders, vocab-parallel
embeddings, KV heads replicated past their number): stock's lazy mmap
reads only the narrowed pages, a hook that reads whole tensors reads the
world size times more. What the caller does with a tensor is learned per
role (the name without its layer and expert numbers, hook_guess.role),
shape and device, in any file, from the first operation that reads its
bytes:

* a role whose tensors were narrowed, or not seen yet, gets deferred
  tensors: a narrow reads its region as get_slice would (so the slice
  guesses of hook_guess read the next keys' regions ahead), anything else
  the rest of the tensor;
* a role whose tensors were used whole gets them as today, read ahead in
  the file's window (hook_ahead): an engine that copies every tensor into
  its parameters pays for deferral once per role.

A caller that asks for tensors without using each before the next (it
collects them: `{k: f.get_tensor(k) ...}`) would get every tensor deferred
and read one at a time when used: the first time a deferred tensor is
still untouched at the next get_tensor, the file stops deferring
(deferred tensors already handed out stay deferred and correct).
PHXMOUNT_HOOK_DEFER=0 turns deferral off. Torch is imported at first need.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Callable, Dict, Optional

from .hook_guess import RoleMemory, role

DEFER_ENV = "PHXMOUNT_HOOK_DEFER"
WHOLE, NARROW = "whole", "narrow"


def defer_enabled() -> bool:
    return os.environ.get(DEFER_ENV, "1").strip().lower() not in ("0", "off", "no", "false")


# How the tensors of each role, shape and device were last used: WHOLE or
# NARROW (in any file: the files of a checkpoint share their roles).
uses_seen = RoleMemory()


class Deferrals:
    """A file's deferral: which of its get_tensor calls return deferred
    tensors, and whether its caller collects them (then none do)."""

    def __init__(self, shapes: Dict[str, tuple], roles: Dict[str, str]):
        self.shapes, self.roles = shapes, roles  # the file's, by name (roles: hook_guess.role)
        self.on = defer_enabled()
        self.last = None  # weakref of the last deferred tensor handed out
        self.lock = threading.Lock()

    def wants(self, name: str, dev: int) -> bool:
        """Whether get_tensor(name) onto dev returns a deferred tensor."""
        with self.lock:
            if not self.on:
                return False
            t = self.last() if self.last is not None else None
            if t is not None and _untouched(t):
                self.on = False  # the caller collects tensors: stop deferring in this file
                return False
        return uses_seen.get(self.roles[name], self.shapes[name], dev) != WHOLE

    def reads_ahead(self, name: str, dev: int) -> bool:
        """Whether get_tensor's read-ahead reads name whole: only a role
        used whole (a deferred one's regions are guessed as slices)."""
        return not self.on or uses_seen.get(self.roles[name], self.shapes[name], dev) == WHOLE

    def handed(self, t) -> None:
        with self.lock:
            self.last = weakref.ref(t)


def _untouched(t) -> bool:
    from .deferred import _state_of
    st = _state_of(t)
    return st is not None and not st.told


class Source:
    """Reads a deferred tensor's regions through its hooked file: a region
    is a slice request (read_slice, with its guesses), copied into the
    tensor's storage at its place; whole, the tensor (its own request)."""

    def __init__(self, shape: tuple, read: Callable, learn: Callable):
        self.shape, self._read, self._learn = shape, read, learn

    def fill(self, dest, regions) -> None:
        for d, s, n in regions:
            if d < 0 or (d == 0 and s == 0 and n == self.shape[0]):
                dest.copy_(self._read(None))
                continue
            index = (slice(None),) * d + (slice(s, s + n),)
            dest.narrow(d, s, n).copy_(self._read(index))

    def used(self, how: tuple) -> None:
        self._learn(NARROW if how[0] == "narrow" else WHOLE)


def _storage(shape: tuple, st_dtype: str, dev: int):
    """Unread memory of a tensor's full shape and dtype on cuda:dev."""
    import torch
    from .dtypes import torch_dtype
    return torch.empty(shape, dtype=torch_dtype(st_dtype), device=f"cuda:{dev}")


def deferred_tensor(name: str, shape: tuple, st_dtype: str, dev: int, read: Callable):
    """A deferred tensor of name onto cuda:dev, its regions read by
    read(index) (index None: the whole tensor)."""
    from . import deferred
    rl = role(name)
    src = Source(shape, read, lambda use: uses_seen.learn(rl, shape, dev, use))
    return deferred.make(_storage(shape, st_dtype, dev), src)


def handing(info, dev: int, had, gpu: Callable, drop: Callable, deferrals: Deferrals):
    """info as a deferred tensor on dev for a hooked file whose reads are
    gpu(info, index, dev, held) and drop(name, held): a narrow reads its
    region as get_slice does (had: the slice guessed for it, taken by the
    first read), anything else the whole; None where one cannot be made
    (no memory for it, no torch dtype: the caller reads it now)."""
    box = [had]

    def read(index):
        h, box[0] = box[0], None
        if index is None:
            drop(info.name, h)
            return gpu(info, None, dev, None)
        return gpu(info, index, dev, h)

    try:
        t = deferred_tensor(info.name, tuple(info.shape), info.dtype, dev, read)
    except Exception:  # noqa: BLE001
        deferrals.on = False  # the file reads whole tensors (read ahead) from now on
        return None
    deferrals.handed(t)
    return t

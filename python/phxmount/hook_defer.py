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
  tensors: a narrow reads its region, anything else the rest of the
  tensor, always in place (into the deferred tensor's own storage at the
  bytes' own offsets: slicing.native_plan), so nothing is copied after
  and a covering read leaves only the tensor's own bytes behind;
* a role narrowed before has its last region read ahead: at get_tensor
  the tensor's region starts at once, and the read-ahead makes the next
  keys' deferred tensors with theirs started (held in the file's window
  at their full size, the memory they take); a narrow the guess covers
  only waits for it, one it does not reads its region now, on a thread
  of its own (batchio's urgent tasks);
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
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .deferred import Region
from .hook_guess import RoleMemory, role
from .hook_report import report

DEFER_ENV = "PHXMOUNT_HOOK_DEFER"
WHOLE, NARROW = "whole", "narrow"


def defer_enabled() -> bool:
    return os.environ.get(DEFER_ENV, "1").strip().lower() not in ("0", "off", "no", "false")


# How the tensors of each role, shape and device were last used: WHOLE or
# NARROW (in any file: the files of a checkpoint share their roles), and
# the region of the last narrow.
uses_seen = RoleMemory()
regions_seen = RoleMemory()


class Deferrals:
    """A file's deferral: which of its get_tensor calls return deferred
    tensors, and whether its caller collects them (then none do)."""

    def __init__(self, shapes: Dict[str, tuple], roles: Dict[str, str]):
        self.shapes, self.roles = shapes, roles  # the file's, by name (roles: hook_guess.role)
        self.on = defer_enabled()
        self.last = None  # weakref of the last deferred tensor handed out
        self.handed_ahead = 0  # deferred tensors handed out that the read-ahead made
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

    def region(self, name: str, dev: int) -> Optional[Region]:
        """The region the read-ahead guesses for name onto dev: its role's
        last narrow, where that role's tensors are narrowed (None: no guess)."""
        if not self.on:
            return None
        rl, shape = self.roles[name], self.shapes[name]
        if uses_seen.get(rl, shape, dev) != NARROW:
            return None
        return regions_seen.get(rl, shape, dev)

    def handed(self, t, ahead: bool = False) -> None:
        """t was handed out (ahead: made by the read-ahead, its region started)."""
        with self.lock:
            self.last = weakref.ref(t)
            self.handed_ahead += ahead


def _untouched(t) -> bool:
    from .deferred import _state_of
    st = _state_of(t)
    return st is not None and not st.told


def index_of(region: Region):
    """The get_slice index of a region (None: the whole tensor)."""
    d, s, n = region
    return None if d < 0 else (slice(None),) * d + (slice(s, s + n),)


def _covers(a: Region, b: Region) -> bool:
    return a[0] < 0 or (a[0] == b[0] and a[1] <= b[1] and b[1] + b[2] <= a[1] + a[2])


class Source:
    """A deferred tensor's reads, in place in its storage (mem: what the
    hooked file's backend locates, the storage itself on a GPU): the
    regions started ahead, and those its caller's operations need. Every
    read started into the storage is waited for before fill returns, so
    no read lands under a caller's writes, and a guessed region that the
    caller did not ask for lands the tensor's own bytes at their place:
    a wrong guess costs its bytes, never a wrong value."""

    def __init__(self, name: str, shape: tuple, dev: int, plain, mem, start: Callable, read: Callable,
                 learn: Callable):
        self.name, self.shape, self.dev, self.mem = name, shape, dev, mem
        self.at = plain.data_ptr()  # where the storage starts
        self._start, self._read, self._learn = start, read, learn
        self.pending: List[Tuple[object, Region]] = []  # (Pending, region) started, not yet waited for
        self.failed: Optional[BaseException] = None
        self.handed = False  # a fill has returned: the caller may have written into the storage

    def begin(self, regions: Sequence[Region], pends: list) -> None:
        """regions' reads were started (pends, one each)."""
        self.pending += zip(pends, regions)

    def fill(self, dest, regions) -> None:
        here = dest.data_ptr() == self.at  # else a scratch tensor (deferred: regions of several dimensions)
        todo = [r for r in regions if not any(_covers(p, r) for _, p in self.pending)] if here else []
        if todo and self.failed is None:
            try:
                # After the first fill the caller holds views it may have
                # written through: only exact reads from then on.
                self.begin(todo, self._start(self, todo, self.handed))
            except Exception as e:  # noqa: BLE001: read it the way that works
                self.failed = e
        pend, self.pending = self.pending, []
        landed = 0
        for p, _ in pend:
            try:
                p.result()
                landed += p.plan.read_bytes
            except Exception as e:  # noqa: BLE001
                self.failed = self.failed or e
        self.handed = True
        if landed:
            report.landed(self.dev, landed)
        if self.failed is not None or not here:
            self._fill_elsewhere(dest, regions)

    def _fill_elsewhere(self, dest, regions) -> None:
        """Where in-place reads fail: each region through the hooked file's
        own requests (safetensors' where phxmount cannot), copied in."""
        for r in regions:
            index = index_of(r)
            if index is None or (r[0] == 0 and r[1] == 0 and r[2] == self.shape[0]):
                dest.copy_(self._read(None))
                continue
            dest.narrow(*r).copy_(self._read(index))

    def used(self, how: tuple) -> None:
        self._learn(how)


def _storage(shape: tuple, st_dtype: str, dev: int):
    """(tensor, mem): unread memory of a tensor's full shape and dtype on
    cuda:dev, and what the backend locates (the tensor itself)."""
    import torch
    from .dtypes import torch_dtype
    t = torch.empty(shape, dtype=torch_dtype(st_dtype), device=f"cuda:{dev}")
    return t, t


def deferred_tensor(info, dev: int, start: Callable, read: Callable):
    """A deferred tensor of info onto cuda:dev and its Source: in-place
    reads by start(source, regions, exact) -> Pendings, the fall-back's by
    read(index) (index None: the whole tensor)."""
    from . import deferred
    rl, shape = role(info.name), tuple(info.shape)

    def learn(how: tuple) -> None:
        if how[0] == "narrow":
            uses_seen.learn(rl, shape, dev, NARROW)
            regions_seen.learn(rl, shape, dev, tuple(how[1:]))
        else:
            uses_seen.learn(rl, shape, dev, WHOLE)

    plain, mem = _storage(shape, info.dtype, dev)
    src = Source(info.name, shape, dev, plain, mem, start, read, learn)
    return deferred.make(plain, src), src


def handing(info, dev: int, start: Callable, gpu: Callable, deferrals: Deferrals):
    """info as a deferred tensor on dev (and its Source) for a hooked file
    whose in-place reads are start(source, regions, exact) and whose own reads
    are gpu(info, index, dev, held); None where one cannot be made (no
    memory for it, no torch dtype: the caller reads it now)."""
    try:
        t, src = deferred_tensor(info, dev, start, lambda index: gpu(info, index, dev, None))
    except Exception:  # noqa: BLE001
        deferrals.on = False  # the file reads whole tensors (read ahead) from now on
        return None
    return t, src

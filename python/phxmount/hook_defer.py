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
  tensor, into the deferred tensor's own storage: rows (one extent there)
  in place, at the bytes' own offsets (slicing.native_plan), columns
  packed as get_slice reads them and copied into place on the device
  (the daemon lands packed pieces with one copy a run of them);
* a role narrowed before has its last region guessed for its next
  tensors: the asked tensor's region starts at get_tensor, and the
  read-ahead starts the next keys' regions (packed, held in the file's
  window at their bytes; the tensor is made when asked for); a narrow
  the guesses cover only waits for them, one they do not is read now, on
  a thread of its own (batchio's urgent tasks);
* a role whose tensors were used whole gets them as today, read ahead in
  the file's window (hook_ahead): an engine that copies every tensor into
  its parameters pays for deferral once per role;
* a role not met yet, where the caller has used every role whole so far
  onto that device (at least WHOLE_PRIOR of them, none narrowed), is
  taken to be used whole too (Uses): the head that an engine meets last,
  alone in its role, is read ahead rather than inside its copy_.

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

from .deferred import Region, whole_region
from .hook_guess import GUESS_TASK, RoleMemory, role
from .hook_report import report
from .hook_warm import warm_copies

DEFER_ENV = "PHXMOUNT_HOOK_DEFER"
WHOLE, NARROW = "whole", "narrow"


# A role's scout (the first tensor of a layer's role whose use is not
# known yet) is read whole, ahead, with the keys after it, where it is at
# most this big: reading a tensor of up to 32 MiB whole costs less than
# the round trip of reading its region alone once the caller narrows it
# (about 1-2 ms on the GPU machine), and an unknown role stops the
# read-ahead until it is used (run 58: a Qwen2's first layer, 12 roles
# read one by one, took 40 ms of a 92 ms world-8 loop). Larger ones, and
# roles of one tensor (embeddings, a head: nothing after them to learn
# for), are read when used, only what is used.
SCOUT_MAX = 32 << 20


def defer_enabled() -> bool:
    return os.environ.get(DEFER_ENV, "1").strip().lower() not in ("0", "off", "no", "false")


# A caller whose first WHOLE_PRIOR roles onto a device were all used whole,
# and none narrowed, is taken to use a role it has not met yet whole too
# (Uses.guess).
WHOLE_PRIOR = 8


class Uses(RoleMemory):
    """How the tensors of each role, shape and device were last used
    (WHOLE or NARROW), and whether every role learned onto a device so far
    was used whole.

    Why the second: a role met for the first time is deferred, and a
    deferred tensor used whole is read when used, one urgent read the
    caller waits for. An engine that copies thousands of tensors whole
    meets its head last, in the last file, alone in its role: 622 MB read
    inside its copy_ (16 ms on the H100, run 63). After WHOLE_PRIOR roles
    all used whole and none narrowed, an unmet role is read ahead whole like
    the others. A loader that narrows (vLLM's, from its first tensor, the
    embedding) never gets there; one that narrows a role later than that
    gets the role's first tensor read whole: its bytes, never a wrong value."""

    def __init__(self):
        super().__init__()
        self.whole_run: Dict[int, int] = {}  # dev -> roles learned whole, or -1 once one was narrowed

    def learn(self, role: str, shape: tuple, dev: int, use) -> None:
        super().learn(role, shape, dev, use)
        with self.lock:
            run = self.whole_run.get(dev, 0)
            self.whole_run[dev] = -1 if use != WHOLE or run < 0 else run + 1

    def guess(self, role: str, shape: tuple, dev: int):
        """The use learned of role, else WHOLE where the caller used every
        role whole so far (at least WHOLE_PRIOR of them), else None."""
        use = self.get(role, shape, dev)
        if use is None and self.whole_run.get(dev, 0) >= WHOLE_PRIOR:
            return WHOLE
        return use

    def forget(self) -> None:
        super().forget()
        with self.lock:
            self.whole_run.clear()


# In any file (the files of a checkpoint share their roles); and the
# region of each role's last narrow.
uses_seen = Uses()
regions_seen = RoleMemory()


class Deferrals:
    """A file's deferral: which of its get_tensor calls return deferred
    tensors, and whether its caller collects them (then none do)."""

    def __init__(self, shapes: Dict[str, tuple], roles: Dict[str, str], nbytes: Dict[str, int]):
        self.shapes, self.roles, self.nbytes = shapes, roles, nbytes  # the file's, by name (roles: hook_guess.role)
        self.on = defer_enabled()
        self.last = None  # weakref of the last deferred tensor handed out
        self.handed_ahead = 0  # deferred tensors handed out that the read-ahead made
        self.scouts: Dict[tuple, str] = {}  # (role, shape, dev) -> the name that scouts it
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
        return uses_seen.guess(self.roles[name], self.shapes[name], dev) != WHOLE

    def reads_ahead(self, name: str, dev: int) -> bool:
        """Whether get_tensor's read-ahead reads name whole: only a role
        used whole (a deferred one's regions are guessed as slices)."""
        return not self.on or uses_seen.guess(self.roles[name], self.shapes[name], dev) == WHOLE

    def region_bytes(self, name: str, dev: int) -> Optional[int]:
        """About the bytes of name's guessed region (None: no guess): what
        the read-ahead holds for it in the window until planned."""
        r = self.region(name, dev)
        if r is None:
            return None
        full = self.nbytes[name]
        return full if r[0] < 0 else full * r[2] // max(self.shapes[name][r[0]], 1)

    def region(self, name: str, dev: int) -> Optional[Region]:
        """The region the read-ahead guesses for name onto dev: its role's
        last narrow, where that role's tensors are narrowed; the whole
        tensor where name scouts its role (scouts); None: no guess."""
        if not self.on:
            return None
        rl, shape = self.roles[name], self.shapes[name]
        use = uses_seen.guess(rl, shape, dev)
        if use is None:
            return self._scout(name, rl, shape, dev)
        if use != NARROW:
            return None
        return regions_seen.get(rl, shape, dev)

    def _scout(self, name: str, rl: str, shape: tuple, dev: int) -> Optional[Region]:
        """The whole of name where it is the first tensor of a role not used
        yet (scouts), else None."""
        if rl == name or self.nbytes[name] > SCOUT_MAX:
            return None
        key = (rl, shape, dev)
        with self.lock:
            first = self.scouts.setdefault(key, name)
        return whole_region(shape) if first == name else None

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


def _covers(a: Region, b: Region, shape: tuple) -> bool:
    """Whether region a holds region b of a tensor of shape (a whole
    tensor holds a region of any dimension)."""
    if a[0] < 0 or (a[1] == 0 and a[2] == shape[a[0]]):
        return True
    return a[0] == b[0] and a[1] <= b[1] and b[1] + b[2] <= a[1] + a[2]


class Source:
    """A deferred tensor's reads into its storage (plain; mem: what the
    hooked file's backend locates, plain itself on a GPU): the
    regions started ahead, and those its caller's operations need. Every
    read started into the storage is waited for before fill returns, so
    no read lands under a caller's writes, and a guessed region that the
    caller did not ask for lands the tensor's own bytes at their place:
    a wrong guess costs its bytes, never a wrong value."""

    def __init__(self, name: str, shape: tuple, dev: int, plain, mem, start: Callable, read: Callable,
                 learn: Callable):
        self.name, self.shape, self.dev, self.mem, self.plain = name, shape, dev, mem, plain
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
        todo = [r for r in regions if not any(_covers(p, r, self.shape) for _, p in self.pending)] if here else []
        if todo and self.failed is None:
            try:
                # After the first fill the caller holds views it may have
                # written through: only exact reads from then on.
                self.begin(todo, self._start(self, todo, self.handed))
            except Exception as e:  # noqa: BLE001: read it the way that works
                self.failed = e
        pend, self.pending = self.pending, []
        landed, at = 0, None
        for p, r in pend:
            try:
                got = p.result()
                if not p.given:  # read packed (RegionReads.start): into place on the device
                    (self.plain.narrow(*r) if r[0] >= 0 else self.plain).copy_(got)
                landed += p.plan.read_bytes
                at = max(at or 0.0, p.landed_at or 0.0) or None
            except Exception as e:  # noqa: BLE001
                self.failed = self.failed or e
        self.handed = True
        if landed:
            report.landed(self.dev, landed, at=at)
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
            warm_copies(dev, (info.dtype,))  # the copies a narrowing caller makes next (hook_warm)
            uses_seen.learn(rl, shape, dev, NARROW)
            regions_seen.learn(rl, shape, dev, tuple(how[1:]))
        else:
            uses_seen.learn(rl, shape, dev, WHOLE)

    plain, mem = _storage(shape, info.dtype, dev)
    src = Source(info.name, shape, dev, plain, mem, start, read, learn)
    return deferred.make(plain, src), src


class RegionReads:
    """A hooked file's reads for its deferred tensors (hook.HookedFile
    holds one; it reaches into the file's readers, read-ahead and window).

    The region a role's tensors were last narrowed to is guessed for its
    next tensors: the read-ahead starts each guessed region packed (as
    get_slice reads it) into memory of its own, held in the file's window
    at its bytes, and the deferred tensor is made when it is asked for,
    the guess its first pending read; the asked tensor's own guessed
    region starts at get_tensor, into its storage (in place where one
    extent, packed where pieces apart). A narrow the guesses cover only
    waits for them; one they do not is read now, urgent."""

    def __init__(self, f):
        # Weakly: the file holds this, and an unclosed file must go when
        # its caller drops it (its finalizer closes its descriptor), not
        # at the next cycle collection.
        self._f = weakref.ref(f)

    @property
    def f(self):
        return self._f()

    def make(self, info, dev: int):
        """(deferred tensor, Source) of info on dev, or None (no memory for
        it, no torch dtype: the caller reads it now, and the file stops
        deferring)."""
        f = self.f
        try:
            return deferred_tensor(info, dev, self.read_now, lambda index: f._gpu(info, index, dev, None))
        except Exception:  # noqa: BLE001
            f._defer.on = False
            return None

    def hand(self, info, dev: int, held):
        """The deferred tensor for a key the read-ahead guessed (held: its
        region's read, under way), or None where none can be made."""
        made = self.make(info, dev) if held.plan is not None else None
        if made is None:
            return None
        t, src = made
        reg, pend = held.plan
        src.begin([reg], [pend])
        self.f._defer.handed(t, ahead=True)
        return t

    def ahead_of(self, name: str, dev: int, src) -> None:
        """After get_tensor(name): the read-ahead (hook_ahead), whole
        tensors deferred to the next read and the guessed regions of the
        next keys started, with name's own (src: its deferred tensor's
        Source, where one was made), in one start."""
        f = self.f
        if src is None and name is not None and f._read_ahead.moved_on(name, f._ahead):
            return  # in order, nothing to drop, no refill due
        d = f._defer
        own = d.region(name, dev) if src is not None else None  # first: name scouts its role, not a later key
        made = f._read_ahead.after(name, dev, f._ahead, lambda k: f.defer(dev, k), f._drop,
                                   lambda k: d.reads_ahead(k, dev), lambda k: d.region_bytes(k, dev))
        items = [(src, [own])] if own is not None else []
        try:
            guesses = self._planned(made, dev)
            pends = self.start(dev, items, guesses) if items or guesses else []
        except Exception as e:  # noqa: BLE001: each tensor's first use reads it the way that works
            if src is not None:
                src.failed = e
            for k in made:
                f._drop(k, f._ahead.take(k))
            return
        if items:
            src.begin([own], pends[:1])
        for (k, reg, _), pend in zip(guesses, pends[len(items):]):
            h = f._ahead.held.get(k)
            if h is not None:
                h.plan = (reg, pend)

    def _planned(self, keys, dev: int) -> list:
        """(name, region, plan) of each key held for its guessed region,
        planned packed, its hold resized to the plan's bytes (a covering
        read takes more than the region); from the first that no longer
        has a guess or no longer fits the window, those left are dropped."""
        f, d = self.f, self.f._defer
        fetcher = f._reader(dev).fetcher if keys else None
        out = []
        for n, k in enumerate(keys):
            reg = d.region(k, dev)
            h = f._ahead.held.get(k)
            p = fetcher.plan(k, index_of(reg)) if reg is not None and h is not None else None
            if p is None or p.read_bytes - h.nbytes > f._ahead.room():
                for rest in keys[n:]:
                    f._drop(rest, f._ahead.take(rest))
                break
            f._ahead.resize(k, p.read_bytes)
            out.append((k, reg, p))
        return out

    def read_now(self, src, regions, exact: bool) -> list:
        """A deferred tensor's regions that its caller waits for (Source.fill)."""
        return self.start(src.dev, [(src, regions)], [], urgent=True, exact=exact)

    def start(self, dev: int, items, guesses, urgent: bool = False, exact: bool = False) -> list:
        """Starts, in one start, each (source, regions) read into its
        deferred tensor's storage on dev, then each (name, region, plan)
        guessed ahead, packed; the Pendings, in order. A region that is one extent
        in the storage (rows, a covering read) is read in place; one of
        many pieces apart (columns) is read packed, as get_slice reads it,
        and copied into place on the device when waited for (Source.fill):
        the daemon lands packed pieces with a copy per run of them, pieces
        apart with a copy each. exact: only the regions' own bytes in
        place (the caller may have written next to them: a covering read
        would land the file's bytes there)."""
        f = self.f
        report.asked()
        reader = f._reader(dev)
        fetcher = reader.fetcher
        plans, mems = [], []
        for s, regions in items:
            for reg in regions:
                index = index_of(reg)
                p = fetcher.plan(s.name, index, in_place=True, strategy="exact" if exact else None)
                if p.extents > 1:
                    p, mem = fetcher.plan(s.name, index), None
                else:
                    mem = s.mem
                plans.append(p)
                mems.append(mem)
        for _, _, p in guesses:
            plans.append(p)
            mems.append(None)
        if not urgent:
            # What the read-ahead deferred starts with these; an urgent
            # read goes alone (the next read starts them), or the daemon
            # would serve a window of read-ahead before the caller's read.
            f._ahead.started(f._starts.start(reader, dev, f.task))
        # Guesses go in small tasks, as get_slice's do: the next narrow
        # waits for its own region's task, not for the whole file's.
        return reader.read_in_place(plans, mems, urgent, flush_bytes=GUESS_TASK if guesses else None)

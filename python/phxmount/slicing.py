"""The read planner: which bytes of a file a tensor slice needs, as
extents. Pure Python, no torch.

An index (ints, slices with positive steps, Ellipsis, None: the basic
indexing that safetensors' get_slice passes to torch) selects, per
dimension, `count` indices from `start` by `step`. The planner enumerates
the leading L dimensions and reads, for each of their index combinations,
one piece covering the rest:

* the smallest L at which nothing is left to cut is EXACT: every byte read
  is a byte of the result (a row slice is one extent; a column slice of a
  2-D weight is one extent per row);
* a smaller L COVERS: fewer, larger extents that also read bytes between
  the wanted ones, which a slice on the device then drops (L = 0 for a
  column slice: whole rows, then a slice on the device).

choose() picks the level with the least estimated time under a CostModel
(per-extent cost and bandwidth, measured on the file system by
fetch.Fetcher) and
says why. Pieces that follow on in both the file and the destination are
coalesced (extents.coalesce).
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .extents import Cols, Run, coalesce, cut, extent_count, to_cols
from .stformat import DTYPE_SIZES, TensorInfo

STRATEGIES = ("auto", "exact", "cover")


@dataclass(frozen=True)
class Dim:
    size: int
    start: int
    count: int
    step: int

    @property
    def full(self) -> bool:
        return self.start == 0 and self.count == self.size and self.step == 1

    @property
    def span(self) -> int:
        """Indices from the first selected to the last, both included."""
        return (self.count - 1) * self.step + 1 if self.count else 0


@dataclass(frozen=True)
class Selection:
    dims: Tuple[Dim, ...]  # one per tensor dimension (an int index: count 1)
    out_shape: Tuple[int, ...]  # the result's shape (ints dropped, None inserted)

    @property
    def counts(self) -> Tuple[int, ...]:
        return tuple(d.count for d in self.dims)

    def __hash__(self) -> int:
        # Remembered: a plan's key (name, selection) is looked up several
        # times per request, and the generated hash walks every Dim.
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.dims, self.out_shape))
            object.__setattr__(self, "_hash", h)
        return h


def _as_int(x) -> int:
    if isinstance(x, bool):
        raise TypeError("a bool index is advanced indexing; phxmount slices take ints, slices, ... and None")
    try:
        return operator.index(x)
    except TypeError:
        raise TypeError(f"phxmount slices take ints, slices, Ellipsis and None (basic indexing), "
                        f"not {type(x).__name__}") from None


def _expand(items: tuple, ndim: int) -> list:
    n_ell = sum(1 for x in items if x is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    real = sum(1 for x in items if x is not None and x is not Ellipsis)
    if real > ndim:
        raise IndexError(f"too many indices for tensor of dimension {ndim}")
    out: list = []
    for x in items:
        out.extend([slice(None)] * (ndim - real) if x is Ellipsis else [x])
    if not n_ell:
        out.extend([slice(None)] * (ndim - real))
    return out


def normalize(index, shape: Sequence[int]) -> Selection:
    """The selection index makes of a tensor of this shape, with torch's
    (and numpy's) rules for basic indexing; steps must be positive."""
    items = index if isinstance(index, tuple) else (index,)
    dims: List[Dim] = []
    out: List[int] = []
    for x in _expand(items, len(shape)):
        if x is None:
            out.append(1)
            continue
        size = shape[len(dims)]
        if isinstance(x, slice):
            if x.step is not None and _as_int(x.step) <= 0:
                raise ValueError("step must be greater than zero")
            start, stop, step = x.indices(size)
            count = len(range(start, stop, step))
            dims.append(Dim(size, start if count else 0, count, step if count > 1 else 1))
            out.append(count)
            continue
        i = _as_int(x)
        if not -size <= i < size:
            raise IndexError(f"index {i} is out of bounds for dimension {len(dims)} with size {size}")
        dims.append(Dim(size, i % size if size else 0, 1, 1))
    return Selection(tuple(dims), tuple(out))


def strides(shape: Sequence[int], es: int) -> List[int]:
    st, acc = [], es
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    return st[::-1]


def exact_level(sel: Selection) -> int:
    """The smallest L whose pieces hold only wanted bytes."""
    n = len(sel.dims)
    for L in range(n):
        if sel.dims[L].step == 1 and all(d.full for d in sel.dims[L + 1:]):
            return L
    return n


def level_size(sel: Selection, es: int, L: int) -> Tuple[int, int, int]:
    """(pieces, bytes read, bytes per piece) of level L."""
    if any(d.count == 0 for d in sel.dims):
        return 0, 0, 0
    st = strides([d.size for d in sel.dims], es)
    run = es if L == len(sel.dims) else sel.dims[L].span * st[L]
    n = 1
    for d in sel.dims[:L]:
        n *= d.count
    return n, n * run, run


def level_runs(sel: Selection, es: int, L: int) -> List[Run]:
    """Level L's pieces: source offsets from the tensor's first byte,
    destinations packed from 0 in the order of the result."""
    pieces, _, run = level_size(sel, es, L)
    if pieces == 0:
        return []
    dims, st = sel.dims, strides([d.size for d in sel.dims], es)
    base = 0 if L == len(dims) else dims[L].start * st[L]
    if L == 0:
        return [Run(1, base, run, 0, run, run)]
    outer, inner, ist = dims[:L - 1], dims[L - 1], st[L - 1]
    runs: List[Run] = []
    dst = 0
    for combo in itertools.product(*(range(d.count) for d in outer)):
        src = base + inner.start * ist + sum((d.start + i * d.step) * st[k] for k, (d, i) in enumerate(zip(outer, combo)))
        runs.append(Run(inner.count, src, inner.step * ist, dst, run, run))
        dst += inner.count * run
    return coalesce(runs)


@dataclass
class CostModel:
    """Estimated seconds of a read: a cost per extent plus bytes over a
    bandwidth, and, after a covering read, the slice on the device."""
    extent_s: float = 4e-6
    bytes_per_s: float = 20e9
    slice_bytes_per_s: float = 400e9
    source: str = "defaults, not measured"

    def estimate(self, extents: int, nbytes: int, cover: bool) -> float:
        t = extents * self.extent_s + nbytes / self.bytes_per_s
        return t + (nbytes / self.slice_bytes_per_s if cover else 0.0)


def fit(k: int, small: int, t_small: float, big: int, t_big: float, what: str) -> CostModel:
    """The cost model of two measured reads: k extents of small bytes in
    t_small seconds, one extent of big bytes in t_big."""
    inv_bw = (k * t_big - t_small) / (k * (big - small)) if big > small else 0.0
    if inv_bw <= 0:
        inv_bw = t_big / big if big else 1 / CostModel.bytes_per_s
    extent = max(0.0, (t_small - k * small * inv_bw) / k)
    return CostModel(extent, 1 / inv_bw, source=f"measured: {k} x {small} B in {t_small * 1e3:.3f} ms, "
                                                 f"1 x {big} B in {t_big * 1e3:.3f} ms ({what})")


@dataclass
class Plan:
    """How one tensor (or slice of it) is read."""
    info: TensorInfo
    sel: Selection
    level: int
    exact: int  # the exact level
    runs: List[Run]
    read_bytes: int
    strategy: str  # "exact", "cover" (then a slice on the device) or "empty"
    reason: object = ""  # why: the text, or what makes it (a plan is made per request; why is read rarely)
    index: object = None  # what the caller asked for (None: the whole tensor)
    alternatives: List[Tuple[int, float]] = field(default_factory=list)  # (level, estimated s), best first
    # In place: every piece lands at its own offset in memory of the whole
    # tensor's layout (a deferred tensor's storage, native_plan), not
    # packed; what a covering read adds lands where it belongs too.
    in_place: bool = False

    @property
    def why(self) -> str:
        """Why this plan: what it reads, and the candidates' estimates."""
        if callable(self.reason):
            self.reason = self.reason()
        return self.reason

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def dtype(self) -> str:
        return self.info.dtype

    @property
    def out_shape(self) -> Tuple[int, ...]:
        return self.sel.out_shape

    @property
    def out_bytes(self) -> int:
        n = self.__dict__.get("_out_bytes")  # made once (not functools.cached_property: it locks, in 3.11)
        if n is None:
            n = DTYPE_SIZES[self.info.dtype]
            for c in self.sel.counts:
                n *= c
            self.__dict__["_out_bytes"] = n
        return n

    @property
    def key(self) -> tuple:
        """(name, selection[, "in place"]): what requests of the same bytes
        share (made once: looked up several times per request)."""
        k = self.__dict__.get("_key")
        if k is None:
            k = self.__dict__["_key"] = (self.info.name, self.sel, "in place") if self.in_place else (self.info.name, self.sel)
        return k

    @property
    def extents(self) -> int:
        return extent_count(self.runs)

    @property
    def trivial(self) -> bool:
        """The bytes read are the result, in order (in place: where they
        belong, nothing to cut)."""
        return self.level == self.exact or self.in_place

    def temp_shape(self) -> Tuple[int, ...]:
        """The shape the bytes read have (before the post slice)."""
        d, L = self.sel.dims, self.level
        if L == len(d):
            return self.sel.counts
        return self.sel.counts[:L] + (d[L].span,) + tuple(x.size for x in d[L + 1:])

    def post(self) -> Optional[tuple]:
        """The index to apply to the bytes read viewed as temp_shape(), then
        reshape to out_shape; None when they already are the result."""
        if self.trivial:
            return None
        d, L = self.sel.dims, self.level
        rest = tuple(slice(x.start, x.start + x.span, x.step) for x in d[L + 1:])
        return (slice(None),) * L + (slice(None, None, d[L].step),) + rest

    def cols(self, buf_id: int, buf_off: int, data_start: int, chunk: int, into: Cols = None) -> Cols:
        """The plan's extents into buffer buf_id from buf_off."""
        runs = self.runs
        if into is not None and len(runs) == 1 and runs[0].length <= chunk:  # a whole tensor: nothing to cut
            r = runs[0]
            into.add_run(buf_id, r.count, buf_off + r.dst, r.dst_step, r.length, data_start + self.info.begin + r.src, r.src_step)
            return into
        return to_cols(cut(runs, chunk), buf_id, buf_off, data_start + self.info.begin, into)


def describe(sel: Selection, es: int, L: int, exact: int) -> str:
    pieces, nbytes, run = level_size(sel, es, L)
    if L == exact:
        return f"exact: {pieces} extent(s) of {run} B, {nbytes} B read"
    what = "whole rows" if L == 0 and len(sel.dims) == 2 else f"whole dims {L}.. of each selected index"
    return f"{what} then slice on the device: {pieces} extent(s), {nbytes} B read"


def selects_whole(index, shape: Sequence[int]) -> bool:
    """Whether index (get_slice's) gives the whole tensor as it is: every
    dimension whole, none dropped or added (`[...]`, `[:]`, `[:, :]`:
    transformers' loader asks each tensor so)."""
    try:
        sel = normalize(index, shape)
    except (IndexError, TypeError, ValueError):
        return False
    return sel.out_shape == tuple(shape) and all(d.full for d in sel.dims)


def whole_plan(info: TensorInfo) -> Plan:
    """choose()'s plan for the whole tensor (index None), made without its
    search: one extent, the same under every cost model and strategy. A
    file of thousands of small tensors is planned tensor by tensor, so
    this is on the per-tensor path (issue 27: 2,000 tensors under 10 ms)."""
    k = (tuple(info.shape), info.dtype)
    made = _WHOLE.get(k)
    if made is None:
        made = _WHOLE[k] = _whole_parts(*k)
    sel, run, nbytes, why = made
    if run is None:
        return Plan(info, sel, 0, 0, [], 0, "empty", why, None)
    return Plan(info, sel, 0, 0, [run], nbytes, "exact", why, None, [(0, 0.0)])


# What whole_plan makes of a shape and dtype (its selection, its run
# relative to the tensor, bytes and why), made once: a MoE file's thousands
# of experts have a handful of shapes. Frozen objects, shared by plans.
_WHOLE: Dict[tuple, tuple] = {}


def _whole_parts(shape: Tuple[int, ...], dtype: str) -> tuple:
    sel = Selection(tuple(Dim(s, 0, s, 1) for s in shape), shape)
    nbytes = DTYPE_SIZES[dtype]
    for s in shape:
        nbytes *= s
    if nbytes == 0:
        return sel, None, 0, "nothing to read"
    return (sel, Run(1, 0, nbytes, 0, nbytes, nbytes), nbytes,
            f"chose {describe(sel, DTYPE_SIZES[dtype], 0, 0)}; the whole tensor, one candidate")


def _levels(info: TensorInfo, index, cost: CostModel, strategy: str, in_place: bool):
    """(selection, element size, exact level, candidates) of index: each
    level strategy allows as (estimated seconds, -level, bytes read); a
    covering read also costs its slice on the device, unless in place."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r} not in {STRATEGIES}")
    sel = normalize(() if index is None else index, info.shape)
    es = DTYPE_SIZES[info.dtype]
    ex = exact_level(sel)
    cands = []
    for L in range(ex + 1):
        pieces, nbytes, _ = level_size(sel, es, L)
        cover = L < ex
        if (strategy == "exact" and cover) or (strategy == "cover" and not cover and ex > 0):
            continue
        cands.append((cost.estimate(pieces, nbytes, cover and not in_place), -L, nbytes))
    return sel, es, ex, cands


def choose(info: TensorInfo, index, cost: CostModel, strategy: str = "auto",
           max_temp: int = 1 << 30) -> Plan:
    """The plan for index (None: the whole tensor) under the cost model;
    strategy "exact" or "cover" forces that kind when it exists."""
    sel, es, ex, cands = _levels(info, index, cost, strategy, in_place=False)
    if strategy == "auto":  # a covering read needs its bytes again as a temporary
        cands = [c for c in cands if c[2] <= max_temp or -c[1] == ex]
    est, negL, nbytes = min(cands)
    L = -negL
    if nbytes == 0:
        return Plan(info, sel, ex, ex, [], 0, "empty", "nothing to read", index)
    alts = [(-c[1], c[0]) for c in sorted(cands)]
    source = cost.source

    def why() -> str:
        cs = "; ".join(f"{describe(sel, es, lv, ex)} ~{t * 1e3:.3f} ms" for lv, t in alts)
        return f"chose {describe(sel, es, L, ex)}; candidates: {cs} [cost model: {source}]"
    return Plan(info, sel, L, ex, level_runs(sel, es, L), nbytes, "exact" if L == ex else "cover", why, index, alts)


def native_plan(info: TensorInfo, index, cost: CostModel, strategy: str = "auto") -> Plan:
    """The plan for index read in place into memory of the whole tensor's
    layout (Plan.in_place): each level's pieces land at their own offsets,
    so a covering read costs its bytes alone (no slice on the device, no
    temporary) and leaves only the tensor's own bytes behind it. strategy
    "exact" or "cover" forces that kind when it exists."""
    sel, es, ex, cands = _levels(info, index, cost, strategy, in_place=True)
    est, negL, nbytes = min(cands)
    L = -negL
    if nbytes == 0:
        return Plan(info, sel, ex, ex, [], 0, "empty", "nothing to read", index, in_place=True)
    runs = coalesce([Run(r.count, r.src, r.src_step, r.src, r.src_step, r.length) for r in level_runs(sel, es, L)])
    alts = [(-c[1], c[0]) for c in sorted(cands)]
    source = cost.source

    def said(lv: int) -> str:
        pieces, n, run = level_size(sel, es, lv)
        return f"{'exact' if lv == ex else 'covering'}: {pieces} extent(s) of {run} B in place, {n} B read"

    def why() -> str:
        cs = "; ".join(f"{said(lv)} ~{t * 1e3:.3f} ms" for lv, t in alts)
        return f"chose {said(L)}; candidates: {cs} [cost model: {source}]"
    return Plan(info, sel, L, ex, runs, nbytes, "exact" if L == ex else "cover", why, index, alts, in_place=True)


def shard_bounds(size: int, rank: int, world: int) -> Tuple[int, int]:
    """[lo, hi) of rank's part when size is split in world parts, the first
    size % world parts one longer (numpy.array_split, torch.tensor_split)."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of world {world}")
    q, r = divmod(size, world)
    lo = rank * q + min(rank, r)
    return lo, lo + q + (1 if rank < r else 0)


def shard_index(shape: Sequence[int], dim: int, rank: int, world: int) -> Optional[tuple]:
    """The index of rank's shard along dim; None (the whole tensor, the
    same on every rank) for tensors with no dimension dim."""
    if dim < 0:
        raise ValueError(f"shard dim {dim} must be >= 0")
    if len(shape) <= dim:
        shard_bounds(1, rank, world)  # checks rank and world
        return None
    lo, hi = shard_bounds(shape[dim], rank, world)
    return (slice(None),) * dim + (slice(lo, hi),)


def _random_dim(rng, size: int):
    k = rng.randrange(8)
    if k == 0 or size == 0:
        return slice(None)
    if k == 1:
        return rng.randrange(-size, size)
    a, b = sorted((rng.randrange(-size, size + 1), rng.randrange(-size, size + 1)))
    step = rng.choice((None, None, 2, 3, 7)) if k >= 5 else None
    return slice(rng.choice((a, None)) if k != 2 else a, b if k != 3 else None, step)


def random_index(rng, shape: Sequence[int]) -> tuple:
    """A random basic index of a tensor of this shape: rows, columns, ints,
    negative bounds, positive steps, sometimes Ellipsis or None."""
    idx = [_random_dim(rng, s) for s in shape]
    r = rng.random()
    if r < 0.15 and idx:
        idx = idx[:rng.randrange(len(idx))] + [Ellipsis]
    elif r < 0.25:
        idx.insert(rng.randrange(len(idx) + 1), None)
    return tuple(idx)

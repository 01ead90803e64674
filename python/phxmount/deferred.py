"""Deferred tensors: a tensor whose bytes are read when the caller first
uses them, and then only the bytes it uses.

Why. An engine loading its tensor-parallel rank takes each tensor whole
(`f.get_tensor(name)`) and keeps a part of it
(`loaded.narrow(dim, rank * n, n)`, then `param.copy_(part)`): vLLM's
column- and row-parallel loaders, vocab-parallel embeddings, KV heads
replicated across ranks. Stock safetensors hands out a lazy mmap, so only
the pages the narrow touches are ever read; a loader that reads the whole
tensor into GPU memory moves the world size times the bytes the rank
keeps, and at world 8 is slower than stock.

What a deferred tensor is. A `torch.Tensor` subclass over storage of the
tensor's full shape, dtype and device, none of its bytes read yet. Every
torch operation on it reaches `__torch_function__`, which decides by what
the operation needs:

* what reads no element (shape, dtype, device, `size()`, `dim()`,
  `numel()`, `stride()`, `is_contiguous()`, ...) is answered at once;
* `narrow(dim, start, length)`, `torch.narrow`, and indexing with slices
  of step 1 that narrows one dimension (`t[a:b]`, `t[:, a:b]`) read that
  region, into its own place in the storage, and return what stock
  returns: a plain tensor that is the same view (shape, strides, offset)
  of the same bytes;
* anything else (an arithmetic op, `copy_` from it, `torch.cat`, `.to()`,
  `.t()`, `view`, an in-place op, `nn.Parameter(t)`, printing it) first
  reads every byte not read yet, then turns the tensor into a plain
  `torch.Tensor` (its class is swapped: from then on it is one, at full
  speed, `type(t) is torch.Tensor`), then runs the operation.

So every operation gets stock's bytes, dtype, shape and device. What is
read later never overwrites what was read before (a caller may have
written into a narrowed view): only the regions not yet read are read.
The one thing a narrowed view can show that stock's cannot is the part of
the storage behind it that was never read: through `untyped_storage()`,
`as_strided` or `._base` of the view (stock's view shows the file's bytes
there). Loaders do not look there; say so where it matters.

A source reads the bytes: `fill(dest, regions)` reads the given regions of
the tensor's bytes into `dest` (a plain tensor of the full shape) at their
own places and returns when they are there; `used(how)` hears what the
first data-reading operation was (("narrow", dim, start, length) or
("whole",)), so that the hook can guess the next tensors of the same role.
"""

from __future__ import annotations

import threading
from typing import List, Optional, Sequence, Tuple

# A region of a tensor: its elements whose index along dim lies in
# [start, start + length), every other index whole.
Region = Tuple[int, int, int]

# Operations that read no element: answered on the unread storage. By name,
# as torch hands __torch_function__ a property's getter (its __self__ is
# the descriptor, named after the property) or the method itself.
_METADATA = frozenset({
    "shape", "dtype", "device", "ndim", "is_cuda", "is_cpu", "is_meta", "is_sparse", "is_quantized",
    "layout", "requires_grad", "names", "is_leaf", "grad_fn", "nbytes", "itemsize",
    "size", "dim", "ndimension", "numel", "nelement", "stride", "is_contiguous", "element_size",
    "get_device", "is_floating_point", "is_complex", "is_signed", "__len__", "type_as_str",
})
_NARROW = frozenset({"narrow"})

_cls = None
_cls_lock = threading.Lock()


def _op_name(func) -> str:
    name = getattr(func, "__name__", "")
    if name in ("__get__", "__set__"):
        owner = getattr(func, "__self__", None)
        return getattr(owner, "__name__", name) if name == "__get__" else "__set__"
    return name


def deferred_class():
    """The subclass, made at first need (the package imports without torch)."""
    global _cls
    with _cls_lock:
        if _cls is None:
            _cls = _make_class()
    return _cls


def _make_class():
    import torch

    class DeferredTensor(torch.Tensor):
        """A tensor whose bytes are read at first use (module doc)."""

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            self = args[0] if args else None
            st = _state_of(self)
            if st is not None:
                name = _op_name(func)
                if name in _METADATA and not _deferred_in(args[1:], kwargs):
                    return func(st.plain, *args[1:], **kwargs)
                region = _narrowed(name, st.plain.shape, args[1:], kwargs)
                if region is not None:
                    st.need([region])
                    return func(st.plain, *args[1:], **kwargs)
            _materialize_all(args, kwargs)
            return func(*args, **kwargs)

    _guard_parameters(torch, DeferredTensor)
    return DeferredTensor


class _State:
    """What a deferred tensor knows: its plain twin (same storage), its
    source, what is read."""

    def __init__(self, plain, source):
        self.plain, self.source = plain, source
        self.filled: List[Region] = []  # what has been read, in order
        self.told = False
        self.lock = threading.Lock()

    def need(self, regions: Sequence[Region]) -> None:
        """Reads what of regions is not read yet."""
        with self.lock:
            self._tell(("narrow",) + tuple(regions[0]))
            dims = {r[0] for r in self.filled} | {r[0] for r in regions}
            if len(dims) > 1:
                # Regions of several dimensions overlap without covering
                # each other: read all that is left, keeping what was read.
                self._complete()
                return
            todo: List[Region] = []
            for r in regions:
                todo += _subtract(r, self.filled + todo)
            self._fill(todo)

    def complete(self) -> None:
        """Reads every byte not read yet."""
        with self.lock:
            self._tell(("whole",))
            self._complete()

    def _complete(self) -> None:
        whole = whole_region(tuple(self.plain.shape))
        dims = {r[0] for r in self.filled}
        if not self.filled:
            self._fill([whole])
        elif len(dims) == 1:
            d = dims.pop()
            self._fill(_subtract((d, 0, self.plain.shape[d]), self.filled))
        else:
            self._complete_mixed(whole)
        self.filled = [whole]

    def _fill(self, regions: List[Region]) -> None:
        regions = [r for r in regions if r[2] > 0]
        if regions:
            self.source.fill(self.plain, regions)
            self.filled += regions

    def _complete_mixed(self, whole: Region) -> None:
        # Regions on several dimensions: read the whole into a scratch
        # tensor, put back what was read before (the caller may have
        # written there), and copy it in.
        import torch
        tmp = torch.empty_like(self.plain)
        self.source.fill(tmp, [whole])
        for d, s, n in self.filled:
            tmp.narrow(d, s, n).copy_(self.plain.narrow(d, s, n))
        self.plain.copy_(tmp)

    def _tell(self, how: tuple) -> None:
        if not self.told:
            self.told = True
            self.source.used(how)


def make(plain, source):
    """A deferred tensor over plain (a tensor of the full shape, dtype and
    device, its bytes not read), read through source."""
    import torch
    cls = deferred_class()
    t = torch.Tensor._make_subclass(cls, plain, False)
    t.__dict__["_phx_deferred"] = _State(plain, source)
    return t


def is_deferred(t) -> bool:
    return _state_of(t) is not None


def materialize(t):
    """t with every byte read, a plain torch.Tensor from now on (t itself)."""
    st = _state_of(t)
    if st is not None:
        st.complete()
        import torch
        t.__dict__.pop("_phx_deferred", None)
        t.__class__ = torch.Tensor
    return t


def _state_of(t) -> Optional[_State]:
    d = getattr(t, "__dict__", None)
    return d.get("_phx_deferred") if d else None


def _deferred_in(args, kwargs) -> bool:
    return any(_state_of(a) is not None for a in _flat(args, kwargs))


def _materialize_all(args, kwargs) -> None:
    for a in _flat(args, kwargs):
        if _state_of(a) is not None:
            materialize(a)


def _flat(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        elif isinstance(a, dict):
            yield from a.values()
        else:
            yield a


def whole_region(shape) -> Region:
    return (0, 0, shape[0]) if shape else (-1, 0, 1)


def _narrowed(name: str, shape, rest, kwargs) -> Optional[Region]:
    """The region an operation reads when it is a narrow, else None."""
    if kwargs:
        return None
    if name in _NARROW and len(rest) == 3:
        return _region(shape, *rest)
    if name == "__getitem__" and len(rest) == 1:
        return _sliced(shape, rest[0])
    return None


def _region(shape, dim, start, length) -> Optional[Region]:
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (dim, start, length)) or not shape:
        return None  # a tensor argument, a 0-d tensor: torch's own error or answer
    d = dim + len(shape) if dim < 0 else dim
    if not 0 <= d < len(shape):
        return None
    n = shape[d]
    s = start + n if start < 0 else start
    if not (0 <= s <= n and 0 <= length and s + length <= n):
        return None  # torch raises: let it, on the materialized tensor
    return (d, s, length)


def _sliced(shape, index) -> Optional[Region]:
    """Slices of step 1 (or full) of which at most one is not full, and no
    more of them than dimensions: a narrow."""
    items = index if isinstance(index, tuple) else (index,)
    if not shape or len(items) > len(shape) or not all(isinstance(i, slice) for i in items):
        return None
    region = None
    for d, sl in enumerate(items):
        if sl.step not in (None, 1) or not all(x is None or (isinstance(x, int) and not isinstance(x, bool))
                                               for x in (sl.start, sl.stop)):
            return None
        s, e, _ = sl.indices(shape[d])
        e = max(e, s)
        if (s, e) == (0, shape[d]):
            continue
        if region is not None:
            return None
        region = (d, s, e - s)
    return region or (0, 0, shape[0])


def _subtract(r: Region, filled: Sequence[Region]) -> List[Region]:
    """The parts of r that the filled regions (all of r's dimension) leave."""
    d, s, n = r
    gaps = [(s, s + n)]
    for _, fs, fn in filled:
        nxt = []
        for a, b in gaps:
            if fs + fn <= a or fs >= b:
                nxt.append((a, b))
                continue
            if a < fs:
                nxt.append((a, fs))
            if fs + fn < b:
                nxt.append((fs + fn, b))
        gaps = nxt
    return [(d, a, b - a) for a, b in gaps if b > a]


def _guard_parameters(torch, cls) -> None:
    """nn.Parameter(t) and nn.Buffer(t) of a deferred tensor read it first:
    they test `type(data) is torch.Tensor` before any operation reaches
    __torch_function__, and would otherwise make a plain tensor flagged as
    a parameter rather than a Parameter."""
    for name in ("Parameter", "Buffer"):
        kind = getattr(torch.nn, name, None)
        new = kind.__dict__.get("__new__") if kind is not None else None
        if new is None or getattr(new, "_phx_guard", False):
            continue
        orig = new.__func__ if isinstance(new, staticmethod) else new

        def guarded(k, data=None, *a, _orig=orig, **kw):
            if data is not None and _state_of(data) is not None:
                materialize(data)
            return _orig(k, data, *a, **kw)

        guarded._phx_guard = True
        kind.__new__ = staticmethod(guarded)

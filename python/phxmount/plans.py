"""Plans remembered (slicing's choose and native_plan): a request's plan
depends only on its tensor's shape and dtype, the index, the cost model,
the strategy and the kind, and its runs are relative to the tensor's
first byte, so the same rank's slice of every layer's tensor of one shape
is planned once for the process and given its tensor (an engine's loop
asks thousands: issue 27). Pure Python, no torch."""

from __future__ import annotations

from .slicing import CostModel, Plan, choose, native_plan
from .stformat import TensorInfo


class Plans:
    """choose()'s and native_plan()'s answers by what they depend on (the
    cost model by its figures). Only indexes of ints, int slices, None
    and Ellipsis are remembered: their repr is all there is to them.
    Threads may share one (a dict's get and set are atomic; a lost entry
    is planned again)."""

    MAX = 4096

    def __init__(self):
        self.memo: dict = {}

    def plan(self, info: TensorInfo, index, cost: CostModel, strategy: str, in_place: bool,
             max_temp: int) -> Plan:
        key = _memo_key(info, index, cost, strategy, in_place, max_temp)
        t = self.memo.get(key) if key is not None else None
        if t is None:
            t = native_plan(info, index, cost, strategy) if in_place else choose(info, index, cost, strategy, max_temp)
            if key is not None:
                if len(self.memo) >= self.MAX:
                    self.memo.clear()
                self.memo[key] = t
        if t.info is info:
            return t
        return Plan(info, t.sel, t.level, t.exact, t.runs, t.read_bytes, t.strategy, t.reason, index,
                    t.alternatives, t.in_place)


def _plain(x) -> bool:
    if x is None or x is Ellipsis or type(x) is int:
        return True
    return type(x) is slice and all(v is None or type(v) is int for v in (x.start, x.stop, x.step))


def _memo_key(info: TensorInfo, index, cost: CostModel, strategy: str, in_place: bool, max_temp: int):
    items = index if type(index) is tuple else (index,)
    if not all(_plain(x) for x in items):
        return None
    return (tuple(info.shape), info.dtype, repr(index), cost.extent_s, cost.bytes_per_s, cost.slice_bytes_per_s,
            strategy, in_place, max_temp)


PLANS = Plans()  # the process's: every file's fetchers share it

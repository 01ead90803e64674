"""safetensors.safe_open's interface over a Fetcher (fetch.py): what
torch_load.safe_open, the host backends and the hook's readers hand out.
Threads may share one: planning and starting take a lock, waiting for the
bytes does not. Pure Python, no torch."""

from __future__ import annotations

import threading
import time
from typing import Dict, Iterable, List, Optional

from .batchio import wait_all
from .fetch import Fetcher, Pending
from .slicing import Plan
from .stformat import TensorInfo


class SliceView:
    """get_slice's answer: the shape and dtype of a tensor, and its slices
    by indexing (each one request of exactly the extents it covers)."""

    def __init__(self, owner: "SafeOpen", info: TensorInfo):
        self._owner, self._info = owner, info

    def get_shape(self) -> List[int]:
        return list(self._info.shape)

    def get_dtype(self) -> str:
        return self._info.dtype

    def __getitem__(self, index):
        # [None] is a new axis (as torch reads it), not the whole tensor
        return self._owner._get(self._info.name, (None,) if index is None else index)


class SafeOpen:
    """safetensors.safe_open's interface over a Fetcher: keys(), metadata(),
    get_tensor(name), get_slice(name)[...], plus prefetch(items) and
    available() (how the bytes travel, and why). Threads may share one
    (transformers materializes tensors from a pool): planning and starting
    take a lock, waiting for the bytes does not."""

    def __init__(self, fetcher: Fetcher, availability):
        self.fetcher = fetcher
        self._availability = availability
        self._landing: Dict[tuple, List[Pending]] = {}
        self._lock = threading.Lock()
        self.served_from_prefetch = 0

    def keys(self) -> List[str]:
        return sorted(self.fetcher.tensors)

    def metadata(self) -> Optional[Dict[str, str]]:
        """The header's __metadata__: None where it has none, {} where it is
        empty (as safetensors answers)."""
        m = self.fetcher.header.metadata
        return None if m is None else dict(m)

    def available(self):
        return self._availability

    def get_tensor(self, name: str):
        return self._get(name, None)

    def get_slice(self, name: str) -> SliceView:
        return SliceView(self, self.fetcher.info(name))

    def explain(self, name: str, index=None) -> Plan:
        """The plan a request would get (what it reads, and why)."""
        return self.fetcher.plan(name, index)

    def prefetch(self, items: Iterable, flush_bytes: Optional[int] = None) -> List[Plan]:
        """Starts many requests at once: names, or (name, index) pairs;
        later get_tensor / get_slice calls for them take what landed.
        flush_bytes: in tasks of about that many bytes (Fetcher.start)."""
        with self._lock:  # planned and started at once: a request made meanwhile finds them landing
            plans = [self.fetcher.plan(*((it, None) if isinstance(it, str) else it)) for it in items]
            return self._land(plans, flush_bytes)

    def prefetch_planned(self, plans: List[Plan], flush_bytes: Optional[int] = None) -> List[Plan]:
        """prefetch of plans already made (fetcher.plan), in tasks of about
        flush_bytes (Fetcher.start)."""
        with self._lock:
            return self._land(plans, flush_bytes)

    def _land(self, plans: List[Plan], flush_bytes: Optional[int]) -> List[Plan]:
        for p, pend in zip(plans, self.fetcher.start(plans, flush_bytes=flush_bytes, ahead=True)):
            self._landing.setdefault(p.key, []).append(pend)
        return plans

    def read(self, plans: List[Plan], flush_bytes: Optional[int] = None) -> List[Pending]:
        """Starts plans for a caller that takes each result from its
        Pending (nothing is kept for a later get_planned), in tasks of
        about flush_bytes (Fetcher.start)."""
        with self._lock:
            return self.fetcher.start(plans, flush_bytes=flush_bytes)

    def read_in_place(self, plans: List[Plan], mems: list, urgent: bool = False,
                      flush_bytes: Optional[int] = None) -> List[Pending]:
        """Starts in-place plans (fetcher.plan(..., in_place=True)), each
        into its memory of the whole tensor's layout (each Pending's result
        is that memory), and plans whose mem is None as get_planned would
        (their results the slices). urgent: the caller waits for them now;
        flush_bytes: in tasks of about that many bytes (Fetcher.start)."""
        with self._lock:
            return self.fetcher.start(plans, into=mems, urgent=urgent, flush_bytes=flush_bytes)

    def drop(self, key: tuple) -> None:
        """Forgets what a prefetch of plan key started (its reads still
        hold their memory until they return: batchio.submit)."""
        with self._lock:
            self._landing.pop(key, None)

    def drop_all(self) -> None:
        """Forgets every prefetch (their reads still hold their memory
        until they return: batchio.submit)."""
        with self._lock:
            self._landing.clear()

    def wait_prefetched(self) -> None:
        """Waits until every prefetched request has landed."""
        with self._lock:
            pends = [pend for q in self._landing.values() for pend in q]
        for pend in pends:
            wait_all(pend.futures, max(0.0, pend.deadline - time.monotonic()), f"prefetch of {pend.plan.name}")

    def _get(self, name: str, index):
        return self.get_planned(self.fetcher.plan(name, index))

    def get_planned(self, p: Plan, then=None):
        """The result of plan p (from fetcher.plan): what a prefetch of it
        landed, or a request started now. then(), when given, runs once p
        is under way and before its result is waited for."""
        return self.get_planned_at(p, then)[0]

    def get_planned_at(self, p: Plan, then=None):
        """get_planned's (result, when it landed: perf_counter)."""
        with self._lock:
            q = self._landing.get(p.key)
            if q:
                pend = q.pop(0)
                if not q:
                    del self._landing[p.key]
                self.served_from_prefetch += 1
            else:
                pend = self.fetcher.start([p])[0]
        if then is not None:
            then()
        return pend.result(), pend.landed_at

    def landing(self, name: str, index=None) -> bool:
        """Whether a prefetched request for name[index] waits to be taken."""
        with self._lock:
            return self.fetcher.plan(name, index).key in self._landing

    def close(self) -> None:
        with self._lock:
            self._landing.clear()
        self.fetcher.close()

    def __enter__(self) -> "SafeOpen":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self):
        return iter(self.keys())

"""Reading planned tensors and slices, whatever the memory: the engine
under safe_open, load_safetensors, load_into and iter_tensors. Pure
Python, no torch.

A Fetcher plans each request (slicing.choose), asks its backend for the
destination memory and its registration, turns the plan into extents and
hands them to its I/O (batchio.BatchIO on a mount, PreadIO off one) in
tasks of a few BATCH ioctls, so that the next request's allocation and
registration overlap the reads already in flight. A request of up to 409
extents is one BATCH ioctl. Pending.result() waits (with the request's
deadline) and lets the backend build the result: a view, or a slice on the
device after a covering read.

A backend provides:
    alloc(plan) -> mem        the destination of plan.read_bytes bytes
    scratch(nbytes) -> mem    memory for the planner's measurement
    locate(mem) -> (id, off)  the registered buffer holding mem
    finish(mem, plan)         the result the caller gets
    release(mem)              scratch memory is no longer needed
    prepare(plans)            before a group of requests (sync, prune, and
                              room for their memory)
"""

from __future__ import annotations

import os
import threading
import time
import timeit
from collections import deque
from typing import Dict, Iterable, List, Optional, Union

from . import threadpools
from .batchio import wait_all
from .client import PhxError
from .extents import Cols, Run
from .loader import DEFAULT_TIMEOUT
from .stformat import DEFAULT_CHUNK, DTYPE_SIZES, Header, TensorInfo, read_header
from .plans import PLANS
from .slicing import CostModel, Plan, fit, level_runs, shard_index, whole_plan

MAX_EXTENTS = 409
# Requests read in the order they are consumed (stream(), the hook's
# read-ahead) go to the I/O in tasks of about this many bytes. The client's
# threads keep four tasks in flight and the daemon shares its workers among
# them, so the first request lands when its task does: with the fetcher's
# default task (flush_bytes, 512 MiB) up to 2 GiB of reads would come first,
# some 45 ms at the GPU machine's 45 GB/s, against 12 ms at 128 MiB.
IN_ORDER_TASK = 128 << 20
# A start's first task (FIRST_TASK, then twice as many bytes a task up to
# the start's task size), and the smallest of its last ones (Fetcher.task_bytes).
FIRST_TASK = 16 << 20
PROBE_MAX = 32 << 20  # bytes the planner's measurement reads at most
PROBE_MIN, PROBE_MIN_PIECES = 64 << 10, 8  # below that it would measure noise
# The measured cost model of each file system (st_dev: a mount) and I/O
# kind: what an extent and a byte cost is the storage's and the daemon's,
# not a file's, so a process measures once, not once per file (each
# measurement allocates and registers scratch memory and reads four times:
# an engine's rank loading 2-100 files would pay it in every file's first
# sharded request).
_costs: Dict[tuple, CostModel] = {}
# One measurement of a key at a time: a fetcher that comes second waits for
# the first's model (a lock per key: a stuck mount holds up only its own).
_measuring: Dict[tuple, threading.Lock] = {}
_measuring_lock = threading.Lock()
_DEFAULT_COST = CostModel()


class Pending:
    """A request in flight; result() waits for it and returns the result."""

    def __init__(self, fetcher: "Fetcher", plan: Plan, mem, deadline: float, given: bool = False):
        self.fetcher, self.plan, self.mem, self.deadline = fetcher, plan, mem, deadline
        self.given = given  # mem is the caller's (Fetcher.start's into): the result is mem itself
        self.futures: list = []
        self._done = False
        self._result = None
        self.landed_at: Optional[float] = None  # perf_counter when its last task landed, once result() returned
        self._made = time.perf_counter()  # a request of no bytes lands when made

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def result(self):
        if self._done:
            return self._result
        fs = self.futures
        try:
            if not all(f.done() for f in fs):  # (landed: no waiter to set up, per tensor of thousands)
                what = f"phx read of {self.plan.name}" + ("" if self.plan.index is None else f"[{self.plan.index}]")
                wait_all(fs, max(0.0, self.deadline - time.monotonic()), what)
            ends = [f.result() for f in fs]
        except PhxError as e:
            raise PhxError(e.errno, f"{self.plan.name}: {e.strerror}") from None
        # Landed: in the destination memory, which for a read started ahead
        # is before the caller asked (the tasks' results are their ends).
        self.landed_at = max([r for r in ends if r is not None], default=self._made)
        self._result = self.mem if self.given else self.fetcher.backend.finish(self.mem, self.plan)
        self._done, self.mem = True, None
        return self._result


class _Batch:
    """Extents gathered from requests until a task's worth is ready; left:
    bytes of the start not yet in a task, tasks: tasks made so far."""

    def __init__(self, left: int = 0):
        self.cols, self.nbytes, self.waiting = Cols(), 0, []
        self.urgent = False
        self.left, self.tasks = left, 0
        self.behind = False  # joins a full pipeline (Fetcher.task_bytes)


class Fetcher:
    def __init__(self, path: Union[str, os.PathLike], backend, io, *, chunk: int = DEFAULT_CHUNK,
                 timeout: Optional[float] = DEFAULT_TIMEOUT, strategy: str = "auto",
                 flush_bytes: int = 512 << 20, task_extents: int = 4 * MAX_EXTENTS,
                 max_temp: int = 1 << 30, header: Optional[Header] = None):
        self.path = os.fspath(path)
        self.backend, self.io = backend, io
        self.chunk, self.strategy, self.max_temp = chunk, strategy, max_temp
        self.timeout = 1e9 if timeout is None else timeout
        self.flush_bytes, self.task_extents = flush_bytes, task_extents
        self.header = header if header is not None else read_header(self.path)
        self.tensors: Dict[str, TensorInfo] = {t.name: t for t in self.header.tensors}
        st = os.stat(self.path)
        self._cost_key = (st.st_dev, getattr(io, "kind", ""))
        self._probes = 0
        self._whole: Dict[str, Plan] = {}  # whole tensors' plans, by name
        self.plans: List[Plan] = []  # every plan started, in order
        self.read_bytes = 0  # bytes requested from the I/O

    def info(self, name: str) -> TensorInfo:
        t = self.tensors.get(name)
        if t is None:
            raise KeyError(f"{self.path} has no tensor {name!r}")
        return t

    @property
    def cost(self) -> CostModel:
        """The model plans are chosen under: the one measured on this
        file's file system and I/O kind (by any fetcher), else defaults."""
        return _costs.get(self._cost_key) or _DEFAULT_COST

    @property
    def in_order_task(self) -> int:
        """The task size of requests consumed in order: IN_ORDER_TASK, or
        flush_bytes where smaller."""
        return min(self.flush_bytes, IN_ORDER_TASK)

    def plan(self, name: str, index=None, in_place: bool = False, strategy: Optional[str] = None) -> Plan:
        """The plan for a tensor (index None) or a slice of it; in_place:
        into memory of the whole tensor's layout (slicing.native_plan);
        strategy: this request's, where not the fetcher's. A whole
        tensor's is made once (it needs no cost model): a caller of
        thousands of small tensors plans each at least twice."""
        if index is None and not in_place:
            p = self._whole.get(name)
            if p is None:
                p = self._whole[name] = whole_plan(self.info(name))
            return p
        info = self.info(name)
        strategy = strategy or self.strategy
        p = self._choose(info, index, in_place, strategy)
        if (strategy == "auto" and len(p.alternatives) > 1 and self._cost_key not in _costs
                and self._probes < 3):
            with _measuring_lock:
                once = _measuring.setdefault(self._cost_key, threading.Lock())
            with once:  # fetchers of several files at once (a rank's files in threads) measure once
                measured = self._cost_key in _costs or self.calibrate(p)
            if measured:
                p = self._choose(info, index, in_place, strategy)
        return p

    def _choose(self, info: TensorInfo, index, in_place: bool, strategy: str) -> Plan:
        return PLANS.plan(info, index, self.cost, strategy, in_place, self.max_temp)

    def start(self, plans: Iterable[Plan], timeout: Optional[float] = None,
              flush_bytes: Optional[int] = None, into: Optional[list] = None,
              urgent: bool = False, ahead: bool = False) -> List[Pending]:
        """Starts every plan; the reads of the first overlap the allocation
        and registration of the next. flush_bytes: the reads go in tasks
        of about that many bytes (default the fetcher's): smaller tasks
        land the first plans sooner, larger ones cost fewer ioctls. into:
        each plan's memory, given (its Pending's result is that memory),
        or None (the backend's). urgent: a caller waits for these now: not
        behind reads started ahead (batchio: a thread of their own). ahead:
        reads ahead of the caller (a read-ahead's refill), which go in
        whole tasks where the I/O is full already (task_bytes)."""
        plans = list(plans)
        self.backend.prepare(plans if into is None else ())
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        b, out = _Batch(sum(p.read_bytes for p in plans)), []
        b.urgent = urgent
        # Reads ahead that join a full pipeline (the I/O has a task queued
        # or running for each of its threads: a read-ahead's refill behind
        # the window it holds) go in whole task sizes (task_bytes).
        b.behind = ahead and not urgent and self.io_pending() >= getattr(self.io, "threads", 4)
        # What makes the next task: its bytes, or a whole ioctl's extents
        # (_flush), looked at per plan, the size worked out per task.
        limit, te = self.task_bytes(b, flush_bytes), self.task_extents
        alloc, locate, data_start, chunk = self.backend.alloc, self.backend.locate, self.header.data_start, self.chunk
        for i, p in enumerate(plans):
            mem = into[i] if into is not None else None
            pend = Pending(self, p, alloc(p) if mem is None else mem, deadline, mem is not None)
            out.append(pend)
            self.plans.append(p)
            if p.read_bytes == 0:
                continue
            buf_id, off = locate(pend.mem)
            p.cols(buf_id, off, data_start, chunk, into=b.cols)
            b.nbytes += p.read_bytes
            b.waiting.append(pend)
            if b.nbytes >= limit or len(b.cols) >= te:
                self._flush(b, final=False, flush_bytes=flush_bytes)
                limit = self.task_bytes(b, flush_bytes)
        self._flush(b, final=True)
        return out

    def io_pending(self) -> int:
        """The I/O's tasks queued or running (0 where it cannot tell)."""
        pending = getattr(self.io, "pending", None)
        return pending() if pending is not None else 0

    def task_bytes(self, b: _Batch, flush_bytes: Optional[int] = None) -> int:
        """The bytes of b's next task: flush_bytes (the fetcher's where
        None), but the first tasks of a start smaller (FIRST_TASK, doubling:
        the reads begin after a few allocations, not a whole task's) and
        the last ones a share of what is left among the I/O's threads
        (they end together: a start's last task alone in flight moves at
        one ioctl's speed, a quarter of four's on the GPU machine). A start
        behind a full pipeline (b.behind) is neither: its first task waits
        for those queued ahead of it whatever its size, and its last ones
        do not end alone; small tasks there only add an ioctl's fixed cost
        each (run 60: a MoE engines' loop, whose read-ahead refills came in
        16-28 MiB tasks, read at 27-30 GB/s where load_file's 128 MiB tasks
        of the same files read at 42-44)."""
        t = flush_bytes or self.flush_bytes
        if b.behind:
            return t
        ramp = FIRST_TASK << min(b.tasks, 20)
        share = b.left // getattr(self.io, "threads", 4)
        return max(min(t, ramp, share), min(t, FIRST_TASK))

    def _flush(self, b: _Batch, final: bool, flush_bytes: Optional[int] = None) -> None:
        n, te = len(b.cols), self.task_extents
        whole = final or b.nbytes >= self.task_bytes(b, flush_bytes)
        upto = n if whole else n - n % te
        if upto == 0:
            return
        keep = [pend.mem for pend in b.waiting]  # held by the tasks (batchio.submit)
        for i in range(0, upto, te):
            fut = self.io.submit(b.cols.part(i, min(i + te, upto)), keep, urgent=b.urgent)
            b.tasks += 1
            for pend in b.waiting:
                pend.futures.append(fut)
        moved = b.nbytes if whole else b.cols.part(0, upto).nbytes
        self.read_bytes += moved
        b.left -= moved
        if whole:
            b.cols, b.nbytes, b.waiting = Cols(), 0, []  # (b.urgent stays)
        else:
            b.cols = b.cols.part(upto, n)
            b.nbytes = b.cols.nbytes
            b.waiting = b.waiting[-1:]  # only the last request can have extents left

    def measure_soon(self) -> bool:
        """Measures the cost model of this file's file system and I/O on a
        chore thread (threadpools.soon), where no fetcher of the process
        has measured it or is measuring it: the first plan that needs the
        model (a column slice's) then finds it made, or waits for the
        measurement under way, instead of making it on the caller's thread
        (a scratch allocation, its registration and four reads: 5 ms of
        the GPU machine's world-8 loops, run 69). The hook asks at a
        reader's open. False where nothing was started."""
        if self.strategy != "auto" or self._cost_key in _costs:
            return False
        with _measuring_lock:
            once = _measuring.setdefault(self._cost_key, threading.Lock())
        if not once.acquire(blocking=False):
            return False  # under way (a plan's, or another fetcher's)

        def run() -> None:
            try:
                if self._cost_key not in _costs:
                    self._measure_any()
            finally:
                once.release()
        try:
            threadpools.soon(run)
        except RuntimeError:  # the interpreter is finalizing
            once.release()
            return False
        return True

    def _measure_any(self) -> bool:
        """calibrate on a column slice (world 8) of the file's largest
        matrices, the first that offers a choice of reads and a probe."""
        big = sorted((t for t in self.header.tensors if len(t.shape) == 2), key=lambda t: -t.nbytes)
        for info in big:
            if self._probes >= 3:
                break
            p = self._choose(info, shard_index(info.shape, 1, 0, 8), False, "auto")
            if len(p.alternatives) > 1 and self.calibrate(p):
                return True
        return False

    def calibrate(self, plan: Plan) -> bool:
        """Measures the cost per extent and bandwidth of this file's file
        system and I/O by reading the first pieces of plan's exact
        extents, then the one extent that covers them (a few MiB at most),
        each the best of two."""
        self._probes += 1
        self.backend.prepare(())
        es = DTYPE_SIZES[plan.dtype]
        pieces = _first_pieces(level_runs(plan.sel, es, plan.exact), MAX_EXTENTS)
        while len(pieces) > 2 and pieces[-1][0] + pieces[-1][1] - pieces[0][0] > PROBE_MAX:
            pieces = pieces[:len(pieces) // 2]
        if len(pieces) < PROBE_MIN_PIECES:
            return False
        length = pieces[0][1]
        span = pieces[-1][0] + pieces[-1][1] - pieces[0][0]
        if not PROBE_MIN <= span <= 2 * PROBE_MAX or any(n != length for _, n in pieces):
            return False
        mem = self.backend.scratch(max(span, length * len(pieces)))
        buf_id, off = self.backend.locate(mem)
        base = self.header.data_start + plan.info.begin
        small, big = Cols(), Cols()
        steps = {pieces[k + 1][0] - pieces[k][0] for k in range(len(pieces) - 1)}
        if len(steps) == 1:  # one stride: one strided extent, as the plan's own reads go
            small.add_run(buf_id, len(pieces), off, length, length, base + pieces[0][0], steps.pop())
        else:
            for k, (src, n) in enumerate(pieces):
                small.add(buf_id, off + k * n, n, base + src)
        big.add(buf_id, off, span, base + pieces[0][0])
        # Held: on a chore thread (measure_soon) the file may close meanwhile.
        with self.io.held():
            t_small = min(timeit.timeit(lambda: self.io.run(small), number=1) for _ in range(2))
            t_big = min(timeit.timeit(lambda: self.io.run(big), number=1) for _ in range(2))
        self.backend.release(mem)
        _costs[self._cost_key] = fit(len(pieces), length, t_small, span, t_big,
                                     f"{os.path.basename(self.path)}: {plan.name}, {self.io.kind} I/O")
        return True

    def close(self) -> None:
        self.io.close()


def _first_pieces(runs: List[Run], k: int) -> List[tuple]:
    """(source offset, length) of the first k pieces of runs."""
    out: List[tuple] = []
    for r in runs:
        for j in range(min(r.count, k - len(out))):
            out.append((r.src + j * r.src_step, r.length))
        if len(out) >= k:
            break
    return out


def select(fetcher: Fetcher, names=None, shard=None, strict: bool = True) -> List[Plan]:
    """Plans for the tensors of fetcher's file in data order: those names
    keeps (a collection, or a predicate of the name; None: all), each
    sharded when shard is given: (dim, rank, world) for every tensor, or a
    tensor-parallel plan, a function of (name, shape) that gives a
    tensor's (dim, rank, world), or None for the whole tensor. With strict,
    a name that the file lacks is a KeyError."""
    ts = fetcher.header.tensors
    if names is not None:
        keep = names if callable(names) else set(names).__contains__
        if strict and not callable(names):
            missing = sorted(set(names) - set(fetcher.tensors))
            if missing:
                raise KeyError(f"{fetcher.path} has no tensor {missing[0]!r}"
                               + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else ""))
        ts = [t for t in ts if keep(t.name)]
    return [fetcher.plan(t.name, _shard_of(shard, t)) for t in ts]


def _shard_of(shard, t: TensorInfo):
    """The index of t's shard under shard (see select), None for all of it."""
    if shard is None:
        return None
    s = shard(t.name, tuple(t.shape)) if callable(shard) else shard
    return shard_index(t.shape, *s) if s is not None else None


def stream(fetcher: Fetcher, plans: List[Plan], window: int):
    """Yields (name, result) in plan order, keeping up to window bytes of
    requests in flight ahead of the one yielded, in tasks of
    fetcher.in_order_task."""
    q: deque = deque()
    i, inflight = 0, 0
    while i < len(plans) or q:
        group = []
        while i < len(plans) and (inflight < window or not (q or group)):
            group.append(plans[i])
            inflight += plans[i].read_bytes
            i += 1
        if group:
            q.extend(zip(group, fetcher.start(group, flush_bytes=fetcher.in_order_task)))
        p, pend = q.popleft()
        inflight -= p.read_bytes
        yield p.name, pend.result()

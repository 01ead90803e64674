"""The Python half of the GPU benchmark: one safetensors file into GPU
memory, hot and cold, every side the best of N runs of the same shape:

* phxmount load_into, registered: the tensors allocated and their memory
  registered BEFORE the clock (as the reference pipelines allocate theirs),
  then only the load is timed (the row hot_registered);
* phxmount load_safetensors end to end: header, allocation, registration
  (cached registrations reused, as in a process that loads repeatedly),
  reads and tensors (hot_end_to_end); also its first load in a fresh state
  (every allocation and registration new), for the record;
* safetensors.torch.load_file(device="cuda:0"); a read into pageable memory
  then .cuda();
* cold: each run of each side after sync + drop_caches, and only once
  mincore finds no page of the file resident (benchlib.cold_start: the
  backing file, and the file through the mount where it maps); a side
  whose file stays resident is not run, and says why.

Raw numbers to --out (JSON), progress on stdout; a stage that hangs ends
the run (exit 3) naming the stage."""

import ctypes
import os
import sys

from benchlib import NotCold, tool_args, Watchdog, best_of, cold_start, failed, record, say, warm, write_json

import phxmount  # noqa: E402
from phxmount.loader import LoadStats  # noqa: E402
from phxmount.stformat import read_header  # noqa: E402

E2E = "a phxmount ioctl (python client)"


def fresh():
    """No cached allocation nor registration: torch's cache emptied and
    the registrations of what it freed released."""
    import gc
    import torch
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    phxmount.prune_caches()


def registered(a, h, wd):
    import torch
    from phxmount.dtypes import torch_dtype
    wd.stage("hot, registered: allocate and register every tensor (untimed)", 120)
    fresh()
    tensors = {t.name: torch.empty(t.shape, dtype=torch_dtype(t.dtype), device="cuda:0") for t in h.tensors}
    made = phxmount.register_tensors(a.mount_file, tensors.values())
    torch.cuda.synchronize()
    out = []
    for i, (threads, flush) in enumerate([(a.threads, a.flush_mib)] + sweep(a.sweep)):
        wd.stage(f"hot, registered: {a.reps} loads, {threads} threads, batches of {flush or 'all'} MiB", 120)
        s = LoadStats()

        def run():
            phxmount.load_into(a.mount_file, tensors, stats=s, threads=threads, flush_bytes=(flush or 1 << 42) << 20)
            torch.cuda.synchronize()
            return f"{s.extents} extents, {s.ioctls} ioctls, {s.extra.get('registered')} registrations in the load"

        best, note = best_of(a.reps, run)
        name = "phxmount load_into registered hot" + (f" [{threads} threads, {flush or 'all'} MiB]" if i else "")
        out.append(record(name, h.data_len, best, note=note, registrations_before=made, threads=threads,
                          flush_mib=flush))
    return out


def sweep(spec: str):
    """[(threads, MiB a batch; 0: everything in one)] from "1x0,4x512"."""
    return [tuple(int(x) for x in item.split("x")) for item in spec.split(",") if item]


def end_to_end(a, h, wd, cold: bool):
    import torch
    s = LoadStats()

    def run():
        out = phxmount.load_safetensors(a.mount_file, 0, stats=s, threads=a.threads)
        torch.cuda.synchronize()
        del out
        return (f"{s.extents} extents, {s.ioctls} ioctls, transport {s.transport}, io {s.io_seconds:.3f}s, "
                f"registered {s.extra.get('registered')}, cache hits {s.extra.get('cache_hits')}")

    out = []
    if not cold:
        wd.stage("hot, end to end: the first load in a fresh state", 120)
        fresh()
        best, note = best_of(1, run)
        out.append(record("phxmount load_safetensors first load hot", h.data_len, best, note=note))
    reps = a.cold_reps if cold else a.reps
    wd.stage(f"{'cold' if cold else 'hot'}, end to end: {reps} loads", 60 + reps * (60 if cold else 10))
    name = f"{E2E} {'cold' if cold else 'hot'}"
    try:
        best, note = best_of(reps, run, cold_before(a.backing_file, a.mount_file) if cold else None)
    except NotCold as e:
        return out + [failed(name, e)]
    out.append(record(name, h.data_len, best, note=note))
    return out


def cold_before(backing: str, mount: str = "", drop=None):
    """What runs before each cold run: the caches dropped (drop, default
    benchlib.drop_caches) and the file checked cold (NotCold otherwise:
    the run is not timed)."""
    return lambda: cold_start([backing], [mount] if mount else [], drop=drop)


def safetensors_side(a, h, wd, cold: bool):
    import torch
    from safetensors.torch import load_file

    def run():
        out = load_file(a.backing_file, device="cuda:0")
        torch.cuda.synchronize()
        del out
        return "backing path"

    reps = a.cold_reps if cold else a.reps
    fresh()
    return timed_side(a, h, wd, f"c safetensors load_file cuda {'cold' if cold else 'hot'}",
                      f"safetensors load_file, {'cold' if cold else 'hot'}: {reps} loads", reps, run, cold)


def timed_side(a, h, wd, name: str, stage: str, reps: int, run, cold: bool) -> list:
    """Row name: the best of reps of run over the backing file (cold: its
    pages dropped before each, and checked), or why it failed."""
    wd.stage(stage, 60 + reps * 60)
    try:
        best, note = best_of(reps, run, cold_before(a.backing_file) if cold else None)
    except NotCold as e:
        return [failed(name, e)]
    return [record(name, h.data_len, best, note=note)]


def pageable_side(a, h, wd, cold: bool):
    import torch
    size = os.path.getsize(a.backing_file)

    def run():
        cpu = torch.empty(size, dtype=torch.uint8)
        mv = memoryview((ctypes.c_ubyte * size).from_address(cpu.data_ptr())).cast("B")
        with open(a.backing_file, "rb", buffering=0) as f:
            got = 0
            while got < size:
                n = f.readinto(mv[got:])
                if not n:
                    break
                got += n
        g = cpu.cuda()
        torch.cuda.synchronize()
        del g, cpu
        return "whole file: read() then .cuda(), no tensor views"

    reps = 1 if cold else 2
    return timed_side(a, h, wd, f"d pageable read + .cuda() {'cold' if cold else 'hot'}",
                      f"pageable read + .cuda(), {'cold' if cold else 'hot'}", reps, run, cold)


def main() -> int:
    ap = tool_args(__doc__)
    ap.add_argument("--cold", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3, help="runs of each hot side (best taken)")
    ap.add_argument("--cold-reps", type=int, default=2, help="runs of each cold side, caches dropped before each")
    ap.add_argument("--threads", type=int, default=4, help="client threads (ioctl streams) of the loads")
    ap.add_argument("--flush-mib", type=int, default=512, help="MiB of requests a BATCH task gathers (0: all)")
    ap.add_argument("--sweep", default="1x0,4x0,8x256", help="more THREADSxMIB loads of the registered side, "
                                                             "recorded beside the default's")
    a = ap.parse_args()
    import torch
    wd = Watchdog("gpu_bench")
    h = read_header(a.backing_file)
    torch.cuda.init()
    torch.empty(1, device="cuda:0")
    res = {"file": a.backing_file, "data_bytes": h.data_len, "file_bytes": os.path.getsize(a.backing_file),
           "torch": torch.__version__, "threads": a.threads, "reps": a.reps, "cold_reps": a.cold_reps, "results": []}
    say(str(phxmount.available(a.mount_file)))
    steps = [(registered, None), (end_to_end, False), (safetensors_side, False), (pageable_side, False)]
    if a.cold:
        steps += [(end_to_end, True), (safetensors_side, True), (pageable_side, True)]
    wd.stage("warm the file", 120)
    warm(a.backing_file)
    for fn, cold in steps:
        try:
            res["results"] += fn(a, h, wd) if cold is None else fn(a, h, wd, cold)
        except Exception as e:  # the other sides still run
            res["results"].append(failed(f"{fn.__name__}{' cold' if cold else ''}", e))
    wd.done()
    write_json(a.out, res)
    return 1 if any("error" in r for r in res["results"]) else 0


if __name__ == "__main__":
    sys.exit(main())

"""One measurement of a many-request loop in this process (a fresh one per
call): its seconds, a tally of the hook's pieces (calls, seconds; wrapped
around the class methods, so only this process's own calls count), torch's
allocator counters and, with --profile, a cProfile of the loop.

    python3 smallprof.py CASE DIR [--profile]
CASE: narrow2 | narrow8 | engine | engine_floor | load_file | slice8 | fp"""

import cProfile
import functools
import io
import json
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../python/tools"))
import torch  # noqa: E402
import shapes_children  # noqa: E402
import tploops  # noqa: E402
from benchlib import hook_stats  # noqa: E402
from phxmount.dtypes import torch_dtype  # noqa: E402
from phxmount.stformat import read_header  # noqa: E402
from probetasks import record_tasks  # noqa: E402

TALLY = {}
TIMELINE = {}


def wrap(owner, attr, label):
    f = getattr(owner, attr, None)
    if f is None:
        return

    @functools.wraps(f)
    def w(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            c = TALLY.setdefault(label, [0, 0.0])
            c[0] += 1
            c[1] += time.perf_counter() - t0
    setattr(owner, attr, w)


def instrument():
    wrap(torch.cuda, "synchronize", "torch.cuda.synchronize")
    try:
        from phxmount import fetch, hook, hook_defer, regcache, torch_mem, batchio, deferred, hook_guess
    except ImportError as e:
        print("no hook modules:", e)
        return
    for owner, names in ((regcache.RegCache, ("get", "prune")),
                         (fetch.Fetcher, ("plan", "start", "calibrate")),
                         (fetch.Pending, ("result",)),
                         (hook.HookedFile, ("get_tensor", "_gpu", "_take", "read_slice", "_in_place", "_ahead_of",
                                            "__init__", "_close", "_whole_file", "_reader")),
                         (hook.mounts.__class__, ("open_if_phxmount",)),
                         (hook_defer.Source, ("fill",)),
                         (hook_guess.Guesses, ("after",)),
                         (torch_mem.CudaBackend, ("prepare", "alloc", "finish", "locate", "make_room")),
                         (batchio._Submitter, ("submit", "_run_holding"))):
        for n in names:
            wrap(owner, n, f"{owner.__name__}.{n}")
    wrap(deferred, "make", "deferred.make")
    for n in ("_open", "_open_reader", "read_header"):  # a file's open: each looked up by name in hook
        wrap(hook, n, f"hook.{n}")
    for n in ("start", "ahead_of", "_planned", "make"):
        wrap(hook_defer.RegionReads, n, f"RegionReads.{n}")
    wrap(torch, "empty", "torch.empty")  # the hook's allocations (looked up on the module at each call)
    orig = hook_defer.Source._fill_elsewhere

    def elsewhere(src, dest, regions):
        FAILED.append(f"{src.name}: {src.failed!r}"[:300])
        return orig(src, dest, regions)
    hook_defer.Source._fill_elsewhere = elsewhere
    wrap(hook_defer.Source, "_fill_elsewhere", "Source._fill_elsewhere")


FAILED = []
# The fp case's timeline (perf_counter): when transformers spawned each
# materialization, each start (names, bytes), each read task's end, each
# get_slice(k)[...] asked and returned.
EVENTS = {"spawn": [], "start": [], "task_done": [], "ask": [], "got": [], "task": []}


def timeline():
    """Wraps what the fp timeline records (after instrument())."""
    from phxmount import batchio, hook, hook_plan
    st = hook_plan.Starts.start

    def start(self, reader, dev, task):
        t = time.perf_counter()
        plans = st(self, reader, dev, task)
        if plans:
            EVENTS["start"].append((t, len(plans), sum(p.read_bytes for p in plans),
                                    os.path.basename(reader.fetcher.path).rsplit(".", 1)[0][-20:], round((time.perf_counter() - t) * 1e3, 1)))
        return plans
    hook_plan.Starts.start = start
    sub = batchio._Submitter.submit

    def submit(self, cols, keep=None, urgent=False):
        fut = sub(self, cols, keep, urgent)
        fut.add_done_callback(lambda f: EVENTS["task_done"].append(time.perf_counter()))
        return fut
    batchio._Submitter.submit = submit
    record_tasks(EVENTS["task"])
    rs = hook.HookedFile.read_slice

    def read_slice(self, info, index, bound):
        EVENTS["ask"].append((time.perf_counter(), os.path.basename(self.path).rsplit(".", 1)[0][-20:]))
        try:
            return rs(self, info, index, bound)
        finally:
            EVENTS["got"].append(time.perf_counter())
    hook.HookedFile.read_slice = read_slice


def timeline_summary(t0):
    """Each event's first, median and last time after t0 (ms), and the starts' sizes."""
    out = {}
    for k, v in EVENTS.items():
        ts = sorted(e[0] if isinstance(e, tuple) else e for e in v)
        if ts:
            out[k] = {"n": len(ts), "first_ms": round((ts[0] - t0) * 1e3, 1),
                      "median_ms": round((ts[len(ts) // 2] - t0) * 1e3, 1), "last_ms": round((ts[-1] - t0) * 1e3, 1)}
    ms = lambda t: round((t - t0) * 1e3, 1)  # noqa: E731
    out["starts"] = [(ms(t), n, round(b / 1e6), f, took) for t, n, b, f, took in EVENTS["start"][:40]]
    files = {}
    for t, f in EVENTS["ask"]:
        files.setdefault(f, {"first_ask": ms(t)})
    for t0_, t1, nb, f, _ in EVENTS["task"]:
        e = files.setdefault(f, {})
        e["tasks"] = e.get("tasks", 0) + 1
        e["task_first"] = min(e.get("task_first", 1e9), ms(t0_))
        e["task_last_end"] = max(e.get("task_last_end", 0), ms(t1))
        e["task_ms"] = round(e.get("task_ms", 0) + (t1 - t0_) * 1e3, 1)
        e["MB"] = e.get("MB", 0) + nb // 1000000
    out["files"] = files
    # How many tasks ran at once, over the I/O's span (ms at each count).
    edges = sorted([(a, 1) for a, _, _, _, _ in EVENTS["task"]] + [(b, -1) for _, b, _, _, _ in EVENTS["task"]])
    at, prev, conc = 0, None, {}
    for t, d in edges:
        if prev is not None:
            conc[at] = conc.get(at, 0) + (t - prev) * 1e3
        at, prev = at + d, t
    out["in_flight_ms"] = {k: round(v, 1) for k, v in sorted(conc.items())}
    return out


def files(d):
    return tploops.files_of(d)


def run(case, d):
    fs = files(d)
    if case.startswith("narrow"):
        w = int(case[6:])
        plan, params = tploops.narrow_params(d, w - 1, w)
        return tploops.narrow_loop(fs, plan, params)
    if case.startswith("slice"):
        w = int(case[5:])
        return tploops.slice_loop(fs, w - 1, w)
    if case == "engine":
        return shapes_children.engine_loop(d)
    if case == "load_file":
        return shapes_children.load_file_loop(d)
    if case == "engine_floor":
        # The engines' copies into the same parameters, from one load_file
        # a file: what the loop would take if a get_tensor cost nothing
        # more than load_file's share of a tensor.
        from safetensors.torch import load_file
        params = {t.name: torch.empty(t.shape, dtype=torch_dtype(t.dtype), device="cuda:0")
                  for f in fs for t in read_header(f).tensors}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for p in fs:
            for k, t in load_file(p, device="cuda:0").items():
                params[k].copy_(t)
        torch.cuda.synchronize()
        return params, time.perf_counter() - t0
    if case == "fp":  # from_pretrained, loading only (the context and the model's module before the clock)
        import importlib
        import transformers
        from transformers import AutoModelForCausalLM
        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        with open(os.path.join(d, "config.json")) as f:
            mt = json.load(f)["model_type"]
        importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
        timeline()
        import transformers.core_model_loading as cml
        spawn = cml.spawn_materialize  # the hook's wrapper where it is on

        def spawned(*a, **k):
            EVENTS["spawn"].append(time.perf_counter())
            return spawn(*a, **k)
        cml.spawn_materialize = spawned
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, device_map="cuda:0")
        torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        TIMELINE.update(timeline_summary(t0), workers=getattr(cml, "GLOBAL_WORKERS", "?"))
        return dict(m.named_parameters()), secs
    raise SystemExit(f"unknown case {case}")


def main():
    case, d = sys.argv[1], sys.argv[2]
    if os.environ.get("PHXPROF_SWITCH"):  # the interpreter's thread switch interval, seconds
        sys.setswitchinterval(float(os.environ["PHXPROF_SWITCH"]))
    prof = "--profile" in sys.argv
    torch.empty(1, device="cuda:0")
    import safetensors  # noqa: F401
    instrument()
    keys = ("num_device_alloc", "num_device_free", "segment.all.allocated", "num_alloc_retries", "num_sync_all_streams")
    m0 = torch.cuda.memory_stats()
    pr = cProfile.Profile() if prof else None
    # PHXPROF_TIMELINE=1: the fp case's timeline for any case
    timed = bool(os.environ.get("PHXPROF_TIMELINE")) and case != "fp"
    if timed:
        timeline()
    t0 = time.perf_counter()
    if pr:
        pr.enable()
    got, secs = run(case, d)
    if timed:
        TIMELINE.update(timeline_summary(t0))
    if pr:
        pr.disable()
    m1 = torch.cuda.memory_stats()
    out = {"case": case, "dir": d, "seconds": round(secs, 4), "tensors": len(got),
           "bytes": sum(t.numel() * t.element_size() for t in got.values()),
           "alloc": {k: m1.get(k, 0) - m0.get(k, 0) for k in keys},
           "tally": {k: [v[0], round(v[1] * 1e3, 2)] for k, v in sorted(TALLY.items(), key=lambda kv: -kv[1][1])},
           "hook": hook_stats(), "timeline": TIMELINE, "filled_elsewhere": FAILED[:5], "n_elsewhere": len(FAILED)}
    try:
        from phxmount import regcache
        out["regcaches"] = [{"registered": c.registered, "hits": c.hits, "stale": c.stale,
                             "register_ms": round(c.register_seconds * 1e3, 2)}
                            for c in getattr(regcache, "_caches", {}).values()]
    except Exception as e:  # noqa: BLE001
        out["regcaches"] = str(e)
    print(json.dumps(out), flush=True)
    if pr:
        for key, n in (("cumulative", 45), ("tottime", 30)):
            o = io.StringIO()
            pstats.Stats(pr, stream=o).sort_stats(key).print_stats(n)
            print(o.getvalue())


main()

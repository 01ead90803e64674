"""Is the hooked engines' loop bound by its main thread? One fresh process:

    PHXMOUNT_HOOK=cuda:0 python3 mainprobe.py engine|narrow8|load_file|whole DIR

runs the loop (shapes_children / tploops, the same as the issue27 rows)
with only perf_counter around each get_tensor and copy_ (no wrapped hook
functions: smallprof's tallies inflate what they time), and prints one
JSON line: the loop's wall time; the main thread's CPU time
(time.thread_time) against it; the wall time in get_tensor, in its waits
for reads (Pending.result where the read had not landed at the call) and
in copy_; and every thread's CPU time over the loop (/proc/self/task: the
I/O threads' Python and system time). If the main thread's CPU is near
the loop's wall time and its waits are short, the loop is its Python.
"""

import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../python/tools"))
import torch  # noqa: E402
import tploops  # noqa: E402
from benchlib import hook_stats  # noqa: E402
from probetasks import record_tasks  # noqa: E402
from phxmount.dtypes import torch_dtype  # noqa: E402
from phxmount.stformat import read_header  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
WAIT = [0, 0.0]  # waits for a read not yet landed: count, seconds
CALLS = []  # (name, at, get_tensor seconds, copy_ seconds) of each call
TASKS = []  # (start, end, bytes, file, thread name) of each read task (probetasks)


def threads_cpu() -> dict:
    """{tid: (name, CPU seconds)} of this process's threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                s = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        fields = s[s.rindex(")") + 2:].split()
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def watch_waits():
    from phxmount import fetch
    orig = fetch.Pending.result

    def result(self):
        if self._done or all(f.done() for f in self.futures):
            return orig(self)
        t = time.perf_counter()
        try:
            return orig(self)
        finally:
            WAIT[0] += 1
            WAIT[1] += time.perf_counter() - t
    fetch.Pending.result = result
    record_tasks(TASKS)


def story(t0: float) -> dict:
    """The loop's first calls and tasks, its slowest calls, in ms after t0."""
    ms = lambda t: round((t - t0) * 1e3, 2)  # noqa: E731
    short = lambda n: n.replace("model.layers.", "L").replace("mlp.experts.", "x")[-40:]  # noqa: E731
    calls = [(short(n), ms(a), round(g * 1e3, 2), round(c * 1e3, 2)) for n, a, g, c in CALLS]
    slow = sorted(calls, key=lambda x: -x[2])[:20]
    tasks = sorted((ms(a), ms(b), round(nb / 1e6, 1), th.split("_")[0]) for a, b, nb, _, th in TASKS)
    return dict(first_calls=calls[:40], slowest_calls=slow, first_tasks=tasks[:30], n_tasks=len(tasks),
                urgent_tasks=sum(1 for t in tasks if t[3].startswith("phx-io-now")))


def loop(case: str, d: str):
    from safetensors import safe_open
    files = tploops.files_of(d)
    if case == "engine":
        params = {t.name: torch.empty(t.shape, dtype=torch_dtype(t.dtype), device="cuda:0")
                  for f in files for t in read_header(f).tensors}
        take = {k: (None, k) for k in params}
    else:
        w = int(case[6:])
        plan, params = tploops.narrow_params(d, w - 1, w)
        take = {k: (t, t.param) for k, t in plan.items()}
    torch.cuda.synchronize()
    got = cp = 0.0
    n = 0
    cpu0, thr0, t0 = time.thread_time(), threads_cpu(), time.perf_counter()
    for p in files:
        with safe_open(p, framework="pt", device="cpu") as f:
            for k in f.keys():
                tk = take.get(k)
                if tk is None:
                    continue
                a = time.perf_counter()
                x = f.get_tensor(k)
                b = time.perf_counter()
                t, param = tk
                dst = params[param]
                if t is not None:
                    if t.dim is not None:
                        x = x.narrow(t.dim, t.start, t.size)
                    if t.dst_rows is not None:
                        dst = dst.narrow(0, t.dst_start, t.dst_rows)
                dst.copy_(x)
                c = time.perf_counter()
                got += b - a
                cp += c - b
                n += 1
                CALLS.append((k, a, b - a, c - b))
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return dict(wall=wall, main_cpu=time.thread_time() - cpu0, get_tensor=got, copy=cp, n=n, t0=t0), thr0


def load_file_loop(d: str):
    from safetensors.torch import load_file
    torch.cuda.synchronize()
    cpu0, thr0, t0 = time.thread_time(), threads_cpu(), time.perf_counter()
    n = 0
    for p in tploops.files_of(d):
        n += len(load_file(p, device="cuda:0"))
    torch.cuda.synchronize()
    return dict(wall=time.perf_counter() - t0, main_cpu=time.thread_time() - cpu0, n=n, t0=t0), thr0


def whole_file(d: str):
    """phxmount.load_safetensors of the first file of d (the whole_file
    row's call; the hook is not in its way)."""
    from phxmount import load_safetensors
    f = tploops.files_of(d)[0]
    torch.cuda.synchronize()
    cpu0, thr0, t0 = time.thread_time(), threads_cpu(), time.perf_counter()
    n = len(load_safetensors(f, 0))
    torch.cuda.synchronize()
    return dict(wall=time.perf_counter() - t0, main_cpu=time.thread_time() - cpu0, n=n, t0=t0), thr0


GC = {}  # generation -> [collections, seconds] during the loop
_gc_at = [0.0]


def watch_gc():
    """Times the interpreter's cyclic collections (gc.callbacks): a full
    one over torch's and transformers' objects is tens of ms, in whatever
    call allocated last."""
    def cb(phase, info):
        if phase == "start":
            _gc_at[0] = time.perf_counter()
        else:
            c = GC.setdefault(info["generation"], [0, 0.0])
            c[0] += 1
            c[1] += time.perf_counter() - _gc_at[0]
    gc.callbacks.append(cb)


def main():
    case, d = sys.argv[1], sys.argv[2]
    torch.empty(1, device="cuda:0")
    watch_waits()
    runs = {"load_file": load_file_loop, "whole": whole_file}
    if os.environ.get("MAINPROBE_FREEZE"):  # what gc.freeze() before the loop would save
        gc.collect()
        gc.freeze()
    watch_gc()
    out, thr0 = runs[case](d) if case in runs else loop(case, d)
    gc.callbacks.clear()
    out["gc"] = {g: [n, round(s * 1e3, 2)] for g, (n, s) in sorted(GC.items())}
    out["gc_tracked"] = len(gc.get_objects()) + gc.get_freeze_count()
    thr1 = threads_cpu()
    out.update(story(out.pop("t0")))
    per = {}
    for tid, (name, c) in thr1.items():
        was = thr0.get(tid, (name, 0.0))[1]
        if c - was > 0.0:
            per[f"{name}:{tid}"] = round(c - was, 3)
    out.update(case=case, waits=WAIT[0], wait_s=round(WAIT[1], 4), threads_cpu=per,
               env={k: v for k, v in os.environ.items() if k.startswith("PHXMOUNT_")})
    for k in ("wall", "main_cpu", "get_tensor", "copy"):
        if k in out:
            out[k] = round(out[k], 4)
    h = hook_stats()
    out["hook"] = h and h.get("summary")
    print(json.dumps(out))


if __name__ == "__main__":
    main()

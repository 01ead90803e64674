"""The main thread's slow calls, as a tree in time order. One fresh process:

    PHXMOUNT_HOOK=cuda:0 python3 calltrace.py CASE DIR [MIN_MS]

CASE: narrowN (vLLM's narrow loop at world N, last rank) | sliceN (the
get_slice loop) | engine (get_tensor + copy_ of every key). A profile
function set on the main thread alone (sys.setprofile is per thread, so the
I/O threads run untraced) records every Python and C call's start and end;
the calls that took at least MIN_MS (0.3 by default) are printed indented
by depth, each with its start after the clock and its duration in ms, so a
stall of the loop is shown with the calls it was in: a lock's acquire, a
thread's start, a stat on the mount, torch's allocation. The tracer costs
about a microsecond a call: the loop's time is inflated, the stalls are not.
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../python/tools"))
import torch  # noqa: E402
import shapes_children  # noqa: E402
import tploops  # noqa: E402

STACK = []  # (start, label) of the calls open on the main thread
DONE = []  # (start, end, depth, label) of the calls that ended


def label(frame, event, arg) -> str:
    if event.startswith("c_"):
        mod = getattr(arg, "__module__", None) or type(getattr(arg, "__self__", None)).__name__
        return f"{mod}.{getattr(arg, '__qualname__', getattr(arg, '__name__', '?'))}"
    co = frame.f_code
    return f"{os.path.basename(co.co_filename)}:{co.co_firstlineno}({co.co_qualname})"


def tracer(frame, event, arg):
    t = time.perf_counter()
    if event in ("call", "c_call"):
        STACK.append((t, label(frame, event, arg)))
    elif STACK:  # return, c_return, c_exception
        s, lb = STACK.pop()
        DONE.append((s, t, len(STACK), lb))


def main():
    case, d = sys.argv[1], sys.argv[2]
    min_s = float(sys.argv[3]) / 1e3 if len(sys.argv) > 3 else 0.3e-3
    torch.empty(1, device="cuda:0")
    import safetensors  # noqa: F401
    fs = tploops.files_of(d)
    if case.startswith("narrow"):
        w = int(case[6:])
        plan, params = tploops.narrow_params(d, w - 1, w)
        run = lambda: tploops.narrow_loop(fs, plan, params)  # noqa: E731
    elif case.startswith("slice"):
        w = int(case[5:])
        run = lambda: tploops.slice_loop(fs, w - 1, w)  # noqa: E731
    elif case == "engine":
        run = lambda: shapes_children.engine_loop(d)  # noqa: E731
    else:
        raise SystemExit(f"unknown case {case}")
    t0 = time.perf_counter()
    sys.setprofile(tracer)
    _, secs = run()
    sys.setprofile(None)
    print(f"{case}: {secs * 1e3:.1f} ms traced; calls of at least {min_s * 1e3:.2f} ms:")
    for s, e, depth, lb in sorted(DONE):
        if e - s >= min_s and depth <= 40:
            print(f"{(s - t0) * 1e3:8.2f} {(e - s) * 1e3:7.2f} {'  ' * depth}{lb}")


main()

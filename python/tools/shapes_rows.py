"""gpu_shapes.py's rows from its fresh processes' results (shapes_children.py,
tploops.py): the best run of each side, the checks every hooked row is held
to (an error, a tensor or an engine's operation that differs from stock's,
a hooked run the hook did not serve, no comparison at all: the row is
failed and has no figure), and gpu_rows.row for the format."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import hook_fails  # noqa: E402
from gpu_rows import row  # noqa: E402

GB = 1e9
NOT_RUN_ERROR = "not run:"  # a process the budget had no time left for: no figure, no failure


def ok_runs(runs):
    return [r for r in runs or [] if not r.get("error")]


def check_fails(runs, what) -> list:
    """Errors of the runs, and what their comparisons with stock found."""
    out = [f"{what}: {r['error'][-300:]}" for r in runs or [] if r.get("error")
           and not r["error"].startswith(NOT_RUN_ERROR)]
    out += [f"{what}: differs from stock: {r['mismatch']}" for r in runs or [] if r.get("mismatch")]
    out += [f"{what}: {r['ops_mismatch']}" for r in runs or [] if r.get("ops_mismatch")]
    out += [f"{what}: stock's own load was not clean: {r['loading_info']}" for r in runs or [] if r.get("loading_info")]
    out += [f"{what}: tied {r['tied']} against stock's {r['ref_tied']}" for r in runs or []
            if "ref_tied" in r and r["tied"] != r["ref_tied"]]
    if ok_runs(runs) and not any("compared" in r for r in ok_runs(runs)) and not out:
        out.append(f"{what}: no hooked run compared its tensors with stock")
    return out


def rate_row(name, runs, ref, timed, why, hooked=True) -> dict:
    """GB/s of the best run against ref (gpu_rows.staged_over_files)."""
    if runs is None:
        return row(name, None, ref.get("best"), ref.get("best_name") or "staged_ceiling.cu", timed=timed, missing=[why])
    fails = check_fails(runs, name) + (hook_fails([r.get("hook") for r in ok_runs(runs)], name) if hooked else [])
    good = [r["bytes"] / r["seconds"] / GB for r in ok_runs(runs) if r.get("seconds")]
    return row(name, max(good) if good else None, ref.get("best"), ref.get("best_name") or "staged_ceiling.cu",
               timed=timed, failed=fails, missing=[] if ref.get("best") else [ref.get("why") or "no ref"])


def span_row(name, side, ref, timed, why) -> dict:
    """The hook's first-read-to-last-landed rate of the hooked runs."""
    hk = (side or {}).get("hooked")
    if hk is None:
        return row(name, None, ref.get("best"), ref.get("best_name") or "staged_ceiling.cu", timed=timed, missing=[why])
    fails = check_fails(hk, name) + hook_fails([r.get("hook") for r in ok_runs(hk)], name)
    rates = []
    for r in ok_runs(hk):
        h = r.get("hook") or {}
        if h.get("first") is not None and h.get("last") is not None and h["last"] > h["first"]:
            rates.append(h["bytes"] / (h["last"] - h["first"]) / GB)
    return row(name, max(rates) if rates else None, ref.get("best"), ref.get("best_name") or "staged_ceiling.cu",
               timed=timed, failed=fails, missing=[] if ref.get("best") else [ref.get("why") or "no ref"])


def time_row(name, side, timed, why, with_process=False) -> dict:
    """stock s / hooked s, the best run of each."""
    if side is None:
        return row(name, None, None, "stock, the same program off the mount", timed=timed, missing=[why])
    st, hk = side["stock"], side["hooked"]
    fails = check_fails(hk, name) + hook_fails([r.get("hook") for r in ok_runs(hk)], name)
    fails += [f"{name} stock: {r['error'][-300:]}" for r in st if r.get("error")
              and not r["error"].startswith(NOT_RUN_ERROR)]
    s = min((r["seconds"] for r in ok_runs(st)), default=None)
    h = min((r["seconds"] for r in ok_runs(hk)), default=None)
    note = ""
    if with_process:
        ps = [min((r["process_s"] for r in ok_runs(x) if r.get("process_s")), default=None) for x in (st, hk)]
        if all(ps):
            note = f"from the interpreter's start to the model loaded: stock {ps[0]:.2f} s, hooked {ps[1]:.2f} s"
    return row(name, h, s, "stock, the same program off the mount (the backing directory)", timed=timed, failed=fails,
               note=note, missing=[] if st else ["no stock run (--quick runs loading only's hooked side alone)"])

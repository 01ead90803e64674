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
NOT_RUN_ERROR = "not run:"
# from_pretrained's fresh processes a side: one each (a process costs
# 17-20 s, so --reps of them would not fit one device call beside the rest)
FP_REPS = 1  # a process the budget had no time left for: no figure, no failure


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


def reps_words(n: int) -> str:
    """How many fresh processes a side a row's figure is the best of."""
    return "one fresh process a side" if n == 1 else f"a fresh process per repetition, best of {n}"


# --- rows --------------------------------------------------------------------------
def rows(run) -> list:
    """gpu_shapes.Run's rows from its results (run.res), its references
    and its budget's reasons for what did not run."""
    q = "QUICK MODE (no issue's figure): " if run.a.quick else ""
    R = run.a.reps
    rows = []
    ref_moe = run.ref_of("moe")
    for key, name, what in (("moe_load_file", "moe_load_file_vs_ref", "safetensors.torch.load_file(f, device="
                             "'cuda:0') of every file in turn, PHXMOUNT_HOOK=1"),
                            ("moe_engine", "moe_engine_vs_ref", "safe_open(f, 'pt', device='cpu'), get_tensor in "
                             "key order, copy_ into GPU parameters allocated before the clock, PHXMOUNT_HOOK=cuda:0")):
        runs = run.res.get(key)
        rows.append(rate_row(name, runs, ref_moe, f"{q}{what}; {run.ckpt_words('moe')}; CUDA context before the "
                             f"clock; a fresh process per repetition, best of {R}; GB/s of the tensors' bytes",
                             run.step_why("moe: load_file and the engines' loop")))
    for ck in ("moe", "dense20"):
        step = f"{ck}: from_pretrained"
        user, load = run.res.get(f"{ck}_fp_user"), run.res.get(f"{ck}_fp_load")
        words = run.ckpt_words(ck)
        fp = reps_words(FP_REPS)  # from_pretrained runs FP_REPS processes a side, not --reps
        rows.append(time_row(f"{ck}_from_pretrained_hot", user, f"{q}from_pretrained(dtype=bfloat16, device_map="
                             f"'cuda:0') as a user's program sees it: the whole call, its CUDA context and the "
                             f"model's module inside it (torch and transformers imported at the top); {words}; "
                             f"{fp}", run.step_why(step), with_process=True))
        rows.append(time_row(f"{ck}_from_pretrained_load", load, f"{q}the same call, loading only: the CUDA context "
                             f"and the model's module before the clock; {words}; {fp}", run.step_why(step)))
        rows.append(span_row(f"{ck}_from_pretrained_bytes_vs_ref", load, run.ref_of(ck),
                             f"{q}hooked from_pretrained (loading only), the hook's first read asked for to its "
                             f"last tensor landed (in device memory: read ahead, before it is asked for); {words}; GB/s of the "
                             f"bytes it landed, {fp.replace(' a side', '')}",
                             run.step_why(step)))
    for w in (2, 4, 8):
        if w not in run.narrow_worlds():
            rows.append(row(f"vllm_tp_world{w}", None, None, "stock", timed=f"{q}vLLM's narrow loop, world {w}",
                            missing=["--quick runs world 8 alone"]))
            continue
        rows.append(time_row(f"vllm_tp_world{w}", run.res.get(f"tp_narrow_{w}"), f"{q}vLLM's narrow loop "
                             f"(get_tensor, narrow(dim, rank), copy_ into the rank's parameter), world {w}, rank "
                             f"{w - 1}, PHXMOUNT_HOOK=cuda:0 against stock; {run.ckpt_words('qwen2')}; a fresh "
                             f"process per repetition, best of {R}", run.step_why(
                                 "tensor parallel: vLLM's narrow loop and the get_slice loop (qwen2)")))
    rows.append(time_row("slice_tp_world8", run.res.get("tp_slice_8"), f"{q}the get_slice loop (get_slice(k)"
                         f"[rank's index].to('cuda:0')), world 8, rank 7, PHXMOUNT_HOOK=cuda:0 against stock; "
                         f"{run.ckpt_words('qwen2')}; a fresh process per repetition, best of {R}",
                         run.step_why("tensor parallel: vLLM's narrow loop and the get_slice loop (qwen2)")))
    rows.append(procs_row(run, q))
    rows.append(whole_row(run, q, R))
    return rows


def procs_row(run, q) -> dict:
    p8, pinned = run.res.get("procs8"), run.res.get("pinned") or {}
    timed = (f"{q}8 processes at once, one per rank of world 8, each the hooked get_slice loop "
             f"(PHXMOUNT_HOOK=cuda:0) on {run.ckpt_words('dense20')} onto cuda:0: all ranks' bytes from the "
             f"first start to the last end")
    base = None if pinned.get("error") else pinned.get("gbps")
    if not p8:
        return row("tp_8procs_vs_pinned", None, base, "pinned H2D copy, 1 GiB, torch", timed=timed,
                   missing=[run.step_why("8 rank processes at once (dense20)")])
    ranks, errs = p8["ranks"], p8["errors"]
    fails = [f"rank process: {e}" for e in errs]
    fails += [f"rank {r['rank']}: tensors differ from stock: {r['mismatch']}" for r in ranks if r.get("mismatch")]
    fails += [f"rank {r['rank']}: compared beside the others' clocks: {r['barrier_error']}" for r in ranks
              if r.get("barrier_error")]
    fails += hook_fails([r.get("hook") for r in ranks], "rank processes")
    if len(ranks) != 8 and not fails:
        fails.append(f"{len(ranks)} of 8 rank processes reported")
    value = None
    late = 0.0
    if ranks and not fails:
        span = max(r["end"] for r in ranks) - min(r["start"] for r in ranks)
        late = max(r["start"] for r in ranks) - min(r["start"] for r in ranks)
        value = sum(r["bytes"] for r in ranks) / span / GB
    return row("tp_8procs_vs_pinned", value, base, "pinned H2D copy, 1 GiB, torch (a fresh process)", timed=timed,
               failed=fails, note=f"starts within {late * 1e3:.1f} ms" if value else "")

def whole_row(run, q, R) -> dict:
    w = run.res.get("whole")
    timed = (f"{q}phxmount.load_safetensors of one file (the name imported and the CUDA context made before the "
             f"clock), a fresh process per repetition, best of {R}")
    if not w:
        return row("whole_file_vs_ref", None, None, "staged_ceiling.cu on the same file", timed=timed,
                   missing=[run.step_why("whole file")])
    ref = run.ref_of("dense20", files=[w["file"]])
    return rate_row("whole_file_vs_ref", w["runs"], ref, timed + f"; {os.path.basename(w['file'])}, "
                    f"{os.path.getsize(w['file']) / GB:.2f} GB", "", hooked=False)

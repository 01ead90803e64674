"""gpu_hf.py's checks and rows from its processes' results: what a hooked
from_pretrained, the engines' loop and the first load of a fresh mount must
have found against stock (checks), and the rows of the report (build_rows;
gpu_rows.row for the format)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_rows import row  # noqa: E402

GB = 1e9


def checks(r) -> list:
    fails = []
    for k, v in r.items():
        if isinstance(v, dict) and v.get("error") and not v["error"].startswith("NotCold"):
            fails.append(f"{k}: {v['error'][-300:]}")
    for k in ("hooked", "user_hooked", "hooked_cold"):
        fails += hooked_checks(k, r.get(k, {}))
    e = r.get("engine_hooked", {})
    if not e.get("error") and e.get("mismatch"):
        fails.append(f"engine loop with the hook: tensors differ: {e['mismatch']}")
    return fails


def hooked_checks(k: str, h: dict) -> list:
    """What a hooked from_pretrained's process found against stock."""
    fails = []
    if not h.get("error"):
        if h.get("mismatch"):
            fails.append(f"hooked from_pretrained: parameters differ from stock: {h['mismatch']}")
        if h.get("params_on_gpu") != h.get("params"):
            fails.append(f"hooked from_pretrained: {h.get('params_on_gpu')} of {h.get('params')} on the GPU")
        if h.get("hook_files", 0) < 1 or h.get("hook_fallbacks"):
            fails.append(f"hooked from_pretrained did not go through phxmount: {h.get('hook_summary')}")
        if h.get("host_not_cpu") or h.get("host_mismatch") or not h.get("host_tensors"):
            fails.append(f"load_file(device='cpu') on the mount: not host tensors equal to stock: {h}")
        if not h.get("off_mount_stock"):
            fails.append(f"a file off the mount got {h.get('off_mount_type')}, not safetensors' own")
    return [f"{k}: {f}" for f in fails]


def ok(x, key):
    return None if not isinstance(x, dict) or x.get("error") else x.get(key)


def why(*xs) -> list:
    return [x["error"][-300:] for x in xs if isinstance(x, dict) and x.get("error")]


def build_rows(r) -> list:
    n = r["bytes"]
    st, hk, hc = r.get("stock"), r.get("hooked"), r.get("hooked_cold")
    us, uh = r.get("user_stock"), r.get("user_hooked")
    cold = {k: v.get("gbps") for k, v in (r.get("cold_ceiling") or {}).items() if isinstance(v, dict)}
    cold_best = max((v for v in cold.values() if v), default=None)
    hc_gbps = n / ok(hc, "seconds") / GB if ok(hc, "seconds") else None
    user_note = ""
    if ok(us, "process_s") and ok(uh, "process_s"):
        user_note = (f"from the interpreter's start to the model loaded: stock {us['process_s']:.2f} s, hooked "
                     f"{uh['process_s']:.2f} s")
    call = "from_pretrained(dtype=bfloat16, device_map='cuda:0')"
    rows = [
        row("hf_from_pretrained_hot", ok(hk, "seconds"), ok(st, "seconds"), "stock from_pretrained, backing dir",
            missing=why(st, hk), timed=f"{call}, loading only: the CUDA context and the model's module made and "
                                       "imported before the clock, a fresh process each side, one run each"),
        row("hf_from_pretrained_user", ok(uh, "seconds"), ok(us, "seconds"), "stock from_pretrained, backing dir",
            missing=why(us, uh), note=user_note,
            timed=f"{call} as a user's program sees it: the whole call (its CUDA context and the model's module "
                  "inside it; torch and transformers imported at the top), a fresh process each side, one run each"),
        row("hf_from_pretrained_cold", hc_gbps, cold_best,
            "best cold read of the checkpoint (8 threads, O_DIRECT 16 MiB or buffered 1 MiB)",
            missing=why(hc) + [f"cold ceiling {k}: {v['error']}" for k, v in (r.get("cold_ceiling") or {}).items()
                               if isinstance(v, dict) and v.get("error")],
            timed="hooked from_pretrained (loading only) after dropping caches, the files checked not resident "
                  "(mincore) right before the clock; GB/s of the checkpoint's bytes"),
        row("engine_iterator_hot", ok(r.get("engine_hooked"), "seconds"), ok(r.get("engine_stock"), "seconds"),
            "the same loop without the hook, the same files off the mount (the backing directory)",
            missing=why(r.get("engine_stock"), r.get("engine_hooked")),
            timed="safe_open(device='cpu'), get_tensor per key, copy_ into GPU tensors allocated before the clock, "
                  "PHXMOUNT_HOOK=cuda:0 on the mount against no hook off it, a fresh process each, one run each"),
        row("first_load_fresh_mount", ok(r.get("first"), "gbps"), ok(r.get("pinned"), "gbps"),
            "pinned H2D copy, 1 GiB, torch", missing=why(r.get("first"), r.get("pinned")),
            timed="load_safetensors of every file at once, fresh process, fresh mount; the name imported before "
                  "the clock; the CUDA context made before it"),
        row("hook_peak_memory", ok(hk, "peak_reserved"), ok(st, "peak_reserved"),
            "stock from_pretrained's peak reserved", missing=why(st, hk),
            timed="torch.cuda.max_memory_reserved after the load, fresh process each; lower is better: ratio = "
                  "stock / hooked"),
    ]
    return rows

"""The fresh processes of gpu_shapes.py's rows (issue 27), one measurement
each, its JSON on the last line of stdout:

    python3 shapes_children.py KIND [--dir D] [--ref B] [--file F] [--variant user|load] [--spawned T]

* load_file: safetensors.torch.load_file(f, device="cuda:0") of every file
  of D in turn; the CUDA context made before the clock;
* engine: safe_open(f, framework="pt", device="cpu"), get_tensor in key
  order, copy_ into GPU parameters allocated before the clock;
* from_pretrained: AutoModelForCausalLM.from_pretrained(D, dtype=bfloat16,
  device_map="cuda:0"); variant user: as a user's program sees it (torch
  and transformers imported at the top, the whole call timed: the CUDA
  context and the model's module made and imported inside it; the time
  since the parent spawned it, T, beside it); variant load: loading only,
  the CUDA context and the model's module before the clock;
* whole: phxmount.load_safetensors(F, 0), the name imported and the CUDA
  context made before the clock;
* pinned: the pinned host-to-device ceiling.
PHXMOUNT_HOOK, set by the parent or not, decides which side a process is.
With --ref, the same load off the mount (B) follows the clock in the same
process, and every tensor, or every parameter and buffer, is compared
(bytes, dtype, shape, device); "hook" is what the hook did (benchlib.hook_stats)."""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import hook_stats, read_header  # noqa: E402
from tploops import files_of, mismatches, nbytes  # noqa: E402


def _dtype(st):
    import torch
    return {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[st]


def load_file_loop(d):
    """safetensors.torch.load_file(f, device="cuda:0") of every file of d;
    returns ({name: tensor}, seconds)."""
    import torch
    from safetensors.torch import load_file
    out = {}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for f in files_of(d):
        out.update(load_file(f, device="cuda:0"))
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def engine_loop(d):
    """The engines' default loop over every file of d: get_tensor in key
    order, copy_ into GPU parameters allocated before the clock; returns
    ({name: parameter}, seconds)."""
    import torch
    from safetensors import safe_open
    files = files_of(d)
    params = {t.name: torch.empty(t.shape, dtype=_dtype(t.dtype), device="cuda:0")
              for f in files for t in read_header(f).tensors}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for p in files:
        with safe_open(p, framework="pt", device="cpu") as f:
            for k in f.keys():
                params[k].copy_(f.get_tensor(k))
    torch.cuda.synchronize()
    return params, time.perf_counter() - t0


def child_load_file(a) -> dict:
    import torch
    torch.empty(1, device="cuda:0")
    return timed_and_compared(load_file_loop, a)


def child_engine(a) -> dict:
    return timed_and_compared(engine_loop, a)


def timed_and_compared(load, a) -> dict:
    """load(a.dir) -> (tensors, seconds): its row, and, with a.ref, every
    tensor compared with load(a.ref)'s (outside the clock)."""
    got, secs = load(a.dir)
    res = {"seconds": secs, "bytes": nbytes(got), "tensors": len(got), "hook": hook_stats()}
    if a.ref:
        want, _ = load(a.ref)
        res.update(compared=len(want), mismatch=mismatches(got, want)[:10])
    return res


def child_from_pretrained(a) -> dict:
    # What a user's program has at its top: torch and transformers.
    import importlib
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    mt = ckpt_gen_config(a.dir)["model_type"]
    if a.variant == "load":  # loading only: the context and the model's module before the clock
        torch.empty(1, device="cuda:0")
        importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
    t0 = time.perf_counter()
    m = AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.bfloat16, device_map="cuda:0")
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    res = {"variant": a.variant, "seconds": t1 - t0, "process_s": time.time() - a.spawned if a.spawned else None,
           "peak_reserved": torch.cuda.max_memory_reserved(0)}
    hs = hook_stats()
    if hs:
        if hs.get("first") is not None and hs.get("last") is not None:
            hs["first_s"], hs["last_s"] = hs["first"] - t0, hs["last"] - t0
        res["hook"] = hs
    got = dict(m.named_parameters()) | dict(m.named_buffers())
    res["bytes"] = sum(os.path.getsize(f) for f in files_of(a.dir))
    res["tied"] = tied(m)
    if a.ref:
        ref, info = AutoModelForCausalLM.from_pretrained(a.ref, dtype=torch.bfloat16, device_map="cuda:0",
                                                         output_loading_info=True)
        want = dict(ref.named_parameters()) | dict(ref.named_buffers())
        res["loading_info"] = {k: sorted(map(str, info.get(k) or []))[:5] for k in
                               ("missing_keys", "unexpected_keys", "mismatched_keys") if (info or {}).get(k)}
        res.update(compared=len(want), mismatch=mismatches(got, want)[:10], ref_tied=tied(ref))
    return res


def tied(m) -> bool:
    """Whether the model's lm_head is its embeddings (tie_word_embeddings)."""
    try:
        return m.get_output_embeddings().weight.data_ptr() == m.get_input_embeddings().weight.data_ptr()
    except AttributeError:
        return False


def ckpt_gen_config(d: str) -> dict:
    with open(os.path.join(d, "config.json")) as f:
        return json.load(f)


def child_whole(a) -> dict:
    import torch
    from safetensors.torch import load_file
    torch.empty(1, device="cuda:0")
    from phxmount import load_safetensors  # a program imports it at its start
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    got = load_safetensors(a.file, 0)
    torch.cuda.synchronize()
    res = {"seconds": time.perf_counter() - t0, "bytes": nbytes(got), "tensors": len(got)}
    if a.ref:
        want = load_file(a.ref, device="cuda:0")
        res.update(compared=len(want), mismatch=mismatches(got, want)[:10])
    return res


def child_pinned(a) -> dict:
    from benchlib import pinned_ceiling_gbps
    return {"gbps": pinned_ceiling_gbps()}


CHILDREN = {"load_file": child_load_file, "engine": child_engine, "from_pretrained": child_from_pretrained,
            "whole": child_whole, "pinned": child_pinned}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=sorted(CHILDREN))
    for k in ("--dir", "--ref", "--file", "--variant"):
        ap.add_argument(k, default="")
    ap.add_argument("--spawned", type=float, default=0.0, help="time.time() when the parent started it")
    a = ap.parse_args(argv)
    print(json.dumps(CHILDREN[a.kind](a)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The loops tensor-parallel engines run to load their rank, each timed in a
fresh process of its own (gpu_tp.py, gpu_shapes.py): whatever one
repetition registered, measured or learned (the hook's guesses, the cost
model, availability checks, torch's cached allocations) is gone in the
next, on both sides.

* slice: the get_slice loop (issue 20): safe_open(f, "pt", device="cpu"),
  for every key get_slice, the rank's index (q/k/v/gate/up, embeddings,
  lm_head on dim 0, o/down on dim 1, the rest whole), .to("cuda:0");
* narrow: vLLM's loop (its safetensors weights iterator and weight
  loaders): safe_open(f, framework="pt"), for every key get_tensor, then
  narrow(dim, start, size) of the rank's part and copy_ into the rank's
  parameter, allocated before the clock: q/k/v (and their biases) into
  one qkv_proj, column-parallel on dim 0, KV heads replicated when the
  world exceeds their number (rank r takes head r // (world / heads));
  gate/up into one gate_up_proj, dim 0; o_proj and down_proj row-parallel
  on dim 1; embeddings and lm_head vocab-parallel (the vocabulary padded
  to a multiple of 64, rank r's rows of it, the padding zeroed); norms
  replicated (copied whole, cast to the parameter's dtype); lm_head
  skipped where the embeddings are tied.

    python3 tploops.py child --loop slice|narrow --dir D [--ref B] --rank R --world W
        [--start-at EPOCH] [--ops] [--barrier DIR --barrier-n N]

The clock holds the loop over every file alone: torch, safetensors and
the CUDA context are there before it, the narrow loop's parameters
allocated. With --ref, the same loop with stock safetensors on B (the
same checkpoint off the mount) runs after the clock in the same process,
and every tensor is compared (bytes, dtype, shape, device); --ops also
applies the operations an engine applies to what get_tensor returned and
compares those; with --barrier (processes timed together), the comparison
waits until every process is past its clock. The planning below needs no
torch (the CPU tests check it); the loops do. Output: one JSON line."""

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import barrier, hook_stats, read_header  # noqa: E402

DIM0 = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight",
        "embed_tokens.weight", "lm_head.weight")
DIM1 = ("o_proj.weight", "down_proj.weight")
VOCAB_PAD = 64  # vLLM pads the vocabulary to a multiple of this


def tp_dim(name: str, shape) -> Optional[int]:
    """The get_slice loop's split of a tensor (Llama's): 0, 1, or None (whole)."""
    if len(shape) == 2 and name.endswith(DIM0):
        return 0
    if len(shape) == 2 and name.endswith(DIM1):
        return 1
    return None


def files_of(d: str):
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".safetensors"))


def config_of(d: str) -> dict:
    with open(os.path.join(d, "config.json")) as f:
        return json.load(f)


# --- vLLM's plan ----------------------------------------------------------------------

@dataclass(frozen=True)
class Take:
    """What the narrow loop does with one checkpoint tensor: narrow(dim,
    start, size) of it (dim None: the whole tensor) copied into rows
    [dst_start, dst_start + its rows) of parameter param (whole: the
    parameter whole)."""
    param: str
    dim: Optional[int]
    start: int
    size: int
    dst_start: int = 0
    dst_rows: Optional[int] = None
    pad: bool = False  # vocab-parallel: the parameter's rows past dst_rows are zeroed


def _divide(a: int, b: int, what: str) -> int:
    if a % b:
        raise ValueError(f"{what}: {a} does not split over world {b}")
    return a // b


def narrow_plan(cfg: dict, tensors, rank: int, world: int):
    """({checkpoint name: Take or None (skipped)}, {param: shape}) of vLLM's
    loaders for a Llama- or Qwen2-shaped checkpoint's tensors, (name,
    shape) pairs, at rank of world."""
    heads, kvh = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    q_per = _divide(heads, world, "attention heads") * hd
    if world >= kvh:
        replicas = _divide(world, kvh, "world over KV heads")
        kv_per, kv_shard = hd, rank // replicas
    else:
        kv_per, kv_shard = _divide(kvh, world, "KV heads") * hd, rank
    inter = cfg.get("intermediate_size")
    i_per = _divide(inter, world, "intermediate size") if inter else None
    vocab = cfg["vocab_size"]
    padded = -(-vocab // VOCAB_PAD) * VOCAB_PAD
    v_per = _divide(padded, world, "padded vocabulary")
    v_lo = rank * v_per
    v_n = max(0, min(v_per, vocab - v_lo))
    tied = cfg.get("tie_word_embeddings", False)
    plan, params = {}, {}

    def param(name, shape):
        params.setdefault(name, tuple(shape))

    for name, shape in tensors:
        shape = tuple(shape)
        stem, leaf = name.rsplit(".", 2)[0], ".".join(name.rsplit(".", 2)[1:])
        if leaf in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias", "k_proj.bias", "v_proj.bias"):
            kind = "weight" if leaf.endswith("weight") else "bias"
            p = f"{stem}.qkv_proj.{kind}"
            param(p, (q_per + 2 * kv_per,) + shape[1:])
            if leaf.startswith("q"):
                plan[name] = Take(p, 0, rank * q_per, q_per, 0, q_per)
            else:
                off = q_per if leaf.startswith("k") else q_per + kv_per
                plan[name] = Take(p, 0, kv_shard * kv_per, kv_per, off, kv_per)
        elif leaf == "o_proj.weight":
            param(name, (shape[0], q_per))
            plan[name] = Take(name, 1, rank * q_per, q_per)
        elif leaf in ("gate_proj.weight", "up_proj.weight"):
            p = f"{stem}.gate_up_proj.weight"
            param(p, (2 * i_per, shape[1]))
            plan[name] = Take(p, 0, rank * i_per, i_per, 0 if leaf.startswith("gate") else i_per, i_per)
        elif leaf == "down_proj.weight":
            param(name, (shape[0], i_per))
            plan[name] = Take(name, 1, rank * i_per, i_per)
        elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
            if tied and name.endswith("lm_head.weight"):
                plan[name] = None  # vLLM skips it: the embeddings are the head
                continue
            param(name, (v_per, shape[1]))
            plan[name] = Take(name, 0, v_lo, v_n, 0, v_n, pad=True)
        else:  # norms and whatever else: replicated
            param(name, shape)
            plan[name] = Take(name, None, 0, shape[0] if shape else 1)
    return plan, params


# --- the loops (torch) ----------------------------------------------------------------

def _torch():
    import torch
    return torch


def slice_loop(files, rank: int, world: int, device: str = "cuda:0"):
    """The get_slice loop; returns ({name: tensor on device}, seconds)."""
    torch = _torch()
    from safetensors import safe_open
    from phxmount.slicing import shard_index
    torch.cuda.synchronize()
    out = {}
    t0 = time.perf_counter()
    for p in files:
        with safe_open(p, framework="pt", device="cpu") as f:
            for k in f.keys():
                s = f.get_slice(k)
                shape = s.get_shape()
                d = tp_dim(k, shape)
                idx = shard_index(shape, d, rank, world) if d is not None else Ellipsis
                out[k] = s[idx].to(device)
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def narrow_params(d: str, rank: int, world: int, device: str = "cuda:0"):
    """(plan, {param: empty tensor on device}) of vLLM's loaders, made before
    the clock, in the model's dtype (bfloat16)."""
    torch = _torch()
    tensors = [(t.name, t.shape) for f in files_of(d) for t in read_header(f).tensors]
    plan, shapes = narrow_plan(config_of(d), tensors, rank, world)
    params = {k: torch.empty(s, dtype=torch.bfloat16, device=device) for k, s in shapes.items()}
    torch.cuda.synchronize()
    return plan, params


def narrow_loop(files, plan, params):
    """vLLM's loop: get_tensor, narrow, copy_ into the rank's parameter;
    returns (params, seconds)."""
    torch = _torch()
    from safetensors import safe_open
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for p in files:
        with safe_open(p, framework="pt") as f:
            for name in f.keys():
                take = plan.get(name)
                if take is None:
                    continue
                w = f.get_tensor(name)
                if take.dim is not None:
                    w = w.narrow(take.dim, take.start, take.size)
                dst = params[take.param]
                if take.dst_rows is not None:
                    dst = dst.narrow(0, take.dst_start, take.dst_rows)
                if take.pad:
                    params[take.param][take.dst_rows:].fill_(0)  # the padding rows, as vLLM zeroes them
                dst.copy_(w)
    torch.cuda.synchronize()
    return params, time.perf_counter() - t0


def nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts.values())


def same(a, b) -> bool:
    """Exactly stock's tensor: dtype, shape, device and every byte."""
    torch = _torch()
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape) or a.device != b.device:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def mismatches(got: dict, want: dict) -> list:
    """The names whose tensors differ from stock's (or are missing)."""
    return sorted([k for k in want if k not in got or not same(got[k], want[k])] +
                  [k for k in got if k not in want])


def ops_check(mount_files, backing_files, device: str = "cuda:0") -> list:
    """What an engine does with what get_tensor returned, on a few tensors
    of the hooked files against stock's of the backing files: each
    operation's result compared (bytes, dtype, shape; stock's moved to the
    device, since PHXMOUNT_HOOK=cuda:0 sends tensors asked for on the cpu
    there). Returns the operations that differ."""
    torch = _torch()
    from safetensors import safe_open
    bad = []
    with safe_open(mount_files[0], framework="pt") as f, safe_open(backing_files[0], framework="pt") as g:
        keys = [k for k in f.keys() if len(f.get_slice(k).get_shape()) == 2][:3]
        for k in keys:
            x, y = f.get_tensor(k), g.get_tensor(k).to(device)
            if not isinstance(x, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
                bad.append(f"{k}: type, shape or dtype")
                continue
            r, c = x.shape
            ops = {
                "narrow0": lambda t: t.narrow(0, r // 2, r - r // 2), "narrow1": lambda t: t.narrow(1, c // 3, c // 3),
                "slice": lambda t: t[1:r:2], "cols": lambda t: t[:, : c // 2], "view": lambda t: t.view(-1),
                "t": lambda t: t.t().contiguous(), "to": lambda t: t.to(torch.float32),
                "cat": lambda t: torch.cat([t, t], 0), "inplace": lambda t: t.clone().mul_(2),
                "copy_": lambda t: torch.empty_like(t).copy_(t),
                "linear": lambda t: torch.nn.functional.linear(torch.ones(4, c, dtype=t.dtype, device=t.device), t),
            }
            for name, op in ops.items():
                a, b = op(x), op(y)
                if not same(a, b):
                    bad.append(f"{k}: {name}")
            x.add_(1)
            y.add_(1)
            if not same(x, y):
                bad.append(f"{k}: add_ on the returned tensor")
    return bad


def child(a) -> dict:
    torch = _torch()
    torch.empty(1, device=a.device)  # the CUDA context, before the clock
    import safetensors  # noqa: F401  (imported before the clock, as a program imports it)
    files = files_of(a.dir)
    plan = params = None
    if a.loop == "narrow":
        plan, params = narrow_params(a.dir, a.rank, a.world, a.device)
    if a.start_at:
        while time.time() < a.start_at:
            time.sleep(0.0005)
    start = time.time()
    if a.loop == "slice":
        got, secs = slice_loop(files, a.rank, a.world, a.device)
    else:
        got, secs = narrow_loop(files, plan, params)
    out = {"loop": a.loop, "rank": a.rank, "world": a.world, "seconds": secs, "start": start, "end": time.time(),
           "bytes": nbytes(got), "tensors": len(got), "hook": hook_stats()}
    if a.ref and getattr(a, "barrier", ""):
        # Processes timed together: none compares until all are past their
        # clocks (a comparison loads stock's tensors onto the same GPU).
        try:
            out["barrier_s"] = barrier(a.barrier, f"rank-{a.rank}", a.barrier_n, a.barrier_timeout)
        except TimeoutError as e:
            out["barrier_error"] = str(e)
    if a.ref:
        ref_files = files_of(a.ref)
        if a.loop == "slice":
            want, _ = slice_loop(ref_files, a.rank, a.world, a.device)
        else:
            plan2, params2 = narrow_params(a.ref, a.rank, a.world, a.device)
            want, _ = narrow_loop(ref_files, plan2, params2)
        out["compared"] = len(want)
        out["mismatch"] = mismatches(got, want)[:10]
        if a.ops:
            out["ops_mismatch"] = ops_check(files, ref_files, a.device)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("child")
    c.add_argument("--loop", choices=("slice", "narrow"), required=True)
    c.add_argument("--dir", required=True)
    c.add_argument("--ref", default="")
    c.add_argument("--rank", type=int, required=True)
    c.add_argument("--world", type=int, required=True)
    c.add_argument("--start-at", type=float, default=0.0)
    c.add_argument("--device", default="cuda:0")
    c.add_argument("--ops", action="store_true")
    c.add_argument("--barrier", default="", help="with --ref and processes timed together: a directory where "
                   "each marks its clock done and waits for --barrier-n marks before it compares")
    c.add_argument("--barrier-n", type=int, default=0)
    c.add_argument("--barrier-timeout", type=float, default=120.0)
    a = ap.parse_args(argv)
    print(json.dumps(child(a)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

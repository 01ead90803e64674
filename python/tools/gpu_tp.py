"""Tensor-parallel ranks as engines load them (issue 20), on the Llama-shaped
checkpoint that gpu_hf.py writes (transformers' save_pretrained: 2 files,
111 tensors). A rank's plan is Llama's: q/k/v/gate/up projections,
embeddings and lm_head split on dim 0 (whole rows), o/down projections on
dim 1 (a slice of every row), norms whole.

    gpu_tp.py run --mount-dir M --backing-dir B --ckpt NAME --out J [--ref-col F ...]

Rows (gpu_rows.row, targets in gpu_rows.TARGETS, every ratio higher-is-better):
* tp_world2, tp_world4, tp_world8: the engines' pattern, one process:
  safe_open(f, "pt", device="cpu"), for every key get_slice, the rank's
  index, then .to("cuda:0"); stock safetensors on M against the same loop
  with the phxmount hook on (PHXMOUNT_HOOK=cuda:0, turned on in-process:
  the loop's code is the same); ranks 0 and W-1, best of 2 each side, the
  slower rank's ratio (stock s / hooked s); every tensor compared;
* tp_rank_vs_ceiling: world 8, rank 7, one call per file
  (load_safetensors(shard=the plan), the files at once):
  (rank bytes / pinned ceiling + 10 ms) / measured s;
* col_shard_vs_ref: the dim-1 tensors alone (o_proj: 8,192-byte rows,
  down_proj: 28,672) sharded at W = 2, 4, 8 (rank W-1), one call, GB/s of
  shard bytes, against col_shard.cu's best at the same row width and W in
  the same run (--ref-col: its stdout, one file per width); the worst pair;
* tp_8procs_vs_pinned: 8 processes of world 8 at once on cuda:0, each its
  rank through the one call, aggregate GB/s (all ranks' bytes from the
  first start to the last end) against the pinned ceiling; every process
  compares its tensors with stock get_slice afterwards.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import Watchdog, in_threads, pinned_ceiling_gbps, say, warm, write_json  # noqa: E402
from gpu_rows import TARGETS as T, row  # noqa: E402
from reqprobe import RequestProbe  # noqa: E402

GB = 1e9
DIM0 = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight",
        "embed_tokens.weight", "lm_head.weight")
DIM1 = ("o_proj.weight", "down_proj.weight")


def tp_dim(name: str, shape) -> object:
    """Llama's tensor-parallel split of a tensor: 0, 1, or None (whole)."""
    if len(shape) == 2 and name.endswith(DIM0):
        return 0
    if len(shape) == 2 and name.endswith(DIM1):
        return 1
    return None


def plan_for(rank: int, world: int):
    """load_safetensors' shard= for this rank: (dim, rank, world) or None."""
    def shard(name, shape):
        d = tp_dim(name, shape)
        return None if d is None else (d, rank, world)
    return shard


def files_of(d: str):
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".safetensors"))


def engine_loop(files, rank: int, world: int):
    """The engines' loop; returns ({name: tensor on cuda:0}, seconds)."""
    import torch
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
                out[k] = s[idx].to("cuda:0")
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def one_call(files, rank: int, world: int, names=None):
    """Every file's rank part through load_safetensors(shard=...), the files
    in parallel threads; returns ({name: tensor}, seconds)."""
    import torch
    import phxmount
    res = [None] * len(files)

    def load(i):
        res[i] = phxmount.load_safetensors(files[i], 0, names=names, strict=False, shard=plan_for(rank, world))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    in_threads(load, len(files))
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    out = {}
    for r in res:
        if r is None:
            raise RuntimeError("a file's load failed (see above)")
        out.update(r)
    return out, secs


def nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts.values())


def mismatches(got, want):
    import torch
    return sorted(k for k in want if k not in got or got[k].dtype != want[k].dtype or not torch.equal(got[k], want[k]))


def probe_requests(files, mnt: str, url, out: dict) -> None:
    """One more hooked loop of world 8, rank 7, untimed, with its opens and
    closes watched from three sides (reqprobe.py): where the time that run
    19's profile found in open and close goes."""
    from phxmount import hook
    hook.install(hook.Mode(True, "cuda:0"))
    try:
        with RequestProbe(mnt, os.path.join(mnt, "config.json"), url) as p:
            _, secs = engine_loop(files, 7, 8)
    finally:
        hook.uninstall()
    s = p.summary()
    out["request_probe"] = dict(s, loop_s=secs)
    say(f"requests during a hooked world-8 loop ({secs:.3f} s): {json.dumps(s)}")


def engine_rows(files, out: dict) -> list:
    """tp_world{2,4,8}: stock against hooked, the engines' loop."""
    from phxmount import hook
    rows, fails = [], []
    for w in (2, 4, 8):
        ratios = []
        for rank in sorted({0, w - 1}):
            times = {"stock": [], "hooked": []}
            kept = {}
            for _ in range(2):
                for side in ("stock", "hooked"):
                    if side == "hooked":
                        hook.install(hook.Mode(True, "cuda:0"))
                    else:
                        hook.uninstall()
                    got, secs = engine_loop(files, rank, w)
                    times[side].append(secs)
                    kept[side] = got
            hook.uninstall()
            bad = mismatches(kept["hooked"], kept["stock"])
            if bad:
                fails.append(f"world {w} rank {rank}: {len(bad)} tensors differ from stock get_slice, e.g. {bad[:3]}")
            st, hk = min(times["stock"]), min(times["hooked"])
            say(f"engine loop world {w} rank {rank}: {nbytes(kept['stock']) / GB:.2f} GB, stock {st:.4f} s, "
                f"hooked {hk:.4f} s, {st / hk:.2f}x, every tensor {'equal' if not bad else 'NOT equal'}")
            out.setdefault("engine", []).append({"world": w, "rank": rank, "bytes": nbytes(kept["stock"]),
                                                 "stock_s": times["stock"], "hooked_s": times["hooked"],
                                                 "mismatch": bad[:10], "hook": hook.report.summary()})
            ratios.append((st / hk, st, hk, rank))
            del kept
        worst = min(ratios)
        rows.append(row(f"tp_world{w}", worst[2], worst[1], T[f"tp_world{w}"], "stock safetensors get_slice + .to()",
                        unit="s", note=f"engines' loop, rank {worst[3]} of {w} (the slower of ranks 0 and {w - 1}), "
                                       "best of 2, hooked in-process (PHXMOUNT_HOOK=cuda:0)"))
    return rows, fails


def parse_col_ref(paths) -> dict:
    """col_shard.cu's stdout: {(row bytes, W): best GB/s of F, G, S}."""
    ref = {}
    for p in paths:
        text = open(p).read()
        m = re.search(r"tensors of (\d+) rows x (\d+) bytes", text)
        if not m:
            continue
        rowb = int(m.group(2))
        for w, v in re.findall(r"^[FGS] .*?W=(\d+) .*?([\d.]+) GB/s of shard bytes", text, re.M):
            k = (rowb, int(w))
            ref[k] = max(ref.get(k, 0.0), float(v))
    return ref


def col_rows(files, ref: dict, out: dict) -> list:
    from phxmount.stformat import read_header
    widths = {}
    for p in files:
        for t in read_header(p).tensors:
            if tp_dim(t.name, t.shape) == 1:
                widths.setdefault(t.shape[1] * 2, set()).add(t.name)  # bf16: 2 bytes an element
    pairs = []
    for rowb, names in sorted(widths.items()):
        for w in (2, 4, 8):
            best = None
            for _ in range(2):
                got, secs = one_call(files, w - 1, w, names=names)
                best = min(best or 1e9, secs)
            gbps = nbytes(got) / best / GB
            r = ref.get((rowb, w))
            say(f"dim-1 shards, {len(names)} tensors of {rowb}-byte rows, W={w}: {gbps:.2f} GB/s"
                + (f" vs col_shard.cu best {r:.2f}" if r else " (no reference)"))
            out.setdefault("col", []).append({"row_bytes": rowb, "world": w, "gbps": gbps, "ref": r})
            if r:
                pairs.append((gbps / r, gbps, r, rowb, w))
    if not pairs:
        return [row("col_shard_vs_ref", None, None, T["col_shard_vs_ref"], "col_shard.cu best, same width",
                    missing=["col_shard.cu output"])]
    worst = min(pairs)
    return [row("col_shard_vs_ref", worst[1], worst[2], T["col_shard_vs_ref"],
                f"col_shard.cu best at {worst[3]}-byte rows, W={worst[4]}",
                note="the dim-1 tensors alone, one load_safetensors call per file, the worst width and W")]


def child_rank(a) -> dict:
    """One of the 8 rank processes: waits for the start time, loads its
    rank, then checks it against stock get_slice."""
    import torch
    torch.empty(1, device="cuda:0")
    files = files_of(a.dir)
    import phxmount  # noqa: F401  (imported before the clock)
    while time.time() < a.start_at:
        time.sleep(0.0005)
    t0 = time.time()
    got, _ = one_call(files, a.rank, a.world)
    t1 = time.time()
    want, _ = engine_loop(files_of(a.ref), a.rank, a.world)
    return {"rank": a.rank, "start": t0, "end": t1, "bytes": nbytes(got), "mismatch": mismatches(got, want)[:5]}


def procs_row(a, pinned: float, out: dict) -> list:
    mnt, back = os.path.join(a.mount_dir, a.ckpt), os.path.join(a.backing_dir, a.ckpt)
    start = time.time() + 12  # every process imported torch and made its context by then
    ps = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "child-rank", "--dir", mnt, "--ref", back,
                            "--rank", str(r), "--world", "8", "--start-at", str(start)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(8)]
    res, errs = [], []
    for p in ps:
        o, e = p.communicate(timeout=240)
        if p.returncode != 0:
            errs.append(e[-500:])
            continue
        res.append(json.loads(o.strip().splitlines()[-1]))
    out["procs"] = res
    if errs or len(res) != 8:
        out["procs_errors"] = errs
        return [row("tp_8procs_vs_pinned", None, pinned, T["tp_8procs_vs_pinned"], "pinned H2D copy, 1 GiB",
                    missing=["a rank process failed"])], [f"8 rank processes: {e}" for e in errs]
    late = max(r["start"] for r in res) - min(r["start"] for r in res)
    span = max(r["end"] for r in res) - min(r["start"] for r in res)
    total = sum(r["bytes"] for r in res)
    fails = [f"rank process {r['rank']}: tensors differ from stock get_slice: {r['mismatch']}" for r in res if r["mismatch"]]
    say(f"8 rank processes of world 8 at once: {total / GB:.2f} GB in {span:.3f} s ({total / span / GB:.2f} GB/s), "
        f"starts within {late * 1e3:.1f} ms")
    return [row("tp_8procs_vs_pinned", total / span / GB, pinned, T["tp_8procs_vs_pinned"], "pinned H2D copy, 1 GiB",
                note=f"8 processes, one per rank of world 8, each one load_safetensors call per file, onto cuda:0; "
                     f"starts within {late * 1e3:.1f} ms")], fails


def run(a) -> int:
    import torch
    wd = Watchdog("gpu_tp")
    mnt = os.path.join(a.mount_dir, a.ckpt)
    files = files_of(mnt)
    for f in files_of(os.path.join(a.backing_dir, a.ckpt)):
        warm(f)
    torch.empty(1, device="cuda:0")
    out, rows, fails = {}, [], []
    wd.stage("pinned ceiling", 60)
    pinned = pinned_ceiling_gbps()
    out["pinned_gbps"] = pinned
    wd.stage("the engines' loop, worlds 2, 4, 8, stock and hooked", 300)
    r, f = engine_rows(files, out)
    rows += r
    fails += f
    wd.stage("where opens and closes wait, a hooked loop", 60)
    probe_requests(files, mnt, a.metrics_url, out)
    wd.stage("one call, world 8 rank 7", 60)
    best, got = None, None
    for _ in range(3):
        got, secs = one_call(files, 7, 8)
        best = min(best or 1e9, secs)
    want, _ = engine_loop(files_of(os.path.join(a.backing_dir, a.ckpt)), 7, 8)
    bad = mismatches(got, want)
    if bad:
        fails.append(f"load_safetensors(shard=plan) world 8 rank 7: tensors differ: {bad[:3]}")
    ideal = nbytes(got) / (pinned * GB) + 0.010
    out["one_call"] = {"bytes": nbytes(got), "seconds": best, "ideal_s": ideal}
    say(f"one call, world 8 rank 7: {nbytes(got) / GB:.3f} GB in {best:.4f} s; ideal {ideal:.4f} s")
    rows.append(row("tp_rank_vs_ceiling", best, ideal, T["tp_rank_vs_ceiling"],
                    "rank bytes / pinned ceiling + 10 ms", unit="s",
                    note="world 8 rank 7, load_safetensors(shard=Llama's plan) of both files at once, best of 3"))
    del got, want
    wd.stage("dim-1 shards against col_shard.cu", 240)
    rows += col_rows(files, parse_col_ref(a.ref_col), out)
    wd.stage("8 rank processes at once", 300)
    r, f = procs_row(a, pinned, out)
    rows += r
    fails += f
    wd.done()
    write_json(a.out, {"results": out, "rows": rows, "failures": fails})
    for x in rows:
        say(f"row {x['name']}: {x['value']} vs {x['baseline']}: ratio {x['ratio']}, target {x['target']}, met {x['met']}")
    for f in fails:
        print(f"FAIL {f}", flush=True)
    print("PASS tensor-parallel checks" if not fails else f"{len(fails)} tensor-parallel check(s) failed", flush=True)
    return 1 if fails else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    for k in ("--mount-dir", "--backing-dir", "--ckpt", "--out"):
        r.add_argument(k, required=True)
    r.add_argument("--ref-col", nargs="*", default=[], help="col_shard.cu's stdout, one file per row width")
    r.add_argument("--metrics-url", default=None, help="the daemon's /metrics (phxmount --metrics), for the request probe")
    c = sub.add_parser("child-rank")
    c.add_argument("--dir", required=True)
    c.add_argument("--ref", required=True)
    c.add_argument("--rank", type=int, required=True)
    c.add_argument("--world", type=int, required=True)
    c.add_argument("--start-at", type=float, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "child-rank":
        print(json.dumps(child_rank(a)), flush=True)
        return 0
    return run(a)


if __name__ == "__main__":
    sys.exit(main())

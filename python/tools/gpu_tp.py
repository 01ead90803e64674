"""Tensor-parallel ranks as engines load them (issue 20), on the Llama-shaped
checkpoint that gpu_hf.py writes (transformers' save_pretrained: 2 files,
111 tensors). A rank's plan is Llama's: q/k/v/gate/up projections,
embeddings and lm_head split on dim 0 (whole rows), o/down projections on
dim 1 (a slice of every row), norms whole.

    gpu_tp.py run --mount-dir M --backing-dir B --ckpt NAME --out J [--ref-col F ...]

Rows (gpu_rows.row, targets in gpu_rows.SPECS, every ratio higher-is-better):
* tp_world2, tp_world4, tp_world8: the engines' pattern (tploops.py's
  slice loop): safe_open(f, "pt", device="cpu"), for every key get_slice,
  the rank's index, then .to("cuda:0"); stock safetensors on B (the same
  files off the mount) against the same loop on M with
  PHXMOUNT_HOOK=cuda:0; every repetition a fresh process,
  both sides (nothing a hooked loop registered, measured or guessed
  carries over to the next); ranks 0 and W-1, best of 2 each side, the
  lower of the two ranks' ratios (stock s / hooked s, each rank's best
  against its own best), and that rank's times; the first hooked process of
  each rank compares every tensor with stock's;
* tp_rank_vs_ceiling: world 8, rank 7, one call per file
  (load_safetensors(shard=the plan), the files at once), a fresh process
  per repetition, best of 3, the first checked against stock get_slice:
  (rank bytes / pinned ceiling + 10 ms) / measured s;
* col_shard_vs_ref: the dim-1 tensors alone (o_proj: 8,192-byte rows,
  down_proj: 28,672) sharded at W = 2, 4, 8 (rank W-1), one call, GB/s of
  shard bytes, against col_shard.cu's best at the same row width and W in
  the same run (--ref-col: its stdout, one file per width); the worst pair;
* tp_8procs_vs_pinned: 8 processes of world 8 at once on cuda:0, each its
  rank through the one call, aggregate GB/s (all ranks' bytes from the
  first start to the last end) against the pinned ceiling; every process
  compares its tensors with stock get_slice afterwards, once all 8 are
  past their clocks (a barrier).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import Watchdog, barrier, fresh, hook_fails, in_threads, pinned_ceiling_gbps, read_header, say, warm, write_json  # noqa: E402
from gpu_rows import row  # noqa: E402
from reqprobe import RequestProbe  # noqa: E402
from tploops import files_of, mismatches, nbytes, slice_loop, tp_dim  # noqa: E402

GB = 1e9
TOOLS = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(TOOLS)


def plan_for(rank: int, world: int):
    """load_safetensors' shard= for this rank: (dim, rank, world) or None."""
    def shard(name, shape):
        d = tp_dim(name, shape)
        return None if d is None else (d, rank, world)
    return shard


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


def probe_requests(files, mnt: str, url, out: dict) -> None:
    """One more hooked loop of world 8, rank 7, untimed, with its opens and
    closes watched from three sides (reqprobe.py): where the time that run
    19's profile found in open and close goes."""
    from phxmount import hook
    hook.install(hook.Mode(True, "cuda:0"))
    try:
        with RequestProbe(mnt, os.path.join(mnt, "config.json"), url) as p:
            _, secs = slice_loop(files, 7, 8)
    finally:
        hook.uninstall()
    s = p.summary()
    out["request_probe"] = dict(s, loop_s=secs)
    say(f"requests during a hooked world-8 loop ({secs:.3f} s): {json.dumps(s)}")


def loop_argv(mnt: str, back: str, rank: int, world: int, hooked: bool, compare: bool) -> list:
    """tploops.py's slice loop: stock on the backing directory (the files as
    a program without phxmount reads them: through the mount they would
    come through the FUSE page cache, slower than the backing file
    system's, docs/perf-notes.md), hooked on the mount (and, compare,
    every tensor checked against stock's of the backing directory after
    the clock)."""
    return [sys.executable, os.path.join(TOOLS, "tploops.py"), "child", "--loop", "slice",
            "--dir", mnt if hooked else back, "--rank", str(rank), "--world", str(world)] + \
        (["--ref", back] if compare else [])


def loop_in_fresh_process(mnt: str, back: str, rank: int, world: int, hooked: bool, compare: bool) -> dict:
    """loop_argv's loop in a process of its own, PHXMOUNT_HOOK=cuda:0 where
    hooked."""
    return fresh(loop_argv(mnt, back, rank, world, hooked, compare), hook="cuda:0" if hooked else "", timeout=180,
                 pythonpath=[PYDIR])


def engine_rows(mnt: str, back: str, out: dict, ranks: str = "both") -> list:
    """tp_world{2,4,8}: stock against hooked, the engines' loop, every
    repetition a fresh process; ranks 0 and W-1 (ranks "last": W-1 alone)."""
    rows, fails = [], []
    for w in (2, 4, 8):
        ratios = []
        for rank in sorted({0, w - 1} if ranks == "both" else {w - 1}):
            runs = {"stock": [], "hooked": []}
            for rep in range(2):
                runs["stock"].append(loop_in_fresh_process(mnt, back, rank, w, False, False))
                runs["hooked"].append(loop_in_fresh_process(mnt, back, rank, w, True, rep == 0))
            errs = [r["error"] for side in runs.values() for r in side if r.get("error")]
            bad = [m for r in runs["hooked"] for m in r.get("mismatch", [])]
            hook = [(r.get("hook") or {}).get("summary") for r in runs["hooked"] if not r.get("error")]
            if errs:
                fails.append(f"world {w} rank {rank}: {errs[0][-300:]}")
            if bad:
                fails.append(f"world {w} rank {rank}: tensors differ from stock get_slice, e.g. {bad[:3]}")
            if not any("compared" in r for r in runs["hooked"]):
                fails.append(f"world {w} rank {rank}: no hooked process compared its tensors with stock")
            fails += hook_fails([r.get("hook") for r in runs["hooked"] if not r.get("error")], f"world {w} rank {rank}")
            out.setdefault("engine", []).append({"world": w, "rank": rank, "runs": runs, "hook": hook})
            st = min((r["seconds"] for r in runs["stock"] if not r.get("error")), default=None)
            hk = min((r["seconds"] for r in runs["hooked"] if not r.get("error")), default=None)
            if st and hk:
                say(f"engine loop world {w} rank {rank}: stock {st:.4f} s, hooked {hk:.4f} s, {st / hk:.2f}x, "
                    f"every tensor {'equal' if not bad else 'NOT equal'}")
                ratios.append((st / hk, st, hk, rank))
        failed = [f for f in fails if f.startswith(f"world {w} ")]
        worst = min(ratios) if ratios and not failed else (None, None, None, None)
        which = (f"of ranks 0 and {w - 1} the one with the lower speed-up"
                 + (f" (rank {worst[3]})" if worst[3] is not None else "") if ranks == "both" else f"rank {w - 1}")
        rows.append(row(f"tp_world{w}", worst[2], worst[1], "stock safetensors get_slice + .to(), the same files off "
                        "the mount (the backing directory)",
                        failed=failed, timed=f"the get_slice loop of every file, world {w}, {which}, PHXMOUNT_HOOK=cuda:0 "
                        "against stock; every repetition a fresh process (torch, safetensors and the CUDA context "
                        "before the clock), best of 2 each side"))
    return rows, fails


def rank_call_row(mnt: str, back: str, pinned, out: dict, reps: int = 3):
    """tp_rank_vs_ceiling: world 8 rank 7 through one load_safetensors call
    per file (the files at once), each repetition in a fresh process
    (child-rank: torch, the CUDA context and phxmount there before the
    clock; nothing registered or learned by an earlier load), the first
    checking its tensors against stock get_slice after its clock."""
    runs = []
    for i in range(reps):
        argv = [sys.executable, os.path.abspath(__file__), "child-rank", "--dir", mnt, "--rank", "7", "--world", "8",
                "--start-at", "0"] + (["--ref", back] if i == 0 else [])
        runs.append(fresh(argv, timeout=120, pythonpath=[PYDIR]))
    out["one_call"] = {"runs": runs}
    what = "load_safetensors(shard=plan) world 8 rank 7"
    fails = [f"{what}: {r['error'][-300:]}" for r in runs if r.get("error")]
    fails += [f"{what}: tensors differ from stock get_slice: {r['mismatch'][:3]}" for r in runs if r.get("mismatch")]
    if not any("mismatch" in r for r in runs if not r.get("error")) and not fails:
        fails.append(f"{what}: no process compared its tensors with stock")
    ok = [r for r in runs if not r.get("error") and r.get("seconds")]
    best = min((r["seconds"] for r in ok), default=None)
    size = ok[0]["bytes"] if ok else None
    ideal = size / (pinned * GB) + 0.010 if size and pinned else None
    out["one_call"].update(bytes=size, seconds=best, ideal_s=ideal)
    if best and ideal:
        say(f"one call, world 8 rank 7: {size / GB:.3f} GB in {best:.4f} s; ideal {ideal:.4f} s")
    return [row("tp_rank_vs_ceiling", best, ideal, "rank bytes / pinned ceiling + 10 ms", failed=fails,
                timed=f"world 8 rank 7, load_safetensors(shard=Llama's plan) of every file at once in threads, a fresh "
                      f"process per repetition (torch, the CUDA context and phxmount imported before the clock), best "
                      f"of {reps}")], fails


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
    timed = ("load_safetensors(names=the dim-1 tensors, shard=(1, W-1, W)) of every file in parallel threads, best "
             "of 2 in one process, the worst width and W")
    if not pairs:
        return [row("col_shard_vs_ref", None, None, "col_shard.cu best, same width", timed=timed,
                    missing=["col_shard.cu output"])]
    worst = min(pairs)
    return [row("col_shard_vs_ref", worst[1], worst[2], f"col_shard.cu best at {worst[3]}-byte rows, W={worst[4]}",
                timed=timed)]


def child_rank(a) -> dict:
    """One of the 8 rank processes: waits for the start time, loads its
    rank, then, once all 8 are past their clocks (a.barrier: an early
    rank's check would load stock's tensors onto the GPU beside the
    others' clocks), checks it against stock get_slice."""
    import torch
    torch.empty(1, device="cuda:0")
    files = files_of(a.dir)
    import phxmount  # noqa: F401  (imported before the clock)
    while time.time() < a.start_at:
        time.sleep(0.0005)
    t0 = time.time()
    got, secs = one_call(files, a.rank, a.world)
    t1 = time.time()
    out = {"rank": a.rank, "start": t0, "end": t1, "seconds": secs, "bytes": nbytes(got)}
    if not a.ref:
        return out
    if a.barrier:
        try:
            out["barrier_s"] = barrier(a.barrier, f"rank-{a.rank}", a.barrier_n, 240)
        except TimeoutError as e:
            out["barrier_error"] = str(e)
    want, _ = slice_loop(files_of(a.ref), a.rank, a.world)
    return dict(out, mismatch=mismatches(got, want)[:5])


def procs_row(a, pinned: float, out: dict) -> list:
    mnt, back = os.path.join(a.mount_dir, a.ckpt), os.path.join(a.backing_dir, a.ckpt)
    start = time.time() + 12  # every process imported torch and made its context by then
    gate = tempfile.mkdtemp(prefix="phx-tp8-")  # the check waits until all 8 are past their clocks
    ps = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "child-rank", "--dir", mnt, "--ref", back,
                            "--rank", str(r), "--world", "8", "--start-at", str(start), "--barrier", gate,
                            "--barrier-n", "8"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(8)]
    res, errs = [], []
    for p in ps:
        o, e = p.communicate(timeout=240)
        if p.returncode != 0:
            errs.append(e[-500:])
            continue
        res.append(json.loads(o.strip().splitlines()[-1]))
    shutil.rmtree(gate, ignore_errors=True)
    out["procs"] = res
    timed = ("8 processes at once, one per rank of world 8, each one load_safetensors(shard=Llama's plan) call per "
             "file onto cuda:0: all ranks' bytes from the first start to the last end")
    if errs or len(res) != 8:
        out["procs_errors"] = errs
        return [row("tp_8procs_vs_pinned", None, pinned, "pinned H2D copy, 1 GiB", timed=timed,
                    failed=[f"8 rank processes: {e}" for e in errs] or ["a rank process failed"])], \
            [f"8 rank processes: {e}" for e in errs]
    late = max(r["start"] for r in res) - min(r["start"] for r in res)
    span = max(r["end"] for r in res) - min(r["start"] for r in res)
    total = sum(r["bytes"] for r in res)
    fails = [f"rank process {r['rank']}: tensors differ from stock get_slice: {r['mismatch']}" for r in res if r["mismatch"]]
    fails += [f"rank process {r['rank']}: compared beside the others' clocks: {r['barrier_error']}" for r in res
              if r.get("barrier_error")]
    say(f"8 rank processes of world 8 at once: {total / GB:.2f} GB in {span:.3f} s ({total / span / GB:.2f} GB/s), "
        f"starts within {late * 1e3:.1f} ms")
    return [row("tp_8procs_vs_pinned", total / span / GB, pinned, "pinned H2D copy, 1 GiB", timed=timed,
                failed=fails, note=f"starts within {late * 1e3:.1f} ms")], fails


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
    wd.stage("the engines' loop, worlds 2, 4, 8, stock and hooked, a fresh process each", 400)
    r, f = engine_rows(mnt, os.path.join(a.backing_dir, a.ckpt), out, a.ranks)
    rows += r
    fails += f
    wd.stage("where opens and closes wait, a hooked loop", 60)
    probe_requests(files, mnt, a.metrics_url, out)
    wd.stage("one call, world 8 rank 7, a fresh process each", 400)
    r, f = rank_call_row(mnt, os.path.join(a.backing_dir, a.ckpt), pinned, out)
    rows += r
    fails += f
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
    r.add_argument("--ranks", choices=("both", "last"), default="both",
                   help="the tp_world rows' ranks: 0 and W-1, or W-1 alone (half the fresh processes)")
    r.add_argument("--metrics-url", default=None, help="the daemon's /metrics (phxmount --metrics), for the request probe")
    c = sub.add_parser("child-rank")
    c.add_argument("--dir", required=True)
    c.add_argument("--ref", default="", help="check the rank against stock get_slice of these files after the clock")
    c.add_argument("--rank", type=int, required=True)
    c.add_argument("--world", type=int, required=True)
    c.add_argument("--start-at", type=float, default=0.0)
    c.add_argument("--barrier", default="", help="a directory where each rank marks its clock done and waits for "
                   "--barrier-n marks before its check")
    c.add_argument("--barrier-n", type=int, default=8)
    a = ap.parse_args(argv)
    if a.cmd == "child-rank":
        print(json.dumps(child_rank(a)), flush=True)
        return 0
    return run(a)


if __name__ == "__main__":
    sys.exit(main())

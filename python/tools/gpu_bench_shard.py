"""Rank-selective loading, benchmarked (issue 15): rank R of W (0 of 8)
loads its shard of every 2-D tensor of the file, row shards (dim 0) and
column shards (dim 1), through phxmount.load_safetensors(shard=...),
against safetensors' get_slice doing the same and against a full
load_safetensors of the file. Each side is the best of N hot runs; the
shards are checked equal to safetensors'. Records seconds (the report's
shard_* rows are speed-ups), the bytes the daemon moved (INFO counter) and
what the planner chose for the columns, and why."""

import sys

from benchlib import tool_args, Watchdog, best_of, failed, record, say, warm, write_json

import phxmount  # noqa: E402
from phxmount.loader import LoadStats  # noqa: E402
from phxmount.stformat import read_header  # noqa: E402
from phxmount.slicing import shard_bounds  # noqa: E402


def ours(a, names, dim, label):
    import torch
    s = LoadStats()
    keep = {}

    def run():
        keep.clear()
        c0 = phxmount.mount_counters(a.mount_file)["ioctl_bytes_read"]
        keep.update(phxmount.load_safetensors(a.mount_file, 0, stats=s, names=names, threads=a.threads,
                                              shard=None if dim is None else (dim, a.rank, a.world)))
        torch.cuda.synchronize()
        return phxmount.mount_counters(a.mount_file)["ioctl_bytes_read"] - c0

    best, moved = best_of(a.reps, run)
    nbytes = sum(t.numel() * t.element_size() for t in keep.values())
    why = sorted({p[2] for p in s.plans if p[1] == "cover"} or {p[2] for p in s.plans})[:1]
    r = record(label, nbytes, best, bytes_read=moved, strategies={k: s.extra.get(k) for k in ("exact", "cover")},
               why=why[0] if why else "", extents=s.extents, ioctls=s.ioctls)
    return r, keep


def theirs(a, names, shapes, dim, label):
    import torch
    from safetensors import safe_open
    keep = {}

    def run():
        keep.clear()
        with safe_open(a.backing_file, framework="pt", device="cuda:0") as f:
            for n in names:
                lo, hi = shard_bounds(shapes[n][dim], a.rank, a.world)
                keep[n] = f.get_slice(n)[lo:hi] if dim == 0 else f.get_slice(n)[:, lo:hi]
        torch.cuda.synchronize()

    best, _ = best_of(a.reps, run)
    return record(label, sum(t.numel() * t.element_size() for t in keep.values()), best), keep


def equal(mine, ref) -> bool:
    import torch
    return sorted(mine) == sorted(ref) and all(mine[k].dtype == ref[k].dtype and torch.equal(mine[k], ref[k]) for k in ref)


def main() -> int:
    ap = tool_args(__doc__)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    a = ap.parse_args()
    import torch
    wd = Watchdog("gpu_bench_shard")
    h = read_header(a.backing_file)
    shapes = {t.name: t.shape for t in h.tensors}
    names = [t.name for t in h.tensors if len(t.shape) == 2]
    torch.empty(1, device="cuda:0")
    warm(a.backing_file)
    res = {"file": a.backing_file, "rank": a.rank, "world": a.world, "reps": a.reps, "tensors_2d": len(names),
           "results": []}
    wd.stage(f"full load_safetensors x{a.reps}", 180)
    try:
        res["results"].append(ours(a, None, None, "phxmount full load_safetensors")[0])
    except Exception as e:
        res["results"].append(failed("phxmount full load_safetensors", e))
    for dim, kind in ((0, "rows"), (1, "cols")):
        try:
            wd.stage(f"{kind}: rank {a.rank} of {a.world}, phxmount then safetensors", 300)
            r, mine = ours(a, names, dim, f"phxmount shard {kind}")
            r2, ref = theirs(a, names, shapes, dim, f"safetensors get_slice {kind}")
            r["equal_to_safetensors"] = equal(mine, ref)
            say(("PASS" if r["equal_to_safetensors"] else "FAIL") + f" {kind} shards equal to safetensors get_slice")
            res["results"] += [r, r2]
            del mine, ref
        except Exception as e:
            res["results"].append(failed(f"phxmount shard {kind}", e))
    wd.done()
    write_json(a.out, res)
    return 1 if any("error" in r or r.get("equal_to_safetensors") is False for r in res["results"]) else 0


if __name__ == "__main__":
    sys.exit(main())

"""The rows of docs/bench/gpu-latest.json (issues 9 and 15), computed from
one benchmark run's raw outputs: the Go bench's JSON (ceilings), the
Python tools' JSON (gpu_bench, gpu_kv, gpu_bench_shard, gpu_bench_save)
and the reference programs' stdout (../shared/reference/staged_ceiling.cu
and kv_blocks.cu, built and run in the same call).

A row is {"name", "value", "baseline", "ratio", "target", "met"} plus
"unit", "baseline_name", "status" ("measured", "not run" or "failed") and,
when not measured, "missing". Rates are GB/s and ratio = value / baseline;
time rows (unit "s", the shard rows) have ratio = baseline / value, a
speed-up: every ratio is better when higher, and met = ratio >= target.
Nothing is typed in: a row whose inputs are absent is "not run", never a
number."""

import re

NOT_RUN = "not run"

# Every target, defined once: the rows below and gpu_report.py's target
# lines read them here (docs/python.md lists them).
TARGETS = {
    "hot_registered": 0.95, "hot_registered_vs_pinned": 0.9, "hot_end_to_end": 0.8, "hot_vs_safetensors": 9,
    "cold": 0.95, "kv": 0.9, "kv_write": 0.9, "save_nofsync": 3, "save_fsync": 3, "save_fsync_vs_disk": 0.9,
    "shard_row_vs_full": 5, "shard_col_vs_full": 2, "shard_vs_safetensors": 5,
    # the drop-in (gpu_hf.py)
    "hf_from_pretrained_hot": 6, "hf_from_pretrained_cold": 0.9, "engine_iterator_hot": 6,
    "first_load_fresh_mount": 0.85, "hook_peak_memory": 0.952,
    # tensor-parallel ranks (gpu_tp.py)
    "tp_world2": 5, "tp_world4": 5, "tp_world8": 5, "tp_rank_vs_ceiling": 0.8, "col_shard_vs_ref": 0.8,
    "tp_8procs_vs_pinned": 0.8,
}
KV_SIZES = ((16 << 10, "16k"), (64 << 10, "64k"), (256 << 10, "256k"), (1 << 20, "1m"))  # kv_16k, kv_write_16k, ...

_STAGED_PINNED = re.compile(r"^C ceiling pinned H2D .*?([\d.]+) GB/s", re.M)
_STAGED_A = re.compile(r"^A bounce\s+threads=\s*(\d+) chunk=\s*(\d+) MiB\s+([\d.]+) GB/s", re.M)
_STAGED_B = re.compile(r"^B pagecache-DMA .*?\s([\d.]+) GB/s", re.M)
_KV_LINE = re.compile(r"^([PABD])\s+(\d+) KiB blocks: (.*?)\s+([\d.]+) GB/s", re.M)
_MISMATCH = re.compile(r"^([A-D]) MISMATCH", re.M)


def parse_staged(text: str) -> dict:
    """staged_ceiling.cu's stdout: the pinned ceiling and its best pipeline."""
    best, name = None, ""
    for t, c, v in _STAGED_A.findall(text):
        if best is None or float(v) > best:
            best, name = float(v), f"staged_ceiling.cu bounce {t} threads x {c} MiB"
    for v in _STAGED_B.findall(text):
        if best is None or float(v) > best:
            best, name = float(v), "staged_ceiling.cu page-cache DMA"
    pinned = [float(v) for v in _STAGED_PINNED.findall(text)]
    return {"pinned": max(pinned) if pinned else None, "best": best, "best_name": name,
            "verify": "ok" if "verify sample: ok" in text else ("MISMATCH" if "MISMATCH" in text else None)}


def parse_kv(text: str) -> dict:
    """kv_blocks.cu's stdout: GB/s per method (P, A, B, D) per block size."""
    sizes = {}
    for method, kib, _, v in _KV_LINE.findall(text):
        sizes.setdefault(int(kib) << 10, {})[method] = float(v)
    pinned = [float(v) for v in _STAGED_PINNED.findall(text)]
    return {"pinned": max(pinned) if pinned else None, "sizes": sizes, "mismatch": _MISMATCH.findall(text)}


def by_name(doc) -> dict:
    return {r["name"]: r for r in (doc or {}).get("results", []) if "name" in r}


def gbps(r):
    return r.get("gbps") if r and not r.get("error") else None


def seconds(r):
    return r.get("seconds") if r and not r.get("error") else None


def best_prefix(results: dict, *prefixes):
    vals = [gbps(r) for n, r in results.items() if n.startswith(prefixes) and gbps(r)]
    return max(vals) if vals else None


def row(name, value, baseline, target, baseline_name, unit="GB/s", missing=(), note="", smaller=False):
    """One row; the ratio is a speed-up for time rows, and baseline / value
    for any row where smaller is better (memory)."""
    r = {"name": name, "value": value, "baseline": baseline, "ratio": None, "target": target, "met": False,
         "unit": unit, "baseline_name": baseline_name, "status": "measured"}
    if note:
        r["note"] = note
    if value is None or baseline is None or not value or not baseline:
        r.update(value=None, status=NOT_RUN,
                 missing=list(missing) or [w for w, v in (("value", value), ("baseline", baseline)) if not v])
        return r
    r["ratio"] = baseline / value if unit == "s" or smaller else value / baseline
    r["met"] = r["ratio"] >= target
    return r


def baselines(inp: dict) -> dict:
    """The yardsticks of the run, each None when not measured."""
    go, staged, kv = by_name(inp.get("go")), parse_staged(inp.get("ref_staged") or ""), parse_kv(inp.get("ref_kv") or "")
    pinned = [v for v in (staged["pinned"], kv["pinned"], best_prefix(go, "ceiling pinned H2D")) if v]
    return {"pinned": max(pinned) if pinned else None, "staged_best": staged["best"],
            "staged_best_name": staged["best_name"], "staged_verify": staged["verify"],
            "cold": best_prefix(go, "ceiling cold O_DIRECT", "ceiling cold buffered"), "kv": kv["sizes"],
            "kv_mismatch": kv["mismatch"]}


def hot_rows(inp: dict, b: dict) -> list:
    py = by_name(inp.get("py"))
    reg = gbps(py.get("phxmount load_into registered hot"))
    e2e = gbps(py.get("a phxmount ioctl (python client) hot"))
    st = gbps(py.get("c safetensors load_file cuda hot"))
    cold = gbps(py.get("a phxmount ioctl (python client) cold"))
    first = gbps(py.get("phxmount load_safetensors first load hot"))
    e2e_note = "best of N; registrations reused, as in a process that loads again" + \
        (f"; its first load in a fresh state: {first:.2f} GB/s" if first else "")
    return [
        row("hot_registered", reg, b["staged_best"], TARGETS["hot_registered"], b["staged_best_name"] or "staged_ceiling.cu best"),
        row("hot_registered_vs_pinned", reg, b["pinned"], TARGETS["hot_registered_vs_pinned"], "pinned H2D ceiling (best measured)"),
        row("hot_end_to_end", e2e, b["pinned"], TARGETS["hot_end_to_end"], "pinned H2D ceiling (best measured)", note=e2e_note),
        row("hot_vs_safetensors", e2e, st, TARGETS["hot_vs_safetensors"], "safetensors.torch.load_file(device=cuda), hot"),
        row("cold", cold, b["cold"], TARGETS["cold"], "best cold read ceiling (Go bench: O_DIRECT / buffered)"),
    ]


def kv_results(inp: dict, size: int, direction: str, side: str = "phxmount") -> list:
    """gpu_kv.py's row runs of one block size, direction and side (results
    without those fields are reads by the mount, named "kv 16KiB ...")."""
    out = []
    for r in (inp.get("kv") or {}).get("results", []):
        if not r.get("row", True) or r.get("direction", "read") != direction or r.get("side", "phxmount") != side:
            continue
        prefix = f"kv {size >> 10}KiB " if direction == "read" else f"kv write {size >> 10}KiB "
        if r.get("block") == size or (direction == "read" and r.get("name", "").startswith(prefix)):
            out.append(r)
    return out


def kv_row(name: str, mine: list, base, target, bname: str, note: str, refs=()) -> dict:
    """A KV row: the worse of the client thread counts, or "failed" when a
    run (its own or its baseline's) erred or found blocks that differ."""
    bad = [r["name"] for r in list(mine) + list(refs) if r.get("error") or r.get("mismatches")]
    vals = [gbps(r) for r in mine]
    value = min(vals) if len(vals) >= 2 and all(vals) and not bad else None
    depth = {x.get("inflight") for x in mine} - {None}
    r = row(name, value, base, target, bname, note=note +
            (f", each keeping {depth.pop()} BATCH ioctls in flight" if len(depth) == 1 else ""))
    if bad:
        r.update(status="failed", missing=[f"{n}: error or blocks that differ" for n in bad])
    return r


def kv_rows(inp: dict, b: dict) -> list:
    out = []
    for size, tag in KV_SIZES:
        ref = {m: v for m, v in b["kv"].get(size, {}).items() if m in "ABD"}
        base = max(ref.values()) if ref else None
        bname = f"kv_blocks.cu best of A/B/D ({max(ref, key=ref.get)})" if ref else "kv_blocks.cu"
        out.append(kv_row(f"kv_{tag}", kv_results(inp, size, "read"), base, TARGETS["kv"], bname,
                          "the worse of 1 and 4 client threads"))
    return out


def kv_write_rows(inp: dict, b: dict) -> list:
    """BATCH_WRITE of GPU blocks to scattered offsets against the reference
    pipeline in reverse (gpu_kv.py runs both): the worse of our thread
    counts against the best of the reference's."""
    out = []
    for size, tag in KV_SIZES:
        refs = kv_results(inp, size, "write", "reference")
        vals = [gbps(r) for r in refs if gbps(r)]
        best = max(refs, key=lambda r: gbps(r) or 0) if vals else None
        bname = (f"the reference pipeline in reverse, best of its thread counts ({best['name']})" if best
                 else "the reference pipeline in reverse (gpu_kv.py)")
        out.append(kv_row(f"kv_write_{tag}", kv_results(inp, size, "write"), max(vals) if vals else None,
                          TARGETS["kv_write"], bname, "the worse of 1 and 4 client threads, to the page cache "
                          "(no fsync)", refs))
    return out


def save_rows(inp: dict, b: dict) -> list:
    s = by_name(inp.get("save"))
    nofs = row("save_nofsync", gbps(s.get("phxmount save_safetensors")), gbps(s.get("safetensors save_file")), TARGETS["save_nofsync"],
               "safetensors.torch.save_file, same tensors, same file system")
    fs = row("save_fsync", gbps(s.get("phxmount save_safetensors fsync")), gbps(s.get("safetensors save_file fsync")),
             TARGETS["save_fsync"], "safetensors.torch.save_file + os.fsync")
    disk = row("save_fsync_vs_disk", gbps(s.get("phxmount save_safetensors fsync")), best_prefix(s, "disk write ceiling"),
               TARGETS["save_fsync_vs_disk"], "sequential write + fsync of the same bytes, same run (best of buffered "
               "and O_DIRECT)")
    return [nofs, fs, disk]


def shard_rows(inp: dict, b: dict) -> list:
    s = by_name(inp.get("shard"))
    full = seconds(s.get("phxmount full load_safetensors"))
    out = []
    for kind in ("row", "col"):
        mine = seconds(s.get(f"phxmount shard {kind}s"))
        st = seconds(s.get(f"safetensors get_slice {kind}s"))
        out.append(row(f"shard_{kind}_vs_full", mine, full, TARGETS[f"shard_{kind}_vs_full"], "full load_safetensors of the file",
                       unit="s"))
        out.append(row(f"shard_{kind}_vs_safetensors", mine, st, TARGETS["shard_vs_safetensors"],
                       f"safetensors get_slice, the same {kind} shards",
                       unit="s"))
    return [out[0], out[2], out[1], out[3]]


def extra_rows(docs) -> list:
    """Rows given as they are (other issues' tools): ratio and met
    recomputed where value, baseline and target are there."""
    out = []
    for doc in docs or []:
        for r in doc.get("rows", []):
            r = dict(r)
            if r.get("value") and r.get("baseline") and r.get("target") is not None:
                r.update({k: v for k, v in row(r["name"], r["value"], r["baseline"], r["target"],
                                               r.get("baseline_name", ""), r.get("unit", "GB/s")).items()
                          if k in ("ratio", "met", "status")})
            out.append(r)
    return out


def build(inp: dict) -> list:
    """Every row, in the issues' order, from the run's inputs: go, py, kv,
    shard, save (JSON documents), ref_staged, ref_kv (text), extra (a list
    of {"rows": [...]})."""
    b = baselines(inp)
    return hot_rows(inp, b) + kv_rows(inp, b) + kv_write_rows(inp, b) + save_rows(inp, b) + shard_rows(inp, b) + \
        extra_rows(inp.get("extra"))

"""The rows of docs/bench/gpu-latest.json from the raw outputs of a GPU
run (the Go bench, the reference programs, the Python loads, KV blocks,
shards, saving, and other tools' rows read back): parsing, baselines and
building. The format of a row, every row's target, unit and direction
(SPECS), and how a row is judged are rowspec.py's, re-exported here."""

import re
from typing import Optional

from rowspec import (FAILED, FIELDS, HIGHER, ISSUE27_ROWS, LOWER, MEASURED, NOT_RUN, SPECS, TABLES,  # noqa: F401
                     TARGETS, Spec, judge, judged_again, not_run, row, unmet)

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
    """kv_blocks.cu's stdout: GB/s per method (P, A, B, D) per block size,
    and the methods whose check of a block failed ("A MISMATCH", printed
    after that method's line), per block size (bad_sizes)."""
    sizes, bad, size = {}, {}, None
    for line in text.splitlines(keepends=True):
        m = _KV_LINE.match(line)
        if m:
            size = int(m.group(2)) << 10
            sizes.setdefault(size, {})[m.group(1)] = float(m.group(4))
            continue
        m = _MISMATCH.match(line)
        if m:
            bad.setdefault(size, []).append(m.group(1))
    pinned = [float(v) for v in _STAGED_PINNED.findall(text)]
    return {"pinned": max(pinned) if pinned else None, "sizes": sizes, "mismatch": _MISMATCH.findall(text),
            "bad_sizes": bad}


def staged_over_files(runs) -> dict:
    """staged_ceiling.cu run on each of a checkpoint's files, [(file bytes,
    its stdout)]: the rate of each of its configurations over all of them
    (the bytes it moved, file size rounded down to 4 KiB as it does, over
    the sum of its times on each file), and the best one: "ref" for the
    checkpoint's rows. A configuration missing from one file's output
    counts in none; a run that found a mismatch spoils the reference."""
    per = {}
    for size, text in runs:
        moved = size & ~4095
        confs = {f"bounce {t} threads x {c} MiB": float(v) for t, c, v in _STAGED_A.findall(text)}
        confs.update({"page-cache DMA": float(v) for v in _STAGED_B.findall(text)})
        for k, v in confs.items():
            if v > 0:
                b, s, n = per.get(k, (0, 0.0, 0))
                per[k] = (b + moved, s + moved / (v * 1e9), n + 1)
    rates = {k: b / s / 1e9 for k, (b, s, n) in per.items() if n == len(runs) and s > 0}
    bad = [i for i, (_, text) in enumerate(runs) if "MISMATCH" in text or "verify sample: ok" not in text]
    if not rates or bad:
        return {"best": None, "best_name": "", "rates": rates, "files": len(runs),
                "why": f"staged_ceiling.cu's check did not pass on file(s) {bad}" if bad else "no staged_ceiling.cu output"}
    k = max(rates, key=rates.get)
    return {"best": rates[k], "best_name": f"staged_ceiling.cu {k}, over {len(runs)} file(s)", "rates": rates,
            "files": len(runs)}


def by_name(doc) -> dict:
    return {r["name"]: r for r in (doc or {}).get("results", []) if "name" in r}


def gbps(r):
    return r.get("gbps") if r and not r.get("error") else None


def seconds(r):
    return r.get("seconds") if r and not r.get("error") else None


def why_not(*results) -> list:
    """Why results give no figure: their errors (a cold run that found the
    file resident says so), or nothing where none of them says."""
    return [f"{r.get('name', '')}: {r['error']}" for r in results if r and r.get("error")]


def best_prefix(results: dict, *prefixes):
    vals = [gbps(r) for n, r in results.items() if n.startswith(prefixes) and gbps(r)]
    return max(vals) if vals else None


def baselines(inp: dict) -> dict:
    """The yardsticks of the run, each None when not measured."""
    go, staged, kv = by_name(inp.get("go")), parse_staged(inp.get("ref_staged") or ""), parse_kv(inp.get("ref_kv") or "")
    pinned = [v for v in (staged["pinned"], kv["pinned"], best_prefix(go, "ceiling pinned H2D")) if v]
    return {"pinned": max(pinned) if pinned else None, "staged_best": staged["best"],
            "staged_best_name": staged["best_name"], "staged_verify": staged["verify"],
            "cold": best_prefix(go, "ceiling cold O_DIRECT", "ceiling cold buffered"), "kv": kv["sizes"],
            "kv_mismatch": kv["mismatch"], "kv_bad": kv["bad_sizes"]}


def hot_rows(inp: dict, b: dict) -> list:
    doc = inp.get("py") or {}
    py = by_name(doc)
    reg_r, e2e_r = py.get("phxmount load_into registered hot"), py.get("a phxmount ioctl (python client) hot")
    st_r, cold_r = py.get("c safetensors load_file cuda hot"), py.get("a phxmount ioctl (python client) cold")
    reg, e2e, st, cold = gbps(reg_r), gbps(e2e_r), gbps(st_r), gbps(cold_r)
    first = gbps(py.get("phxmount load_safetensors first load hot"))
    # gpu_bench.py's repetitions, as its file says them (N where it does not)
    n, ncold = doc.get("reps") or "N", doc.get("cold_reps") or "N"
    e2e_note = f"best of {n}; registrations reused, as in a process that loads again" + \
        (f"; its first load in a fresh state: {first:.2f} GB/s" if first else "")
    pinned = "pinned H2D ceiling (best measured)"
    return [
        row("hot_registered", reg, b["staged_best"], b["staged_best_name"] or "staged_ceiling.cu best",
            timed=f"load_into of every tensor, allocated and registered before the clock, best of {n} in one process",
            missing=why_not(reg_r)),
        row("hot_registered_vs_pinned", reg, b["pinned"], pinned, timed="the same loads", missing=why_not(reg_r)),
        row("hot_end_to_end", e2e, b["pinned"], pinned, note=e2e_note, missing=why_not(e2e_r),
            timed="load_safetensors(file, 0) end to end (header, allocation, registration, reads), best of "
                  f"{n} in one process"),
        row("hot_vs_safetensors", e2e, st, "safetensors.torch.load_file(device=cuda), hot", missing=why_not(e2e_r, st_r),
            timed=f"the same loads (best of {n} in one process, the registrations of its earlier loads reused) "
                  f"against load_file of the backing file, best of {n} in the same process (torch's cached "
                  "allocations reused, its caches emptied before its first)"),
        row("cold", cold, b["cold"], "best cold read ceiling (Go bench: O_DIRECT / buffered)", missing=why_not(cold_r),
            timed="load_safetensors after sync + drop_caches, the file's pages checked not resident (mincore) "
                  f"before the clock, best of {ncold}, in the process of the hot runs (its CUDA context made before"
                  + ("" if ncold == 1 else "; from the second run on, the registrations of the first reused") + ")"),
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


KV_BLOCKS_TOTAL = 2 << 30  # the bytes kv_blocks.cu moves per method and block size (its const total)


def moved(runs) -> Optional[int]:
    """The bytes each of gpu_kv.py's runs moved (blocks x block size), when
    they all say the same; None otherwise."""
    got = {r["blocks"] * r["block"] for r in runs if r.get("blocks") and r.get("block")}
    return got.pop() if len(got) == 1 and len(runs) == sum(1 for r in runs if r.get("blocks")) else None


def size_words(n) -> str:
    return "an unknown number of bytes" if not n else f"{n / (1 << 30):g} GiB" if n >= 1 << 30 else \
        f"{n / (1 << 20):g} MiB"


def kv_row(name: str, mine: list, base, bname: str, note: str, timed: str, refs=(), missing=(),
           ref_failed=()) -> dict:
    """A KV row: the worse of the client thread counts, or "failed" when a
    run (its own or its baseline's) erred or found blocks that differ
    (ref_failed: a reference program's failed checks)."""
    bad = [r["name"] for r in list(mine) + list(refs) if r.get("error") or r.get("mismatches")]
    vals = [gbps(r) for r in mine]
    value = min(vals) if len(vals) >= 2 and all(vals) and not missing else None
    depth = {x.get("inflight") for x in mine} - {None}
    return row(name, value, base, bname, timed=timed, note=note +
               (f", each keeping {depth.pop()} BATCH ioctls in flight" if len(depth) == 1 else ""),
               failed=[f"{n}: error or blocks that differ" for n in bad] + list(ref_failed), missing=missing)


def kv_rows(inp: dict, b: dict) -> list:
    out = []
    for size, tag in KV_SIZES:
        ref = {m: v for m, v in b["kv"].get(size, {}).items() if m in "ABD"}
        base = max(ref.values()) if ref else None
        bname = f"kv_blocks.cu best of A/B/D ({max(ref, key=ref.get)})" if ref else "kv_blocks.cu"
        mine = kv_results(inp, size, "read")
        n = moved(mine)
        # kv_blocks.cu moves 2 GiB: a run of other bytes is not its shape.
        missing = [f"our runs moved {size_words(n)}, kv_blocks.cu {size_words(KV_BLOCKS_TOTAL)}: not the same "
                   "shape"] if mine and n != KV_BLOCKS_TOTAL else []
        # A reference whose own check failed is no yardstick (as staged_over_files).
        spoilt = (b.get("kv_bad") or {}).get(size) or ([None] if None in (b.get("kv_bad") or {}) else [])
        out.append(kv_row(f"kv_{tag}", mine, base, bname, "the worse of 1 and 4 client threads",
                          f"the BATCH ioctls of {size_words(n)} of random blocks into shuffled slots of one buffer "
                          "registered before the clock, one run each; every block verified after", missing=missing,
                          ref_failed=[f"kv_blocks.cu's check found blocks that differ "
                                      f"({', '.join(x or '?' for x in spoilt)} MISMATCH)"] if spoilt else []))
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
        mine = kv_results(inp, size, "write")
        n = moved(mine)
        missing = [f"our runs moved {size_words(n)}, the reference {size_words(moved(refs))}: not the same shape"] \
            if mine and refs and n != moved(refs) else []
        out.append(kv_row(f"kv_write_{tag}", mine, max(vals) if vals else None, bname,
                          "the worse of 1 and 4 client threads, to the page cache (no fsync)",
                          f"the BATCH_WRITE ioctls of the buffer's shuffled slots ({size_words(n)}) to distinct random "
                          "blocks of a file (the file synced before), one run each; every block verified after", refs,
                          missing=missing))
    return out


def save_rows(inp: dict, b: dict) -> list:
    s = by_name(inp.get("save"))
    mine, mine_fs = s.get("phxmount save_safetensors"), s.get("phxmount save_safetensors fsync")
    nofs = row("save_nofsync", gbps(mine), gbps(s.get("safetensors save_file")),
               "safetensors.torch.save_file, same tensors, same file system", timed="save_safetensors of the "
               "tensors, best of N", missing=why_not(mine, s.get("safetensors save_file")))
    fs = row("save_fsync", gbps(mine_fs), gbps(s.get("safetensors save_file fsync")),
             "safetensors.torch.save_file + os.fsync", timed="save_safetensors(fsync=True), best of N",
             missing=why_not(mine_fs, s.get("safetensors save_file fsync")))
    disk = row("save_fsync_vs_disk", gbps(mine_fs), best_prefix(s, "disk write ceiling"),
               "sequential write + fsync of the same bytes, same run (best of buffered and O_DIRECT)",
               timed="save_safetensors(fsync=True), best of N", missing=why_not(mine_fs))
    return [nofs, fs, disk]


def shard_rows(inp: dict, b: dict) -> list:
    doc = inp.get("shard") or {}
    s = by_name(doc)
    full = seconds(s.get("phxmount full load_safetensors"))
    # gpu_bench_shard.py's rank, world and repetitions, as its file says them
    rank, world, n = (doc.get(k, "?") for k in ("rank", "world", "reps"))
    out = []
    for kind in ("row", "col"):
        mine = seconds(s.get(f"phxmount shard {kind}s"))
        st = seconds(s.get(f"safetensors get_slice {kind}s"))
        timed = (f"load_safetensors(shard=(dim, {rank}, {world})) of the {kind} shards of every 2-D tensor, best of {n} "
                 "in one process (the sides one after the other: full, then each kind ours then get_slice)")
        out.append(row(f"shard_{kind}_vs_full", mine, full, "full load_safetensors of the file", timed=timed))
        out.append(row(f"shard_{kind}_vs_safetensors", mine, st, f"safetensors get_slice, the same {kind} shards",
                       timed=timed))
    return [out[0], out[2], out[1], out[3]]


def extra_rows(docs) -> list:
    """Rows as other tools wrote them ({"rows": [...]}), each judged again
    by SPECS (judged_again): a file's own ratio, met or direction count for
    nothing."""
    return [judged_again(r) for doc in docs or [] for r in doc.get("rows", [])]


def complete(rows: list) -> list:
    """Every row of SPECS once, in SPECS' order: what no input measured is
    "not run"; a name that two inputs measured is failed (which run is
    meant cannot be told); rows SPECS does not know come last."""
    seen = {}
    for r in rows:
        seen.setdefault(r["name"], []).append(r)
    out = []
    for name in list(SPECS) + [n for n in seen if n not in SPECS]:
        got = seen.get(name)
        if not got:
            out.append(not_run(name, "no input of this report measured it"))
            continue
        r = got[0]
        if len(got) > 1:
            r = dict(r, status=FAILED, ratio=None, met=unmet(SPECS[name]) if name in SPECS else False,
                     missing=[f"measured {len(got)} times in this report's inputs (runs "
                              f"{sorted({str(x.get('run')) for x in got})}): which is meant cannot be told"])
        out.append(r)
    return out


def build(inp: dict) -> list:
    """Every row of SPECS, in its order, from the run's inputs: go, py, kv,
    shard, save (JSON documents), ref_staged, ref_kv (text), extra (a list
    of {"rows": [...]})."""
    b = baselines(inp)
    return complete(of_run(hot_rows(inp, b), inp.get("py")) + of_run(kv_rows(inp, b) + kv_write_rows(inp, b), inp.get("kv"))
                    + of_run(save_rows(inp, b), inp.get("save")) + of_run(shard_rows(inp, b), inp.get("shard"))
                    + extra_rows(inp.get("extra")))


def of_run(rows: list, doc) -> list:
    """Rows made from a tool's raw results say the run that measured them
    (the run its file names, benchlib.write_json), not the report's: a file
    left from an earlier call is not this run's."""
    run = (doc or {}).get("run")
    return [dict(r, run=dict(run)) if run and not r.get("run") else r for r in rows]


def stamp(rows: list, run: dict) -> list:
    """Each row that does not say which run measured it gets run."""
    return [r if r.get("run") else dict(r, run=dict(run)) for r in rows]

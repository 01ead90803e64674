"""The rows of docs/bench/gpu-latest.json: one format, defined here, from the
tool that measures to the report (docs/bench/README.md says it in words).

A row is
    {"name", "value", "unit", "direction", "baseline", "baseline_name",
     "ratio", "target", "met", "timed", "status"}
plus "missing" (why it has no figure), "note" and "run" ({"date",
"commit", "machine"}: which run measured it). "direction" says which way
the VALUE is better: "higher" (a rate) or "lower" (a time, a memory peak).
The ratio is always better when higher: value / baseline where higher is
better, baseline / value where lower is better (a speed-up, stock / ours);
met = ratio >= target. So a worse value gives a lower ratio whichever the
direction, and can never meet a target a better one misses.

Every row's target, unit and direction are in SPECS, once: row() takes
them from there, and a row read back from a tool's file (extra_rows) is
judged again with them, whatever the file says. A row whose inputs are
absent is "not run" (value, ratio null, met false) with "missing"; one
whose check failed is "failed"; a row with no target (recorded, not
held to anything) has target and met null. Nothing is typed in: a row
whose inputs are absent is "not run", never a number."""

import re
from dataclasses import dataclass
from typing import Optional

NOT_RUN = "not run"
FAILED = "failed"
MEASURED = "measured"
HIGHER, LOWER = "higher", "lower"
FIELDS = ("name", "value", "unit", "direction", "baseline", "baseline_name", "ratio", "target", "met", "timed",
          "status")


@dataclass(frozen=True)
class Spec:
    """What a row is: its target (the least ratio that meets it; None: no
    issue set one), the unit and direction of its value, and what it
    measures (the issue's words; a row that did not run says this)."""
    target: Optional[float]
    unit: str
    direction: str
    what: str


def _rate(target, what):
    return Spec(target, "GB/s", HIGHER, what)


def _time(target, what):
    return Spec(target, "s", LOWER, what)


# Every row, in the issues' order, defined once: row(), extra_rows(), the
# report's "not run" rows and its target lines read them here.
SPECS = {
    # issues 9 and 15 (gpu_bench, gpu_kv, gpu_bench_save, gpu_bench_shard)
    "hot_registered": _rate(0.95, "load_into, tensors allocated and registered before the clock / staged_ceiling.cu best"),
    "hot_registered_vs_pinned": _rate(0.9, "load_into, registered / the pinned H2D ceiling"),
    "hot_end_to_end": _rate(0.8, "load_safetensors, best of N in one process / the pinned H2D ceiling"),
    "hot_vs_safetensors": _rate(9, "load_safetensors / safetensors.torch.load_file(device=cuda:0)"),
    "cold": _rate(0.95, "load_safetensors after dropping caches (checked cold) / the best cold read"),
    # issue 27 lowered the small blocks' targets to 0.85
    "kv_16k": _rate(0.85, "KV blocks of 16 KiB read, the worse of 1 and 4 client threads / best kv_blocks.cu row"),
    "kv_64k": _rate(0.85, "KV blocks of 64 KiB read / best kv_blocks.cu row"),
    "kv_256k": _rate(0.9, "KV blocks of 256 KiB read / best kv_blocks.cu row"),
    "kv_1m": _rate(0.9, "KV blocks of 1 MiB read / best kv_blocks.cu row"),
    "kv_write_16k": _rate(0.85, "KV blocks of 16 KiB written / the reference pipeline in reverse"),
    "kv_write_64k": _rate(0.85, "KV blocks of 64 KiB written / the reference pipeline in reverse"),
    "kv_write_256k": _rate(0.9, "KV blocks of 256 KiB written / the reference pipeline in reverse"),
    "kv_write_1m": _rate(0.9, "KV blocks of 1 MiB written / the reference pipeline in reverse"),
    "save_nofsync": _rate(3, "save_safetensors / safetensors.torch.save_file"),
    "save_fsync": _rate(3, "save_safetensors(fsync=True) / save_file + fsync"),
    "save_fsync_vs_disk": _rate(0.9, "save_safetensors(fsync=True) / the disk's write + fsync ceiling"),
    "shard_row_vs_full": _time(5, "rank 0 of 8, row shards / a full load_safetensors"),
    "shard_col_vs_full": _time(2, "rank 0 of 8, column shards / a full load_safetensors"),
    "shard_row_vs_safetensors": _time(5, "rank 0 of 8, row shards / safetensors get_slice"),
    "shard_col_vs_safetensors": _time(5, "rank 0 of 8, column shards / safetensors get_slice"),
    # issue 10 (gpu_two)
    "two_gpu_shards": _rate(0.95, "one shard per GPU, one process / two_gpu.cu bounce, 2 GPUs"),
    "two_gpu_processes": _rate(0.95, "one process per GPU / two_gpu.cu bounce, 2 GPUs"),
    "two_gpu_replicated": _rate(1.6, "one shard onto both GPUs, bytes landed / onto one GPU"),
    "two_gpu_cold": _rate(0.95, "both shards after dropping caches (checked cold) / the best cold read"),
    # issue 19, the drop-in (gpu_hf)
    "hf_from_pretrained_hot": _time(6, "from_pretrained, loading only (CUDA context and the model's module before "
                                       "the clock), stock / hooked"),
    "hf_from_pretrained_user": _time(None, "from_pretrained as a user's program sees it (the whole call in a fresh "
                                           "process, the model's module imported inside it), stock / hooked"),
    "hf_from_pretrained_cold": _rate(0.9, "hooked from_pretrained after dropping caches (checked cold) / the best "
                                          "cold read"),
    "engine_iterator_hot": _time(6, "the engines' loop (get_tensor, copy_), stock / PHXMOUNT_HOOK=cuda:0"),
    "first_load_fresh_mount": _rate(0.85, "load_safetensors of every file, fresh process, fresh mount / pinned"),
    "hook_peak_memory": Spec(0.952, "bytes", LOWER, "hooked from_pretrained's peak reserved GPU memory, stock / "
                                                    "hooked"),
    # issue 20, tensor-parallel ranks (gpu_tp)
    "tp_world2": _time(5, "the get_slice loop, world 2, stock / hooked, a fresh process per repetition"),
    "tp_world4": _time(5, "the get_slice loop, world 4, stock / hooked, a fresh process per repetition"),
    "tp_world8": _time(5, "the get_slice loop, world 8, stock / hooked, a fresh process per repetition"),
    "tp_rank_vs_ceiling": _time(0.8, "world 8 rank 7 in one load_safetensors call per file / its bytes at the "
                                     "pinned ceiling + 10 ms"),
    "col_shard_vs_ref": _rate(0.8, "the dim-1 tensors' shards, one call per file / col_shard.cu"),
    # issue 27, the shapes users have (gpu_shapes)
    "moe_load_file_vs_ref": _rate(0.85, "hooked load_file of every file of the MoE checkpoint / ref"),
    "moe_engine_vs_ref": _rate(0.85, "the engines' default loop with PHXMOUNT_HOOK=cuda:0, MoE / ref"),
    "moe_from_pretrained_bytes_vs_ref": _rate(0.85, "hooked from_pretrained, first read to last landed, MoE / ref"),
    "moe_from_pretrained_hot": _time(None, "from_pretrained of the MoE checkpoint, the whole call in a fresh "
                                           "process, stock / hooked"),
    "moe_from_pretrained_load": _time(None, "from_pretrained of the MoE checkpoint, loading only, stock / hooked"),
    "dense20_from_pretrained_bytes_vs_ref": _rate(0.85, "hooked from_pretrained, first read to last landed, the "
                                                        "dense >= 20 GB checkpoint / ref"),
    "dense20_from_pretrained_hot": _time(3, "from_pretrained of the dense >= 20 GB checkpoint, the whole call in a "
                                           "fresh process, stock / hooked"),
    "dense20_from_pretrained_load": _time(None, "from_pretrained of the dense >= 20 GB checkpoint, loading only, "
                                                "stock / hooked"),
    "vllm_tp_world2": _time(3, "vLLM's narrow loop, world 2, last rank, stock / hooked"),
    "vllm_tp_world4": _time(3, "vLLM's narrow loop, world 4, last rank, stock / hooked"),
    "vllm_tp_world8": _time(3, "vLLM's narrow loop, world 8, last rank, stock / hooked"),
    "slice_tp_world8": _time(4, "the get_slice loop at world 8, last rank, stock / hooked"),
    "tp_8procs_vs_pinned": _rate(0.8, "8 rank processes of world 8 at once, aggregate / the pinned ceiling"),
    "whole_file_vs_ref": _rate(0.95, "load_safetensors of one large file, fresh process / ref (no regression)"),
}
TARGETS = {k: s.target for k, s in SPECS.items()}
# The rows of issue 27's Targets table, in its order (gpu-test.sh issue27).
ISSUE27_ROWS = ("moe_load_file_vs_ref", "moe_engine_vs_ref", "moe_from_pretrained_bytes_vs_ref",
                "dense20_from_pretrained_bytes_vs_ref", "dense20_from_pretrained_hot", "vllm_tp_world2",
                "vllm_tp_world4", "vllm_tp_world8", "slice_tp_world8", "tp_8procs_vs_pinned", "kv_16k", "kv_64k",
                "kv_write_16k", "kv_write_64k", "whole_file_vs_ref")
TABLES = {"issue27": ISSUE27_ROWS}  # the tables a report can show on their own (gpu_report.py --table)
KV_SIZES = ((16 << 10, "16k"), (64 << 10, "64k"), (256 << 10, "256k"), (1 << 20, "1m"))  # kv_16k, kv_write_16k, ...

_STAGED_PINNED = re.compile(r"^C ceiling pinned H2D .*?([\d.]+) GB/s", re.M)
_STAGED_A = re.compile(r"^A bounce\s+threads=\s*(\d+) chunk=\s*(\d+) MiB\s+([\d.]+) GB/s", re.M)
_STAGED_B = re.compile(r"^B pagecache-DMA .*?\s([\d.]+) GB/s", re.M)
_KV_LINE = re.compile(r"^([PABD])\s+(\d+) KiB blocks: (.*?)\s+([\d.]+) GB/s", re.M)
_MISMATCH = re.compile(r"^([A-D]) MISMATCH", re.M)


def judge(value, baseline, direction: str, target):
    """(ratio, met) of a measured value against its baseline: the ratio
    better when higher whichever the direction, met = ratio >= target
    (None without a target). (None, False) when either figure is absent or
    not positive: nothing to judge is never met."""
    if direction not in (HIGHER, LOWER):
        raise ValueError(f"direction {direction!r}: want {HIGHER!r} or {LOWER!r}")
    if not _positive(value) or not _positive(baseline):
        return None, False
    ratio = value / baseline if direction == HIGHER else baseline / value
    return ratio, (None if target is None else ratio >= target)


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 and x == x and x != float("inf")


def row(name, value, baseline, baseline_name, *, timed, missing=(), note="", failed=()):
    """One row of SPECS[name] (its target, unit and direction): the value
    and baseline measured in this run, what the clock held (timed), and,
    for a figure that is absent, why (missing). failed: the checks that
    failed (a tensor that differs from stock): the row has no figure then."""
    spec = SPECS[name]
    r = {"name": name, "value": value, "unit": spec.unit, "direction": spec.direction, "baseline": baseline,
         "baseline_name": baseline_name, "ratio": None, "target": spec.target, "met": unmet(spec), "timed": timed,
         "status": MEASURED}
    if note:
        r["note"] = note
    if failed:
        r.update(value=None, status=FAILED, missing=list(failed))
        return r
    ratio, met = judge(value, baseline, spec.direction, spec.target)
    if ratio is None:
        r.update(value=None, status=NOT_RUN,
                 missing=list(missing) or [w for w, v in (("value", value), ("baseline", baseline)) if not _positive(v)])
        return r
    r.update(ratio=ratio, met=met)
    return r


def unmet(spec: Spec):
    """met of a row of spec with no figure: false, or None where there is
    no target to meet."""
    return None if spec.target is None else False


def not_run(name, why) -> dict:
    """The row of SPECS[name] that no input of this report measured."""
    return row(name, None, None, "", timed=SPECS[name].what, missing=[why])


def judged_again(r: dict) -> dict:
    """A row read back from a tool's file, judged again by SPECS: its
    target, unit and direction are SPECS', its ratio and met recomputed
    from its value and baseline. A row SPECS does not know, or whose unit
    or direction disagrees with SPECS', is failed: no file decides which
    way its own figure is better."""
    r = dict(r)
    spec = SPECS.get(r.get("name"))
    bad = []
    if spec is None:
        bad.append(f"{r.get('name')!r} is not a row of gpu_rows.SPECS")
    else:
        for k, want in (("unit", spec.unit), ("direction", spec.direction)):
            if r.get(k) is not None and r[k] != want:
                bad.append(f"its {k} {r[k]!r} is not SPECS' {want!r}")
    if bad:
        r.update(status=FAILED, ratio=None, met=False, missing=list(r.get("missing") or []) + bad)
        return r
    r.update(unit=spec.unit, direction=spec.direction, target=spec.target)
    r.setdefault("timed", spec.what)
    r.setdefault("baseline_name", "")
    if r.get("status", MEASURED) != MEASURED:
        r.update(ratio=None, met=unmet(spec))
        return r
    ratio, met = judge(r.get("value"), r.get("baseline"), spec.direction, spec.target)
    if ratio is None:
        r.update(status=NOT_RUN, ratio=None, met=unmet(spec),
                 missing=list(r.get("missing") or []) or ["value or baseline absent"])
    else:
        r.update(status=MEASURED, ratio=ratio, met=met)
    return r


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

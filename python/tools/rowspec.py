"""The rows of docs/bench/gpu-latest.json: one format, defined here, from the
tool that measures to the report (docs/bench/README.md says it in words;
gpu_rows.py makes the rows of the raw inputs).

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
        bad.append(f"{r.get('name')!r} is not a row of rowspec.SPECS")
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

"""The drop-in as users meet it (issue 19): stock programs on a phxmount mount
with PHXMOUNT_HOOK set, against the same programs without it, on a
Llama-shaped bf16 checkpoint that transformers itself writes
(save_pretrained from a config and random weights).

    gpu_hf.py gen --dir D          the checkpoint (hidden 4096, MLP 14336, 32/8
                                   heads, vocab 128256, LAYERS layers) in D
    gpu_hf.py run --mount-dir M --backing-dir B --ckpt NAME --phxmount BIN --out J
                                   every check and row below, each measurement
                                   in a fresh process; J: results and rows

Each measurement is one fresh Python process (imports outside the clock):
* stock: AutoModelForCausalLM.from_pretrained(B/NAME, dtype=bfloat16,
  device_map="cuda:0"), timed, with torch's peak reserved memory, loading
  only: the CUDA context and the model's modules, which from_pretrained
  imports lazily, made and imported before the clock on both sides;
* user: the same call as a user's program sees it, stock and hooked:
  torch and transformers imported at the top, then the whole call, its
  CUDA context and the model's module made and imported inside it (and
  the time from the interpreter's start beside it);
* hooked: the same call on M/NAME with PHXMOUNT_HOOK=1 (no other change),
  timed, peak; then, in the same process, the stock call on B/NAME and
  every parameter and buffer compared (torch.equal); load_file of a file on
  the mount with device="cpu" must give host tensors equal to stock's; a
  file off the mount must get the real safetensors' object;
* engine: safe_open(f, framework="pt", device="cpu"), every key, get_tensor,
  copied into a GPU tensor allocated before the clock from the files'
  headers, nothing opened through the mount before it (vLLM's and SGLang's
  default loading loop), stock on B/NAME (off the mount) and on M/NAME
  with PHXMOUNT_HOOK=cuda:0; the hooked one compared with a stock loop on B;
* cold: caches dropped, the hooked from_pretrained; the cold-read ceiling
  (the checkpoint's files read with 8 threads, O_DIRECT 16 MiB and buffered
  1 MiB, caches dropped before each; the better one) in the same run; each
  cold side checks, right before its clock, that no page of the files is
  resident (mincore, benchlib.check_cold), and is not run where one is;
* first load: a fresh mount, a fresh process, phxmount.load_safetensors of
  every file (in parallel; the name imported before the clock, as a
  program imports it at its start); the pinned host-to-device ceiling
  measured in a fresh process beside it.

Rows (gpu_rows.row, targets in gpu_rows.SPECS; every ratio higher-is-better):
hf_from_pretrained_hot (loading only, stock s / hooked s),
hf_from_pretrained_user (the whole call, stock s / hooked s; no target),
hf_from_pretrained_cold (hooked GB/s / cold ceiling), engine_iterator_hot
(without / with), first_load_fresh_mount (GB/s / pinned), hook_peak_memory
(lower is better: stock peak / hooked peak, within 1.05x). One run each,
hot unless named cold.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import NotCold, check_cold, cold_start, fresh as fresh_process, in_threads, pinned_ceiling_gbps, say, \
    warm, write_json  # noqa: E402
from hf_rows import build_rows, checks  # noqa: E402
import shapes_children  # noqa: E402
from tploops import files_of  # noqa: E402

LAYERS = 12
GB = 1e9
T_LOAD = 0.0  # when the timed from_pretrained began (the hook's times are given from it)


def gen(d: str) -> None:
    """The checkpoint, written by transformers (skipped when it is there)."""
    if os.path.exists(os.path.join(d, "config.json")):
        say(f"checkpoint {d}: there")
        return
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                      num_hidden_layers=LAYERS, vocab_size=128256, torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cuda:0"):
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    m.save_pretrained(d, max_shard_size="5GB")  # 2 files, as the checkpoint
    os.sync()
    say(f"checkpoint {d}: {ckpt_bytes(d) / GB:.2f} GB in {len(ckpt_files(d))} files")


ckpt_files = files_of  # a checkpoint's .safetensors files, in order


def ckpt_bytes(d: str) -> int:
    return sum(os.path.getsize(f) for f in ckpt_files(d))


# --- the fresh processes --------------------------------------------------------------

def child(kind: str, args) -> dict:
    """One measurement in this (fresh) process; its JSON goes to stdout."""
    import torch
    import transformers
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    from transformers import AutoModelForCausalLM
    if kind != "user":  # loading only; the user's call makes both inside it
        torch.cuda.init()
        torch.empty(1, device="cuda:0")  # the CUDA context, outside the clock (as a serving process has it)
        # The model's code, outside the clock on both sides: from_pretrained
        # imports it lazily, about 0.5 s in a fresh process that loads no byte.
        import transformers.models.llama.modeling_llama  # noqa: F401

    def load(d):
        global T_LOAD
        t0 = T_LOAD = time.perf_counter()
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, device_map="cuda:0")
        torch.cuda.synchronize()
        return m, time.perf_counter() - t0

    out = {"kind": kind}
    if args.cold:  # the parent dropped the caches: none of the files may be resident as the clock starts
        try:
            out["cold_check"] = check_cold(ckpt_files(args.dir_backing or args.dir),
                                           ckpt_files(args.dir) if args.dir_backing else ())
        except NotCold as e:
            return {"kind": kind, "error": f"NotCold: {e}"}
    if kind == "user":
        m, out["seconds"] = load(args.dir)
        out["process_s"] = time.time() - args.spawned if args.spawned else None
        out["bytes"] = ckpt_bytes(args.dir)
        if args.ref:
            out.update(hook_checks(args, m, load))
    elif kind in ("stock", "hooked"):
        prof = os.environ.get("PHX_HF_PROFILE")
        if prof:  # where the time of the load goes (not in the rows: a profiled run is slower)
            import cProfile
            import pstats
            pr = cProfile.Profile()
            pr.enable()
            m, _ = load(args.dir)
            pr.disable()
            with open(f"{prof}-{kind}.txt", "w") as f:
                pstats.Stats(pr, stream=f).sort_stats("cumulative").print_stats(40)
            del m
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        m, out["seconds"] = load(args.dir)
        out["peak_reserved"] = torch.cuda.max_memory_reserved(0)
        out["peak_allocated"] = torch.cuda.max_memory_allocated(0)
        out["bytes"] = ckpt_bytes(args.dir)
        if kind == "hooked":
            out.update(hook_checks(args, m, load))
    elif kind == "engine":
        out.update(engine_loop(args))
    elif kind == "first":
        out.update(first_load(args))
    elif kind == "pinned":
        out.update(pinned())
    return out


def hook_checks(args, m, load) -> dict:
    import torch
    import safetensors
    import safetensors.torch
    from phxmount import hook
    r = hook.report
    out = {"hook_summary": r.summary(), "hook_files": r.files, "hook_starts": r.starts,
           "hook_first_read_s": r.first - T_LOAD if r.first else None,
           "hook_last_landed_s": r.last - T_LOAD if r.last else None,
           "hook_fallbacks": hook.report.fallbacks}
    ref, _ = load(args.ref)
    want = dict(ref.named_parameters()) | dict(ref.named_buffers())
    got = dict(m.named_parameters()) | dict(m.named_buffers())
    out["params"] = len(want)
    out["params_on_gpu"] = sum(1 for t in got.values() if t.device.type == "cuda")
    out["mismatch"] = sorted(k for k in want if k not in got or not torch.equal(got[k], want[k]))[:10]
    del ref, m
    f_mount, f_back = ckpt_files(args.dir)[-1], ckpt_files(args.ref)[-1]
    host = safetensors.torch.load_file(f_mount, device="cpu")
    stock = safetensors.torch.load_file(f_back, device="cpu")
    out["host_tensors"] = len(host)
    out["host_not_cpu"] = sorted(k for k, t in host.items() if t.device.type != "cpu")[:5]
    out["host_mismatch"] = sorted(k for k in stock if k not in host or not torch.equal(host[k], stock[k]))[:5]
    with safetensors.safe_open(f_back, framework="pt", device="cpu") as f:
        out["off_mount_type"] = f"{type(f).__module__}.{type(f).__name__}"
    out["off_mount_stock"] = not isinstance(f, hook.HookedFile)
    return out


def engine_loop(args) -> dict:
    """The engines' loop into GPU tensors allocated before the clock
    (shapes_children.engine_loop)."""
    import torch
    loop = shapes_children.engine_loop

    got, secs = loop(args.dir)
    out = {"seconds": secs, "bytes": ckpt_bytes(args.dir), "tensors": len(got)}
    if args.ref:
        want, _ = loop(args.ref)
        out["mismatch"] = sorted(k for k in want if not torch.equal(got[k], want[k]))[:10]
    hook = sys.modules.get("phxmount.hook")  # importing it would turn it on
    out["hook_summary"] = hook.report.summary() if hook is not None and hook._mode.on else "off"
    return out


def first_load(args) -> dict:
    import torch
    # What a program does at its start: from phxmount import load_safetensors
    # (the package imports its loading modules at that name's first use).
    from phxmount import LoadStats, load_safetensors
    files = ckpt_files(args.dir)
    t0 = time.perf_counter()
    res = [None] * len(files)
    stats = [LoadStats() for _ in files]

    def one(i):
        res[i] = load_safetensors(files[i], device=0, stats=stats[i])
    in_threads(one, len(files))
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    n = sum(t.numel() * t.element_size() for r in res for t in r.values())
    per = [{k: getattr(st, k) for k in ("seconds", "io_seconds", "ioctls", "extents", "transport")} | st.extra
           for st in stats]
    return {"seconds": secs, "bytes": n, "gbps": n / secs / GB, "files": per}


def pinned() -> dict:
    return {"gbps": pinned_ceiling_gbps()}


def fresh(kind: str, d: str, ref: str = "", hook: str = "", timeout: float = 300, profile: str = "",
          cold_backing: str = "") -> dict:
    """child(kind) in a fresh process (PHXMOUNT_HOOK=hook, or unset);
    profile: a path prefix for a cProfile of one extra load first;
    cold_backing: the checkpoint's backing directory, whose files (and d's)
    the child checks cold right before its clock."""
    env = {k: v for k, v in os.environ.items() if k != "PHX_HF_PROFILE"}
    if profile:
        env["PHX_HF_PROFILE"] = profile
    cmd = [sys.executable, os.path.abspath(__file__), "child", kind, "--dir", d, "--ref", ref,
           "--spawned", repr(time.time())] + (["--cold", "--dir-backing", cold_backing] if cold_backing else [])
    say(f"fresh process: {kind} {d}" + (f" (PHXMOUNT_HOOK={hook})" if hook else ""))
    res = fresh_process(cmd, hook=hook, timeout=timeout, env=env, pythonpath=[PYDIR])
    res.setdefault("kind", kind)
    say(f"  {json.dumps(res)[:400]}")
    return res


PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def engine_sides(mnt: str, back: str) -> dict:
    """The engines' loop, each side in a fresh process: stock on the
    backing directory (the files as a program without phxmount reads them;
    through the mount they would come through the FUSE page cache, slower
    than the backing file system's, and cold in it: docs/perf-notes.md),
    hooked on the mount with PHXMOUNT_HOOK=cuda:0, compared with stock's
    loop on the backing directory after its clock."""
    return {"engine_stock": fresh("engine", back), "engine_hooked": fresh("engine", mnt, back, hook="cuda:0")}


def cold_ceiling(files) -> dict:
    """The checkpoint read cold, 8 threads, O_DIRECT 16 MiB and buffered
    1 MiB chunks (caches dropped before each): GB/s of each."""
    import mmap
    out = {}
    total = sum(os.path.getsize(f) for f in files)
    for name, flags, chunk in (("odirect", os.O_DIRECT, 16 << 20), ("buffered", 0, 1 << 20)):
        try:
            cold_start(files)
        except NotCold as e:
            out[name] = {"error": f"NotCold: {e}"}
            continue
        jobs = [(f, off) for f in files for off in range(0, os.path.getsize(f), chunk)]
        lock = threading.Lock()

        def worker():
            buf = mmap.mmap(-1, chunk)
            fds = {f: os.open(f, os.O_RDONLY | flags) for f in files}
            try:
                while True:
                    with lock:
                        if not jobs:
                            return
                        f, off = jobs.pop()
                    os.preadv(fds[f], [buf], off)
            finally:
                for fd in fds.values():
                    os.close(fd)
        t0 = time.perf_counter()
        ts = [threading.Thread(target=worker) for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        out[name] = {"gbps": total / (time.perf_counter() - t0) / GB}
    return out


class Mount:
    """A fresh phxmount --vendor nvidia of the backing directory."""

    def __init__(self, binary: str, backing: str):
        self.bin, self.mnt = binary, tempfile.mkdtemp(prefix="phxhf-")
        self.log = open(os.path.join(tempfile.gettempdir(), "phxhf-mount.log"), "a")
        self.p = subprocess.Popen([binary, "--vendor", "nvidia", backing, self.mnt], stdout=self.log,
                                  stderr=subprocess.STDOUT)
        if subprocess.run([binary, "wait", "--timeout", "20", self.mnt]).returncode != 0:
            self.close()
            raise RuntimeError("phxmount did not mount")

    def close(self):
        subprocess.run(["umount", self.mnt], check=False)
        self.p.wait(timeout=20)
        os.rmdir(self.mnt)


def run(a) -> int:
    back, mnt = os.path.join(a.backing_dir, a.ckpt), os.path.join(a.mount_dir, a.ckpt)
    files = ckpt_files(back)
    nbytes = ckpt_bytes(back)
    say(f"checkpoint {back}: {len(files)} files, {nbytes / GB:.2f} GB")
    for f in files:
        warm(f)
    r = {"bytes": nbytes}
    r["stock"] = fresh("stock", back)
    r["hooked"] = fresh("hooked", mnt, back, hook="1")
    r["user_stock"] = fresh("user", back)
    r["user_hooked"] = fresh("user", mnt, back, hook="1")
    if a.profile:
        prof = os.path.join(os.path.dirname(os.path.abspath(a.out)), "hf-profile")
        r["profiled"] = {k: fresh(k, d, ref, hook=h, profile=prof) for k, d, ref, h in
                         (("stock", back, "", ""), ("hooked", mnt, back, "1"))}
    r.update(engine_sides(mnt, back))
    r["cold_ceiling"] = cold_ceiling(files)
    try:
        r["cold_start"] = cold_start(files, ckpt_files(mnt))
        r["hooked_cold"] = fresh("hooked", mnt, back, hook="1", cold_backing=back)
    except NotCold as e:
        r["hooked_cold"] = {"error": f"NotCold: {e}"}
    for f in files:
        warm(f)
    r["pinned"] = fresh("pinned", back)
    try:
        m2 = Mount(a.phxmount, a.backing_dir)
    except RuntimeError as e:
        r["first"] = {"error": str(e)}
    else:
        try:
            r["first"] = fresh("first", os.path.join(m2.mnt, a.ckpt))
        finally:
            m2.close()
    fails = checks(r)
    rows = build_rows(r)
    write_json(a.out, {"results": r, "rows": rows, "failures": fails})
    for x in rows:
        say(f"row {x['name']}: {x['value']} vs {x['baseline']} ({x['baseline_name']}): ratio "
            f"{x['ratio'] if x['ratio'] is None else round(x['ratio'], 3)}, target {x['target']}, met {x['met']}")
    for f in fails:
        print(f"FAIL {f}", flush=True)
    print("PASS drop-in checks" if not fails else f"{len(fails)} drop-in check(s) failed", flush=True)
    return 1 if fails else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--dir", required=True)
    c = sub.add_parser("child")
    c.add_argument("kind")
    c.add_argument("--dir", required=True)
    c.add_argument("--ref", default="")
    c.add_argument("--spawned", type=float, default=0.0, help="time.time() when the parent started it")
    c.add_argument("--cold", action="store_true", help="check the files not resident before the clock")
    c.add_argument("--dir-backing", default="", help="with --cold: the backing directory of --dir")
    r = sub.add_parser("run")
    for k in ("--mount-dir", "--backing-dir", "--ckpt", "--phxmount", "--out"):
        r.add_argument(k, required=True)
    r.add_argument("--profile", action="store_true", help="also a cProfile of each side's load (hf-profile-*.txt)")
    a = ap.parse_args(argv)
    if a.cmd == "gen":
        gen(a.dir)
        return 0
    if a.cmd == "child":
        print(json.dumps(child(a.kind, a)), flush=True)
        return 0
    return run(a)


if __name__ == "__main__":
    sys.exit(main())

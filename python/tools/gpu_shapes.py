"""Issue 27's rows on the shapes users have, in one run (gpu-test.sh issue27):
the checkpoints of ckpt_gen.py (a MoE in the hub's per-expert layout, a
dense >= 20 GB one in >= 10 files, a Qwen2 with q/k/v biases, tied
embeddings and F32 norms, a KV file), the reference programs on the same
files in the same run ("ref": staged_ceiling.cu's best configuration over
the checkpoint's files; kv_blocks.cu on the KV file), and every row in a
fresh process per repetition, stock and hooked taking turns.

    gpu_shapes.py run --backing-dir B --mount-dir M --ckpt-root B/ckpt27 --ref-dir R
        --raw RAW --out run-shapes.json [--quick] [--reps N] [--budget-s S]
    gpu_shapes.py plan [--quick] [--reps N] [--budget-s S]   the steps and their time, no GPU

The processes are shapes_children.py's and tploops.py's, the rows
shapes_rows.py's. What each row's clock holds (SPECS in rowspec.py names
the rows):
* moe_load_file_vs_ref: safetensors.torch.load_file(f, device="cuda:0")
  of every file in turn, PHXMOUNT_HOOK=1; the CUDA context made before;
* moe_engine_vs_ref: safe_open(f, framework="pt", device="cpu"), get_tensor
  in key order, copy_ into GPU parameters allocated before the clock,
  PHXMOUNT_HOOK=cuda:0;
* *_from_pretrained_hot: AutoModelForCausalLM.from_pretrained(d,
  dtype=bfloat16, device_map="cuda:0") as a user's program sees it: torch
  and transformers imported at the top, then the whole call (the CUDA
  context and the model's module made and imported inside it); the time
  from the interpreter's start (the process spawned) to the model loaded
  is recorded beside it;
* *_from_pretrained_load: the same call, loading only: the CUDA context
  and the model's module made and imported before the clock;
* *_from_pretrained_bytes_vs_ref: the hook's own span in the loading-only
  processes, from the first read asked for to the last tensor landed (its
  bytes in device memory: a read the hook started ahead lands before
  transformers asks for it; the whole call is the _hot row's);
* vllm_tp_world{2,4,8}, slice_tp_world8: tploops.py's narrow and slice
  loops, rank W-1, on the Qwen2 checkpoint;
* tp_8procs_vs_pinned: 8 processes at once, one per rank of world 8, the
  hooked slice loop on the dense checkpoint, all ranks' bytes from the
  first start to the last end, against the pinned ceiling (a fresh process);
* whole_file_vs_ref: phxmount.load_safetensors of the dense checkpoint's
  largest file (the name imported before the clock) against
  staged_ceiling.cu on that file;
* kv_*: gpu_kv.py (16 and 64 KiB blocks, read and written) and kv_blocks.cu
  on the KV file; gpu_rows.py makes those rows from their outputs.
Stock reads the same files off the mount (the backing directory). Each
row is the best of --reps fresh processes a side, the from_pretrained
rows of FP_REPS (their timed says which). The first hooked process
of each row compares every tensor (or parameter and buffer) with stock's,
loaded after its clock in the same process off the mount (bytes, dtype,
shape, device); a difference, a hooked side that did not go through
phxmount or fell back to safetensors, is a failure and the row has no
figure. A step that the time left cannot hold is not run, and its rows say
so. --quick: the quick checkpoints (ckpt_gen QUICK), one repetition, one
file per checkpoint for the reference, for a first look in under 200 s;
its rows say QUICK and are no issue's figures."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_gen  # noqa: E402
import gpu_rows  # noqa: E402
from benchlib import fresh, in_threads, resident_pages, say, warm, write_json  # noqa: E402
import shapes_rows  # noqa: E402
from stepbudget import Budget  # noqa: E402
from shapes_rows import FP_REPS, NOT_RUN_ERROR, hook_fails, check_fails  # noqa: E402
from tploops import files_of  # noqa: E402

GB = 1e9
HERE = os.path.abspath(__file__)
PYDIR = os.path.dirname(os.path.dirname(HERE))
TOOLS = os.path.dirname(HERE)
CHILD = os.path.join(TOOLS, "shapes_children.py")
STARTUP_S = 3.5  # a fresh process: python, torch, the CUDA context (the plan's guess, printed beside the actuals)
# and transformers with the model's module, and building the model: run 34
# measured 17-20 s a from_pretrained process in all (its call 0.3-2.3 s)
HF_STARTUP_S = 15.0
STOCK_GBPS, HOOKED_GBPS = 5.0, 20.0  # the plan's guesses of the loads' rates


# --- the run --------------------------------------------------------------------------

class Run:
    """One issue-27 run: where the checkpoints are, on the mount and off
    it, the budget, and what was measured."""

    def __init__(self, a):
        self.a = a
        self.spec = ckpt_gen.specs(a.quick)
        self.budget = Budget(a.budget_s)
        self.res = {"quick": a.quick, "reps": a.reps, "refs": {}, "procs": {}}
        self.fails = []
        self.dirs = {}
        for name in ("moe", "dense20", "qwen2", "kv"):
            lay = ckpt_gen.layout(name, self.spec[name])
            back = ckpt_gen.path_of(a.ckpt_root, lay)
            rel = os.path.relpath(back, a.backing_dir)
            self.dirs[name] = {"back": back, "mnt": os.path.join(a.mount_dir, rel), "layout": lay}

    def have(self, name) -> bool:
        return os.path.exists(os.path.join(self.dirs[name]["back"], ckpt_gen.DONE))

    def proc(self, tool_argv, hook="", timeout=300.0, tag="", side="") -> dict:
        left = self.budget.left()
        if left < 5:
            return {"error": f"{NOT_RUN_ERROR} no time left in the budget"}
        r = fresh([sys.executable] + tool_argv, hook=hook, timeout=min(timeout, left), pythonpath=[PYDIR])
        say(f"  {tag} {side or ('PHXMOUNT_HOOK=' + hook if hook else 'stock')}: " + (
            f"ERROR {r['error'][-300:]}" if r.get("error") else json.dumps(
                {k: v for k, v in r.items() if k in ("seconds", "gbps", "bytes", "tensors", "mismatch", "process_s")})))
        self.res["procs"].setdefault(tag, []).append(dict(r, hook_mode=hook or "off"))
        return r

    def child(self, kind, hook="", ref="", tag="", side="", **kw) -> dict:
        argv = [CHILD, kind] + (["--ref", ref] if ref else [])
        for k, v in kw.items():
            argv += [f"--{k.replace('_', '-')}", str(v)]
        return self.proc(argv, hook=hook, tag=tag or kind, side=side)

    def warm(self):
        """Every file read once (hot rows: in the page cache whatever ran
        before), and how much of them is resident then."""
        files = [os.path.join(d["back"], f) for d in self.dirs.values() for f in os.listdir(d["back"])
                 if f.endswith((".safetensors", ".bin"))]
        in_threads(lambda i: [warm(f) for f in files[i::8]], 8)
        res = [resident_pages(f) for f in files]
        frac = sum(r for r, _ in res) / max(1, sum(n for _, n in res))
        self.res["resident_after_warm"] = frac
        say(f"  {len(files)} files read; {frac:.3f} of their pages resident")

    # the references
    def refs(self):
        ref_dir, raw = self.a.ref_dir, self.a.raw
        prog = os.path.join(ref_dir, "staged_ceiling")
        n = 1 if self.a.quick else self.a.ref_files
        for name in ("moe", "dense20"):
            files = files_of(self.dirs[name]["back"])
            pick = spread(files, n) if n > 1 else [largest(files)]
            whole = largest(files) if name == "dense20" else None
            if whole and whole not in pick:
                pick.append(whole)
            runs = []
            for i, f in enumerate(pick):
                out = run_ref([prog, f], os.path.join(raw, f"ref-staged-{name}-{i}.txt"), self.budget)
                runs.append({"file": f, "bytes": os.path.getsize(f), "stdout": out})
            self.res["refs"][name] = runs
        kv = os.path.join(self.dirs["kv"]["back"], "kv.bin")
        run_ref([os.path.join(ref_dir, "kv_blocks"), kv, "16", "64"], os.path.join(raw, "ref-kv_blocks.txt"),
                self.budget)

    def ref_of(self, name, files=None) -> dict:
        """staged_ceiling.cu over the checkpoint's files it ran on (files:
        those alone); its name says when that is fewer than the rows' side
        loads (--ref-files of them, spread: a sample of the checkpoint)."""
        runs = [r for r in self.res["refs"].get(name, []) if files is None or r["file"] in files]
        ref = gpu_rows.staged_over_files([(r["bytes"], r["stdout"] or "") for r in runs])
        total = len(self.dirs[name]["layout"]["files"])
        if files is None and ref.get("best") and len(runs) < total:
            ref["best_name"] += f" of the checkpoint's {total} (a sample; the row's side loads all {total})"
        return ref

    # the steps
    def reps(self, fn_stock, fn_hooked, n=None):
        """Stock and hooked taking turns, --reps each (or n); the first
        hooked one compares (fn_hooked(compare=True))."""
        st, hk = [], []
        for i in range(self.a.reps if n is None else n):
            if fn_stock is not None:
                st.append(fn_stock())
            hk.append(fn_hooked(i == 0))
        return st, hk

    def moe(self):
        d = self.dirs["moe"]
        _, self.res["moe_load_file"] = self.reps(None, lambda c: self.child(
            "load_file", "1", d["back"] if c else "", "moe load_file", dir=d["mnt"]))
        _, self.res["moe_engine"] = self.reps(None, lambda c: self.child(
            "engine", "cuda:0", d["back"] if c else "", "moe engine", dir=d["mnt"]))

    def from_pretrained(self, name):
        d = self.dirs[name]
        for variant in ("user", "load"):
            quick_skip = self.a.quick and variant == "load"  # --quick: loading only's hooked side alone (the span)
            st, hk = self.reps(
                None if quick_skip else
                lambda: self.child("from_pretrained", "", "", f"{name} from_pretrained {variant}", dir=d["back"],
                                   variant=variant, spawned=time.time()),
                lambda c: self.child("from_pretrained", "1", d["back"] if c else "",
                                     f"{name} from_pretrained {variant}", dir=d["mnt"], variant=variant,
                                     spawned=time.time()), n=FP_REPS)
            self.res[f"{name}_fp_{variant}"] = {"stock": st, "hooked": hk}

    def whole(self):
        f = largest(files_of(self.dirs["dense20"]["back"]))
        mnt = os.path.join(self.dirs["dense20"]["mnt"], os.path.basename(f))
        _, hk = self.reps(None, lambda c: self.child("whole", "", f if c else "", "whole file", "phxmount.load_safetensors",
                                                     file=mnt))
        self.res["whole"] = {"file": f, "runs": hk}

    def tp(self):
        d = self.dirs["qwen2"]
        loop = os.path.join(TOOLS, "tploops.py")
        for kind, worlds in (("narrow", self.narrow_worlds()), ("slice", (8,))):
            for w in worlds:
                r = w - 1
                tag = f"{kind} world {w} rank {r}"
                base = [loop, "child", "--loop", kind, "--rank", str(r), "--world", str(w)]
                st, hk = self.reps(
                    lambda: self.proc(base + ["--dir", d["back"]], tag=tag),
                    lambda c: self.proc(base + ["--dir", d["mnt"]] + (["--ref", d["back"], "--ops"] if c else []),
                                        hook="cuda:0", tag=tag))
                self.res[f"tp_{kind}_{w}"] = {"stock": st, "hooked": hk}

    def qwen2_check(self):
        """The Qwen2 checkpoint through a hooked from_pretrained, against
        stock's: q/k/v biases, the tied head, the F32 norms cast (a check,
        no row: a difference is a failure of the run)."""
        d = self.dirs["qwen2"]
        r = self.child("from_pretrained", "1", d["back"], "qwen2 from_pretrained check", dir=d["mnt"], variant="user",
                       spawned=time.time())
        self.res["qwen2_fp_check"] = r
        self.fails += check_fails([r], "qwen2 from_pretrained") + hook_fails(
            [r.get("hook")] if not r.get("error") else [], "qwen2 from_pretrained")
        if not r.get("error") and not r.get("tied"):
            self.fails.append("qwen2 from_pretrained: the hooked model's head is not its embeddings (tied)")

    def narrow_worlds(self):
        """vLLM's loop at every world the rows name; --quick: world 8 alone."""
        return (8,) if self.a.quick else (2, 4, 8)

    def procs8(self):
        loop = os.path.join(TOOLS, "tploops.py")
        start = time.time() + (6 if self.a.quick else 15)  # every process has torch and its context by then
        env = {k: v for k, v in os.environ.items() if k != "PHXMOUNT_HOOK"}
        env["PHXMOUNT_HOOK"] = "cuda:0"
        env["PYTHONPATH"] = os.pathsep.join([PYDIR, env.get("PYTHONPATH", "")])
        # Each compares its tensors with stock's only once all 8 are past
        # their clocks: an early rank's comparison (stock's loop onto the
        # same GPU) would run beside the others' clocks.
        gate = tempfile.mkdtemp(prefix="phx-procs8-")
        ps = [subprocess.Popen(self.procs8_argv(loop, r, start, gate), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env) for r in range(8)]
        res, errs = [], []
        for p in ps:
            try:
                o, e = p.communicate(timeout=max(10.0, self.budget.left()))
            except subprocess.TimeoutExpired:
                p.kill()
                o, e = p.communicate()
                e += "\ntimed out"
            if p.returncode != 0:
                errs.append(e[-500:])
                continue
            res.append(json.loads(o.strip().splitlines()[-1]))
        self.res["procs8"] = {"ranks": res, "errors": errs, "start_at": start}
        shutil.rmtree(gate, ignore_errors=True)

    def procs8_argv(self, loop, rank, start, gate):
        """One of the 8 rank processes: the hooked slice loop on the mount
        from start, then (past the barrier in gate) stock's on the backing
        directory, compared."""
        d = self.dirs["dense20"]
        return [sys.executable, loop, "child", "--loop", "slice", "--dir", d["mnt"], "--ref", d["back"], "--rank",
                str(rank), "--world", "8", "--start-at", str(start), "--barrier", gate, "--barrier-n", "8",
                "--barrier-timeout", str(max(30.0, self.budget.left()))]

    def pinned(self):
        self.res["pinned"] = self.child("pinned", tag="pinned ceiling")

    def kv(self):
        kvd = self.dirs["kv"]
        total = self.dirs["kv"]["layout"]["bytes"]
        cmd = [sys.executable, os.path.join(TOOLS, "gpu_kv.py"), "--mount-file", os.path.join(kvd["mnt"], "kv.bin"),
               "--backing-file", os.path.join(kvd["back"], "kv.bin"), "--out", os.path.join(self.a.raw, "bench-kv.json"),
               "--sizes", "16,64", "--total", str(total), "--threads", "1,4"]
        r = subprocess.run(cmd, timeout=max(10.0, self.budget.left()), text=True, capture_output=True)
        tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
        say("  gpu_kv: " + " | ".join(tail))
        if r.returncode != 0:
            self.fails.append("gpu_kv: " + " | ".join(tail))

    def plan(self):
        """[(step, estimate s, method)] for this run's sizes."""
        R, size = self.a.reps, {n: self.dirs[n]["layout"]["bytes"] for n in self.dirs}

        def p(n, stock_bytes, hooked_bytes, hf=False, compare=0):
            s = STARTUP_S + (HF_STARTUP_S if hf else 0)
            return n * s + stock_bytes / (STOCK_GBPS * GB) + hooked_bytes / (HOOKED_GBPS * GB) + compare / (STOCK_GBPS * GB)

        nref = 1 if self.a.quick else self.a.ref_files
        q2, nw = size["qwen2"], len(self.narrow_worlds()) + 1
        nfp = 3 if self.a.quick else 4  # from_pretrained processes (FP_REPS a side)
        total = sum(size.values()) + size["kv"]  # and the KV write file
        steps = [
            ("the page cache: every file read once", 2 + total / (20 * GB), self.warm),
            ("references (staged_ceiling.cu, kv_blocks.cu)", (nref + nref + 1) * 4.0 + 6, self.refs),
            ("pinned ceiling", STARTUP_S + 3, self.pinned),
            ("moe: load_file and the engines' loop", p(2 * R, 0, 2 * R * size["moe"], compare=2 * size["moe"]), self.moe),
            ("whole file", p(R, 0, R * 2e9, compare=2e9), self.whole),
            ("tensor parallel: vLLM's narrow loop and the get_slice loop (qwen2)",
             p(2 * nw * R, nw * R * q2, nw * R * q2 / 4, compare=nw * q2), self.tp),
            ("8 rank processes at once (dense20)", 2.5 * STARTUP_S + (2 + 1) * size["dense20"] / (STOCK_GBPS * GB),
             self.procs8),
            # 81 s on run 60's H100, most of it the two write sides at 16 KiB (0.3 GB/s each)
            ("KV blocks (gpu_kv.py)", 80 if not self.a.quick else 8, self.kv),
            ("qwen2: a hooked from_pretrained against stock's (biases, tied head, F32 norms)",
             p(1, q2, q2, True), self.qwen2_check),
            # Last: a from_pretrained process costs 17-20 s (run 34).
            ("moe: from_pretrained", p(nfp * FP_REPS, (nfp - 2) * FP_REPS * size["moe"], 2 * FP_REPS * size["moe"], True,
                                       2 * size["moe"]), lambda: self.from_pretrained("moe")),
        ] + ([] if self.a.quick else [  # --quick: one from_pretrained checkpoint
            ("dense20: from_pretrained", p(nfp * FP_REPS, (nfp - 2) * FP_REPS * size["dense20"], 2 * FP_REPS * size["dense20"], True,
                                           2 * size["dense20"]), lambda: self.from_pretrained("dense20")),
        ])
        return steps

    def go(self):
        missing = [n for n in self.dirs if not self.have(n)]
        if missing:
            raise SystemExit(f"FAIL gpu_shapes: checkpoints not generated: {missing} (ckpt_gen.py gen first)")
        for n, d in self.dirs.items():
            say(f"{n}: {d['layout']['tensors']} tensors, {d['layout']['bytes'] / GB:.2f} GB, "
                f"{len(d['layout']['files'])} file(s): {d['back']}")
        steps = self.plan()
        say("plan: " + "; ".join(f"{n} ~{e:.0f} s" for n, e, _ in steps) +
            f"; {sum(e for _, e, _ in steps):.0f} s of {self.budget.left():.0f} s")
        for name, est, fn in steps:
            self.budget.run(name, est, fn)
        print(self.budget.table(), flush=True)
        return self.rows()

    def rows(self) -> list:
        return shapes_rows.rows(self)

    def ckpt_words(self, name) -> str:
        lay = self.dirs[name]["layout"]
        return f"the {name} checkpoint ({lay['tensors']} tensors, {lay['bytes'] / GB:.2f} GB, {len(lay['files'])} files)"

    def step_why(self, step) -> str:
        return self.budget.why(step) or f"step {step!r} did not run"

def spread(files, n):
    """n of files, evenly spread (the first and the last among them)."""
    if n >= len(files):
        return list(files)
    if n <= 1:
        return [files[0]]
    return [files[round(i * (len(files) - 1) / (n - 1))] for i in range(n)]


def largest(files):
    return max(files, key=os.path.getsize)


def run_ref(argv, out_path, budget) -> str:
    """A reference program's stdout (kept in out_path), or "" where it
    could not run."""
    if not os.access(argv[0], os.X_OK):
        say(f"  {os.path.basename(argv[0])}: not built: its rows have no ref")
        return ""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=max(10.0, min(120.0, budget.left())))
        text = r.stdout + (f"\n[exit {r.returncode}] {r.stderr[-500:]}" if r.returncode else "")
    except subprocess.TimeoutExpired:
        text = "[timed out]"
    with open(out_path, "w") as f:
        f.write(text)
    say(f"  {os.path.basename(argv[0])} {os.path.basename(argv[1])}: " +
        " | ".join(line for line in text.splitlines() if line.startswith(("C ", "verify")))[:200])
    return text


def plan_only(a) -> int:
    """The plan of a run at these sizes, without a GPU (what gpu-test.sh
    issue27 prints first)."""
    a.ckpt_root = a.backing_dir = a.mount_dir = "/nonexistent"
    r = Run(a)
    steps = r.plan()
    gen = sum(r.dirs[n]["layout"]["bytes"] for n in r.dirs)
    print(f"checkpoints: {gen / GB:.2f} GB together (+ the KV write file, {r.dirs['kv']['layout']['bytes'] / GB:.2f} GB)")
    for n, e, _ in steps:
        print(f"  {n}: ~{e:.0f} s")
    total = sum(e for _, e, _ in steps)
    print(f"  together ~{total:.0f} s of {a.budget_s:.0f} s")
    return 0 if total <= a.budget_s else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "plan"):
        r = sub.add_parser(name)
        for k in ("--backing-dir", "--mount-dir", "--ckpt-root", "--ref-dir", "--raw", "--out"):
            r.add_argument(k, required=name == "run")
        r.add_argument("--quick", action="store_true")
        r.add_argument("--reps", type=int, default=None)
        r.add_argument("--ref-files", type=int, default=4, help="files of each checkpoint staged_ceiling.cu reads")
        r.add_argument("--budget-s", type=float, default=540)
    a = ap.parse_args(argv)
    if a.reps is None:
        a.reps = 1 if a.quick else 2
    if a.cmd == "plan":
        return plan_only(a)
    run = Run(a)
    rows = run.go()
    fails = run.fails + run.budget.failures() + [f"{x['name']}: {m}" for x in rows if x["status"] == gpu_rows.FAILED
                                                 for m in x["missing"]]
    write_json(a.out, {"results": run.res, "rows": rows, "failures": sorted(set(fails)),
                       "budget": run.budget.log})
    for x in rows:
        say(f"row {x['name']}: {x['value']} vs {x['baseline']}: ratio {x['ratio']}, target {x['target']}, "
            f"met {x['met']} [{x['status']}{': ' + '; '.join(x.get('missing') or []) if x.get('missing') else ''}]")
    for f in sorted(set(fails)):
        print(f"FAIL {f}", flush=True)
    print("PASS issue 27's checks" if not fails else f"{len(set(fails))} issue-27 check(s) failed", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

"""Two GPUs through one mount (issue 10), on a machine with two GPUs.

    gpu_two.py test  --mount-dir MNT --backing-dir B --shards sharded2
    gpu_two.py bench --mount-dir MNT --backing-dir B --shards sharded2 \
        --ref-two ref-two_gpu.txt --go bench-go.json --out bench-two.json

test: two client processes, one per GPU, load their shard through the
mount at the same time; each compares every tensor with
safetensors.torch.load_file on its GPU. The second process sees only its
GPU (CUDA_VISIBLE_DEVICES=1, its cuda:0): the client must find the mount's
device 1 by PCI address.

bench: the rows two_gpu_shards (one shard per GPU, one process), two_gpu_
processes (one process per GPU), two_gpu_replicated (one shard onto both
GPUs, read once; bytes landed on both GPUs per second against the one-GPU
load of the same file) and two_gpu_cold (caches dropped), each against its
baseline measured in the same run (two_gpu.cu's two-GPU bounce figure, the
best cold read of the Go bench). Buffers are allocated and registered
before the clock, as two_gpu.cu's are."""

import json
import os
import re
import subprocess
import sys
import time

from benchlib import NotCold, Watchdog, best_of, cold_start, failed, record, say, warm, write_json
from gpu_rows import row

import phxmount  # noqa: E402
from phxmount.stformat import read_header  # noqa: E402
from phxmount.sharded import shard_files  # noqa: E402

_TWO_A = re.compile(r"^A bounce hot file -> 2 GPU\(s\).*?([\d.]+) GB/s", re.M)


def empty_like_file(path, dev):
    """One uninitialised tensor per tensor of the file, on cuda:dev."""
    import torch
    from phxmount.dtypes import torch_dtype
    return {t.name: torch.empty(t.shape, dtype=torch_dtype(t.dtype), device=f"cuda:{dev}")
            for t in read_header(path).tensors}


def check_equal(mounted, backing, dev, tensors) -> int:
    """How many tensors differ from safetensors' load of the backing file."""
    from safetensors.torch import load_file
    want = load_file(backing, device=f"cuda:{dev}")
    import torch
    return sum(1 for k, v in want.items() if k not in tensors or not torch.equal(tensors[k], v))


def child(a) -> int:
    """One client process: its shard onto its GPU (cuda:0 of what it sees),
    registered first; waits for the go file, loads, checks, prints JSON."""
    import torch
    tensors = empty_like_file(a.file, 0)
    phxmount.register_tensors(a.file, tensors.values())
    torch.cuda.synchronize()
    open(a.ready, "w").close()
    while not os.path.exists(a.go):
        time.sleep(0.001)
    t0 = time.monotonic()
    phxmount.load_into(a.file, tensors)
    torch.cuda.synchronize()
    t1 = time.monotonic()
    bad = check_equal(a.file, a.backing, 0, tensors) if a.check else 0
    nbytes = read_header(a.file).data_len
    phxmount.close_caches()
    print(json.dumps({"start": t0, "end": t1, "bytes": nbytes, "bad": bad, "tensors": len(tensors),
                      "visible": os.environ.get("CUDA_VISIBLE_DEVICES", "")}), flush=True)
    return 0 if bad == 0 else 1


def two_processes(a, check: bool):
    """Both shards at once, one process per GPU; returns (bytes, seconds
    from the first start to the last end, the children's reports)."""
    files = shard_files(os.path.join(a.mount_dir, a.shards))[:2]
    backing = [os.path.join(a.backing_dir, a.shards, os.path.basename(f)) for f in files]
    tag = f"/tmp/gpu_two.{os.getpid()}"
    ps = []
    for dev, (f, b) in enumerate(zip(files, backing)):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(dev))
        cmd = [sys.executable, __file__, "child", "--file", f, "--backing", b, "--ready", f"{tag}.{dev}",
               "--go-file", f"{tag}.go"] + (["--check"] if check else [])
        ps.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    while not all(os.path.exists(f"{tag}.{d}") for d in range(2)):
        if any(p.poll() is not None for p in ps):
            raise RuntimeError("a child ended before it was ready")
        time.sleep(0.01)
    open(f"{tag}.go", "w").close()
    reps = []
    for dev, p in enumerate(ps):
        out, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"the child on GPU {dev} failed (status {p.returncode}): {out.strip()[-300:]}")
        reps.append(json.loads(out.strip().splitlines()[-1]))
    for x in [f"{tag}.{d}" for d in range(2)] + [f"{tag}.go"]:
        os.unlink(x)
    span = max(r["end"] for r in reps) - min(r["start"] for r in reps)
    return sum(r["bytes"] for r in reps), span, reps


def test(a) -> int:
    wd = Watchdog("gpu_two test")
    wd.stage("two client processes, one per GPU, every tensor checked", 300)
    nbytes, span, reps = two_processes(a, check=True)
    for dev, r in enumerate(reps):
        say(f"PASS GPU {dev} (CUDA_VISIBLE_DEVICES={r['visible']}): {r['tensors']} tensors equal to safetensors")
    say(f"PASS two processes on two GPUs through one mount: {nbytes / span / 1e9:.2f} GB/s together")
    wd.done()
    return 0


def shard_pair(a):
    """The two shard files on the mount, and their bytes."""
    files = shard_files(os.path.join(a.mount_dir, a.shards))[:2]
    return files, sum(read_header(f).data_len for f in files)


def both_in_one_process(files, tensors):
    """Each shard into its GPU's registered tensors, one thread per GPU."""
    import torch
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as pool:
        for fu in [pool.submit(phxmount.load_into, f, t) for f, t in zip(files, tensors)]:
            fu.result()
    for d in range(2):
        torch.cuda.synchronize(d)


def baselines(a):
    """two_gpu.cu's two-GPU bounce figure, the Go bench's best cold read."""
    two = cold = None
    if a.ref_two and os.path.exists(a.ref_two):
        vals = [float(v) for v in _TWO_A.findall(open(a.ref_two).read())]
        two = max(vals) if vals else None
    if a.go and os.path.exists(a.go):
        rs = json.load(open(a.go)).get("results", [])
        vals = [r["gbps"] for r in rs if r.get("name", "").startswith(("ceiling cold O_DIRECT", "ceiling cold buffered"))
                and r.get("gbps")]
        cold = max(vals) if vals else None
    return two, cold


def bench_shards(a, wd, results):
    """Rows two_gpu_shards and two_gpu_cold: registered before the clock."""
    files, nbytes = shard_pair(a)
    wd.stage("allocate and register both shards' tensors (untimed)", 120)
    tensors = [empty_like_file(f, d) for d, f in enumerate(files)]
    for f, t in zip(files, tensors):
        phxmount.register_tensors(f, t.values())
    for f in files:
        warm(f)
    wd.stage("hot: both shards at once, one process, best of 3", 120)
    best, _ = best_of(3, lambda: both_in_one_process(files, tensors))
    results.append(record("two GPUs one process hot", nbytes, best))
    wd.stage("cold: both shards at once, caches dropped (and the files checked cold) before each, best of 2", 180)
    backing = [os.path.join(a.backing_dir, a.shards, os.path.basename(f)) for f in files]
    try:
        best, _ = best_of(2, lambda: both_in_one_process(files, tensors), lambda: cold_start(backing, files))
        results.append(record("two GPUs one process cold", nbytes, best))
    except NotCold as e:
        results.append(failed("two GPUs one process cold", e))
    tensors.clear()
    phxmount.prune_caches()


def bench_replicated(a, wd, results):
    """Row two_gpu_replicated: one shard onto both GPUs against onto one."""
    import torch
    f = shard_pair(a)[0][0]
    nbytes = read_header(f).data_len
    warm(f)

    def one():
        out = phxmount.load_safetensors(f, 0)
        torch.cuda.synchronize(0)
        del out

    def both():
        outs = phxmount.load_replicated(f, [0, 1])
        for d in range(2):
            torch.cuda.synchronize(d)
        del outs

    wd.stage("replicated: one GPU, then both, best of 3 each", 180)
    t1, _ = best_of(3, one)
    results.append(record("one shard onto GPU 0 hot", nbytes, t1))
    t2, _ = best_of(3, both)
    results.append(record("one shard onto both GPUs hot (bytes landed on both)", 2 * nbytes, t2))


def bench(a) -> int:
    wd = Watchdog("gpu_two bench")
    results = []
    steps = (("shards", bench_shards), ("replicated", bench_replicated))
    for name, fn in steps:
        try:
            fn(a, wd, results)
        except Exception as e:  # the row says "not run", the rest goes on
            results.append(failed(name, e))
    wd.stage("two processes, one per GPU, best of 2", 240)
    try:
        for f in shard_pair(a)[0]:
            warm(f)  # the cold runs dropped them
        runs = [two_processes(a, check=False) for _ in range(2)]
        nbytes, span, _ = min(runs, key=lambda r: r[1])
        results.append(record("two GPUs two processes hot", nbytes, span))
    except Exception as e:
        results.append(failed("two processes", e))
    wd.done()
    g = {r["name"]: r.get("gbps") for r in results}
    err = {r["name"]: r["error"] for r in results if r.get("error")}
    two, cold = baselines(a)
    reg = "buffers allocated and registered before the clock"
    rows = [row("two_gpu_shards", g.get("two GPUs one process hot"), two, "two_gpu.cu bounce, 2 GPUs",
                timed=f"load_into of one shard per GPU, a thread each, one process, {reg}, best of 3"),
            row("two_gpu_processes", g.get("two GPUs two processes hot"), two, "two_gpu.cu bounce, 2 GPUs",
                timed=f"load_into of one shard per GPU, a process each, from the first start to the last end, {reg}, "
                      "best of 2"),
            row("two_gpu_replicated", g.get("one shard onto both GPUs hot (bytes landed on both)"),
                g.get("one shard onto GPU 0 hot"), "the same file onto one GPU (load_safetensors, hot)",
                timed="load_replicated of one shard onto both GPUs, bytes landed on both, best of 3"),
            row("two_gpu_cold", g.get("two GPUs one process cold"), cold, "best cold read (Go bench)",
                timed=f"the two_gpu_shards loads after dropping caches, the files checked not resident (mincore), {reg}",
                missing=[err[k] for k in ("two GPUs one process cold",) if k in err])]
    write_json(a.out, {"results": results, "rows": rows})
    return 0


def main() -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("test", "bench", "child"))
    for k in ("mount-dir", "backing-dir", "shards", "ref-two", "go", "out", "file", "backing", "ready"):
        ap.add_argument(f"--{k}", default="")
    ap.add_argument("--go-file", dest="gofile", default="")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    if a.mode == "child":
        a.go = a.gofile
        return child(a)
    return test(a) if a.mode == "test" else bench(a)


if __name__ == "__main__":
    sys.exit(main())

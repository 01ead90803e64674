"""End to end on a GPU (the acceptance of issues 9 and 15): the Python
client + torch on a phxmount mount (--vendor nvidia) against safetensors
on the same file. Prints a PASS or FAIL line per check and INFO lines with
what was measured; exit status 1 on any FAIL. Each section runs under a
time limit (a hang ends the run, exit 3, naming the section) and a section
that raises is one FAIL, not the end of the run.

Sections: basics (available, read_into), whole-file loads, the sharded
checkpoint (gpu_e2e.py); safe_open, random slices, prefetch, the pread
fallback, iter_tensors (e2e_read.py); save round trips (e2e_save.py); rank
shards with the bytes counter, load_into and registration reuse, a
freed-and-reused address, peak memory, owned deletion (e2e_mem.py); and,
last, no buffer left registered once the caches are closed."""

import argparse
import os
import sys
import time
import traceback

from benchlib import Watchdog, say

import phxmount  # noqa: E402
from phxmount import cuda  # noqa: E402
from phxmount.loader import LoadStats  # noqa: E402


class Ctx:
    """What every section uses: the paths, PASS/FAIL accounting, the
    mount's counters, and safetensors' load of the file (the reference)."""

    def __init__(self, a):
        self.a, self.fails, self.passes = a, 0, 0
        self.mount_file, self.backing_file = a.mount_file, a.backing_file
        self.mnt = os.path.dirname(a.mount_file)
        self.backing = os.path.dirname(a.backing_file)
        self._ref = None

    def check(self, ok, what: str) -> bool:
        print(("PASS " if ok else "FAIL ") + what, flush=True)
        self.passes += 1 if ok else 0
        self.fails += 0 if ok else 1
        return bool(ok)

    def info(self, what: str) -> None:
        print("INFO " + what, flush=True)

    def counters(self) -> dict:
        return phxmount.mount_counters(self.mnt)

    def ref(self) -> dict:
        """safetensors.torch.load_file of the file onto cuda:0 (8 GiB: kept
        until drop_ref)."""
        if self._ref is None:
            from safetensors.torch import load_file
            self._ref = load_file(self.backing_file, device="cuda:0")
        return self._ref

    def drop_ref(self) -> None:
        import gc
        import torch
        self._ref = None
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        phxmount.prune_caches()

    def compare(self, mine: dict, ref: dict, what: str) -> bool:
        """Names, then dtype, shape, device and values of every tensor."""
        import torch
        bad = [] if sorted(mine) == sorted(ref) else [f"names differ: {sorted(set(mine) ^ set(ref))[:5]}"]
        for k, r in ref.items():
            m = mine.get(k)
            if m is None:
                continue
            if m.dtype != r.dtype or tuple(m.shape) != tuple(r.shape) or m.device != r.device:
                bad.append(f"{k}: {(m.dtype, tuple(m.shape), m.device)} vs {(r.dtype, tuple(r.shape), r.device)}")
            elif not torch.equal(m, r):
                bad.append(f"{k}: torch.equal is False")
        return self.check(not bad, f"{what}: {len(ref) - len(bad)}/{len(ref)} tensors equal" +
                          ("" if not bad else "; " + "; ".join(bad[:5])))


def basics(c: Ctx) -> None:
    import ctypes
    import torch
    av = phxmount.available(c.mount_file)
    c.info(str(av))
    c.check(av.ok and av.transport == "staged" and av.vendor == "nvidia",
            f"available(): on mount={av.on_mount} vendor={av.vendor} transport={av.transport}")
    off = phxmount.available(c.backing_file)
    c.check(not off.ok and not off.on_mount, f"available() off the mount: {off.reason}")
    t = torch.empty(4 << 20, dtype=torch.uint8, device="cuda:0")
    pi = cuda.driver().pointer_info(0, t.data_ptr())
    c.info(f"cuPointerGetAttributes of a torch tensor: base {pi.base:#x} size {pi.size} buffer id {pi.buffer_id} "
           f"memory type {pi.memory_type} IPC capable {pi.ipc_capable}; tensor at +{t.data_ptr() - pi.base}")
    c.check(pi.buffer_id and pi.base <= t.data_ptr() < pi.base + pi.size, "the allocation holding a torch tensor")
    with open(c.backing_file, "rb") as f:
        f.seek(12345)
        want = f.read((10 << 20) + 3)
    dst = torch.zeros(len(want), dtype=torch.uint8, device="cuda:0")
    n = phxmount.read_into(dst, c.mount_file, file_offset=12345)
    host = dst.cpu()
    c.check(n == len(want) and ctypes.string_at(host.data_ptr(), host.numel()) == want,
            f"read_into a torch tensor: {n} bytes at file offset 12345")


def whole_file(c: Ctx) -> None:
    import torch
    ref = c.ref()
    for owned in (True, False):
        s = LoadStats()
        t0 = time.perf_counter()
        mine = phxmount.load_safetensors(c.mount_file, 0, stats=s, owned=owned)
        torch.cuda.synchronize()
        c.info(f"load_safetensors owned={owned}: {len(mine)} tensors, {s.bytes / 1e9:.2f} GB in "
               f"{time.perf_counter() - t0:.3f}s, {s.extents} extents, {s.ioctls} ioctls, transport {s.transport}, "
               f"registrations {s.extra.get('registered')}, cache hits {s.extra.get('cache_hits')}")
        c.compare(mine, ref, f"load_safetensors(owned={owned}) vs safetensors.torch.load_file")
        del mine


def sharded_checkpoint(c: Ctx) -> None:
    import torch
    from phxmount.sharded import shard_files
    from safetensors.torch import load_file
    devs = list(range(torch.cuda.device_count()))
    per = []
    got = phxmount.load_sharded(os.path.join(c.mnt, c.a.shard_dir), devices=devs, stats=per)
    ref = {}
    for f in shard_files(os.path.join(c.backing, c.a.shard_dir)):
        ref.update(load_file(f, device="cuda:0"))
    got = {k: v.to("cuda:0") for k, v in got.items()}
    c.compare(got, ref, f"load_sharded ({len(per)} shard files onto devices {devs}) vs safetensors per file")
    some = sorted(ref)[::3]
    part = phxmount.load_sharded(os.path.join(c.mnt, c.a.shard_dir), devices=devs, names=some, shard=(0, 1, 2))
    from phxmount.slicing import shard_index
    want = {k: ref[k][shard_index(ref[k].shape, 0, 1, 2) or ()] for k in some}
    c.compare({k: v.to("cuda:0") for k, v in part.items()}, want, "load_sharded(names=..., shard=(0, 1, 2))")


def no_buffer_left(c: Ctx) -> None:
    phxmount.close_caches()
    deadline = time.monotonic() + 10  # the daemon releases on FUSE's release, after close(2) returns
    while c.counters()["buffers_live"] and time.monotonic() < deadline:
        time.sleep(0.05)
    live = c.counters()["buffers_live"]
    c.check(live == 0, f"no buffer left registered once the registration caches are closed (buffers_live={live})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mount-file", required=True)
    ap.add_argument("--backing-file", required=True)
    ap.add_argument("--shard-dir", default="", help="a directory of shard files beside the file (relative)")
    ap.add_argument("--slices", type=int, default=200)
    a = ap.parse_args()
    import torch
    import e2e_mem
    import e2e_read
    import e2e_save
    torch.cuda.init()
    c, wd = Ctx(a), Watchdog("gpu_e2e")
    sections = [("basics", basics, 60), ("whole-file loads", whole_file, 120)]
    if a.shard_dir:
        sections.append(("sharded checkpoint", sharded_checkpoint, 120))
    sections += e2e_read.SECTIONS + e2e_save.SECTIONS + e2e_mem.SECTIONS + [("no buffer left", no_buffer_left, 30)]
    for name, fn, limit in sections:
        wd.stage(name, limit)
        try:
            fn(c)
        except Exception as e:
            traceback.print_exc()
            c.check(False, f"{name}: {type(e).__name__}: {e}")
    wd.done()
    say(f"gpu_e2e: {c.passes} passed, {c.fails} failed")
    return 1 if c.fails else 0


if __name__ == "__main__":
    sys.exit(main())

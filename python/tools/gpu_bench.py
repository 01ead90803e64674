"""The Python half of the GPU benchmark: file -> GPU memory for one
safetensors file, page cache hot and cold: (a) phxmount's ioctl path through
this client, (c) safetensors.torch.load_file(device="cuda"), (d) a read into
pageable memory then .cuda(). Raw numbers to --out (JSON)."""

import argparse
import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from phxmount.loader import LoadStats  # noqa: E402
from phxmount.safetensors import read_header  # noqa: E402
from phxmount.torch_helpers import load_safetensors  # noqa: E402


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def warm(path):
    with open(path, "rb", buffering=0) as f:
        while f.read(64 << 20):
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount-file", required=True)
    ap.add_argument("--backing-file", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cold", type=int, default=1)
    a = ap.parse_args()
    import torch
    from safetensors.torch import load_file

    h = read_header(a.backing_file)
    nbytes = h.data_len
    size = os.path.getsize(a.backing_file)
    torch.cuda.init()
    torch.empty(1, device="cuda:0")
    res = {"file": a.backing_file, "data_bytes": nbytes, "file_bytes": size, "torch": torch.__version__,
           "results": []}

    def phx():
        s = LoadStats()
        out = load_safetensors(a.mount_file, device=0, stats=s)
        torch.cuda.synchronize()
        del out
        return f"{s.extents} extents, {s.ioctls} ioctl(s), transport {s.transport}, io {s.io_seconds:.3f}s"

    def st():
        out = load_file(a.backing_file, device="cuda:0")
        torch.cuda.synchronize()
        del out
        return "backing path"

    def pageable():
        cpu = torch.empty(size, dtype=torch.uint8)
        with open(a.backing_file, "rb", buffering=0) as f:
            mv = memoryview((ctypes.c_char * size).from_address(cpu.data_ptr())).cast("B")
            got = 0
            while got < size:
                n = f.readinto(mv[got:])
                if not n:
                    break
                got += n
        g = cpu.cuda()
        torch.cuda.synchronize()
        del g, cpu
        return "whole file: read() then .cuda(), no tensor views"

    methods = [("a phxmount ioctl (python client)", phx, 3), ("c safetensors load_file cuda", st, 2),
               ("d pageable read + .cuda()", pageable, 2)]
    warm(a.backing_file)
    for name, fn, reps in methods:
        best, note = None, ""
        for _ in range(reps):
            t0 = time.perf_counter()
            note = fn()
            d = time.perf_counter() - t0
            best = d if best is None else min(best, d)
            torch.cuda.empty_cache()
        r = {"name": name + " hot", "bytes": nbytes, "seconds": best, "gbps": nbytes / best / 1e9, "note": note}
        res["results"].append(r)
        print(f"{r['name']:<44} {r['gbps']:8.2f} GB/s  {best:7.3f}s  {note}", flush=True)
    if a.cold:
        for name, fn, _ in methods:
            drop_caches()
            t0 = time.perf_counter()
            note = fn()
            d = time.perf_counter() - t0
            torch.cuda.empty_cache()
            r = {"name": name + " cold", "bytes": nbytes, "seconds": d, "gbps": nbytes / d / 1e9, "note": note}
            res["results"].append(r)
            print(f"{r['name']:<44} {r['gbps']:8.2f} GB/s  {d:7.3f}s  {note}", flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

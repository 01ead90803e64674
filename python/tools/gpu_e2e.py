"""End to end on a GPU: the Python client + torch loading a safetensors file
through a phxmount mount (--vendor nvidia) must equal
safetensors.torch.load_file of the same file, tensor by tensor. Prints
PASS/FAIL lines; exit status 1 on any FAIL."""

import argparse
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import phxmount  # noqa: E402
from phxmount import cuda  # noqa: E402
from phxmount.loader import LoadStats  # noqa: E402
from phxmount.torch_helpers import load_safetensors, read_into  # noqa: E402

fails = 0


def report(ok, what):
    global fails
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    fails += 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount-file", required=True)
    ap.add_argument("--backing-file", required=True)
    ap.add_argument("--shard-dir", default="", help="a directory of shards beside the file (relative), loaded with load_sharded")
    a = ap.parse_args()
    import torch
    from safetensors.torch import load_file

    av = phxmount.available(a.mount_file)
    print(av, flush=True)
    report(av.ok and av.transport == "staged" and av.vendor == "nvidia",
           f"available(): on mount={av.on_mount} vendor={av.vendor} transport={av.transport}")
    off = phxmount.available(a.backing_file)
    report(not off.ok and not off.on_mount, f"available() off the mount: {off.reason}")

    # torch's own IPC handle vs cuIpcGetMemHandle of the allocation's base.
    t = torch.empty(4 << 20, dtype=torch.uint8, device="cuda:0")
    drv = cuda.driver()
    base, size = drv.address_range(0, t.data_ptr())
    ours = drv.ipc_handle(0, base)
    try:
        sh = t.untyped_storage()._share_cuda_()
        theirs = sh[1]
        print(f"INFO torch _share_cuda_ handle: {len(theirs)} bytes, equal to cuIpcGetMemHandle(base): {theirs == ours}, "
              f"contains it at {theirs.find(ours)}, first bytes {theirs[:4].hex()}; "
              f"storage offset in its allocation {sh[3]}, ours {t.data_ptr() - base}", flush=True)
    except Exception as e:  # informational only
        print(f"INFO torch _share_cuda_ unavailable: {e!r}", flush=True)

    # read_into a torch-allocated tensor (registration of its allocation).
    with open(a.backing_file, "rb") as f:
        f.seek(12345)
        want = f.read((10 << 20) + 3)
    dst = torch.zeros(len(want), dtype=torch.uint8, device="cuda:0")
    n = read_into(dst, a.mount_file, file_offset=12345)
    host = dst.cpu()
    got = ctypes.string_at(host.data_ptr(), host.numel())
    report(n == len(want) and got == want, f"read_into a torch tensor: {n} bytes at file offset 12345")

    # The whole file, one batch, against safetensors.
    s = LoadStats()
    t0 = time.perf_counter()
    mine = load_safetensors(a.mount_file, device=0, stats=s)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(f"INFO phxmount load: {len(mine)} tensors, {s.bytes / 1e9:.2f} GB in {dt:.2f}s, {s.extents} extents, "
          f"{s.ioctls} ioctls, transport {s.transport}", flush=True)
    ref = load_file(a.backing_file, device="cuda:0")
    report(sorted(mine) == sorted(ref), f"same tensor names ({len(ref)})")
    bad = []
    for k, r in ref.items():
        m = mine.get(k)
        if m is None or m.dtype != r.dtype or tuple(m.shape) != tuple(r.shape) or m.device != r.device:
            bad.append(f"{k}: {None if m is None else (m.dtype, tuple(m.shape), m.device)} vs {(r.dtype, tuple(r.shape), r.device)}")
            continue
        if not torch.equal(m, r):
            bad.append(f"{k}: torch.equal is False")
            continue
        if m.numel() and not torch.equal(m.reshape(-1).view(torch.uint8), r.reshape(-1).view(torch.uint8)):
            bad.append(f"{k}: bytes differ")
    report(not bad, f"every tensor torch.equal to safetensors.torch.load_file (dtype, shape, device, bytes): "
                    f"{len(ref) - len(bad)}/{len(ref)}" + ("" if not bad else "; " + "; ".join(bad[:5])))
    del mine, ref
    torch.cuda.synchronize()

    # A sharded checkpoint: every shard to a device, in parallel.
    if a.shard_dir:
        from phxmount.sharded import load_sharded, shard_files
        from safetensors.torch import load_file as lf
        devs = list(range(torch.cuda.device_count()))
        t0 = time.perf_counter()
        per = []
        got = load_sharded(os.path.join(os.path.dirname(a.mount_file), a.shard_dir), devices=devs, stats=per)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        total = sum(s.bytes for s in per)
        print(f"INFO sharded load: {len(per)} shards onto devices {devs}, {total / 1e9:.2f} GB in {dt:.2f}s", flush=True)
        ref = {}
        for f in shard_files(os.path.join(os.path.dirname(a.backing_file), a.shard_dir)):
            ref.update(lf(f, device="cuda:0"))
        bad = [k for k, r in ref.items() if k not in got or got[k].dtype != r.dtype or not torch.equal(got[k].to(r.device), r)]
        report(sorted(got) == sorted(ref) and not bad,
               f"sharded checkpoint ({len(per)} shards, {len(ref)} tensors) equals safetensors per shard; bad: {bad[:3]}")
        del got, ref
        torch.cuda.synchronize()
    with phxmount.PhxFile(os.path.dirname(a.mount_file)) as root:
        live = root.info().counters["buffers_live"]
    report(live == 0, f"no buffer left registered after the loads (buffers_live={live})")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

"""gpu_e2e sections on memory and registrations (issues 9 and 15): every
shard of rank-selective loads at world 2, 4 and 8 on dims 0 and 1 against
safetensors (row shards: the daemon's bytes counter equals the shard's
bytes exactly), load_into with registrations made once and reused, a freed
address handed out again never served by the stale registration, the peak
GPU memory of loads (torch.cuda.max_memory_allocated and cuMemGetInfo),
and owned tensors: deleting half of them frees that half."""

import gc
import threading

import phxmount
from phxmount import cuda
from phxmount.loader import LoadStats
from phxmount.slicing import shard_index

MiB = 1 << 20
# What the bound allows on top of 1.05 x the bytes loaded: torch's caching
# allocator rounds each large allocation up to 2 MiB (its registration
# unit here), and the driver's own bookkeeping (64 MiB).
PER_ALLOC, DRIVER_SLACK = 2 * MiB, 64 * MiB


def nbytes(d: dict) -> int:
    return sum(t.numel() * t.element_size() for t in d.values())


def shards(c) -> None:
    import torch
    ref = c.ref()
    for dim in (0, 1):
        for world in (2, 4, 8):
            bad, notes = [], []
            for rank in range(world):
                s = LoadStats()
                c0 = c.counters()["ioctl_bytes_read"]
                got = phxmount.load_safetensors(c.mount_file, 0, stats=s, shard=(dim, rank, world))
                torch.cuda.synchronize()
                moved = c.counters()["ioctl_bytes_read"] - c0
                for k, r in ref.items():
                    want = r[shard_index(r.shape, dim, rank, world) or ()]
                    m = got.get(k)
                    if m is None or m.dtype != want.dtype or m.shape != want.shape or not torch.equal(m, want):
                        bad.append(f"rank {rank} {k}")
                if dim == 0 and moved != nbytes(got):
                    bad.append(f"rank {rank}: the daemon read {moved} bytes for a shard of {nbytes(got)}")
                notes.append(f"rank {rank}: read {moved} B for {nbytes(got)} B, plans {s.extra.get('exact')} exact "
                             f"{s.extra.get('cover')} cover")
                del got
            c.check(not bad, f"shards dim {dim} world {world}: every rank's tensors equal safetensors'"
                    + (", bytes read == shard bytes" if dim == 0 else "") + ("" if not bad else "; " + "; ".join(bad[:4])))
            c.info(f"dim {dim} world {world}: " + "; ".join(notes[:2]) + (f"; why: {s.plans[0][2]}" if s.plans else ""))


def host_bytes(t) -> bytes:
    import ctypes
    h = t.cpu()
    return ctypes.string_at(h.data_ptr(), h.numel() * h.element_size())


def registrations(c) -> None:
    import torch
    ref = c.ref()
    tensors = {k: torch.empty(v.shape, dtype=v.dtype, device="cuda:0") for k, v in ref.items()}
    made = phxmount.register_tensors(c.mount_file, tensors.values())
    for i in range(2):
        c0 = c.counters()["buffers_registered"]
        phxmount.load_into(c.mount_file, tensors)
        torch.cuda.synchronize()
        new = c.counters()["buffers_registered"] - c0
        c.check(new == 0, f"load_into #{i + 1}: no REGISTER (the {made} registrations made ahead are reused; {new} new)")
    c.compare(tensors, ref, "load_into the caller's tensors vs safetensors")


def stale_address(c) -> None:
    import torch
    n = 64 * MiB
    with open(c.backing_file, "rb") as f:
        want = [f.read(n), f.read(n)]
    x = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    phxmount.read_into(x, c.mount_file, file_offset=0)
    first = host_bytes(x) == want[0]
    ptr, bid = x.data_ptr(), cuda.driver().pointer_info(0, x.data_ptr()).buffer_id
    del x
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the segment goes back to the driver
    y = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    same_addr = y.data_ptr() == ptr
    new_bid = cuda.driver().pointer_info(0, y.data_ptr()).buffer_id
    phxmount.read_into(y, c.mount_file, file_offset=n)
    ok = host_bytes(y) == want[1]
    c.check(ok and first, f"a freed and reused address: data lands in the new allocation "
            f"(same address again: {same_addr}; buffer id {bid} then {new_bid})")


class Peak:
    """The driver's lowest free memory while it runs (sampled every ms)."""

    def __init__(self):
        self.drv = cuda.driver()
        self.free0 = self.low = self.drv.mem_info(0)[0]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.wait(0.001):
            self.low = min(self.low, self.drv.mem_info(0)[0])

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        self.low = min(self.low, self.drv.mem_info(0)[0])
        return self.free0 - self.low


def measure(c, what, shard, strict=True) -> None:
    import torch
    c.drop_ref()
    base, reserved0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    p = Peak()
    s = phxmount.LoadStats()
    got = phxmount.load_safetensors(c.mount_file, 0, shard=shard, stats=s)
    torch.cuda.synchronize()
    drv = p.stop()
    peak = torch.cuda.max_memory_allocated() - base
    rpeak = torch.cuda.max_memory_reserved() - reserved0
    c.info(f"{what}: torch allocated {base / MiB:.0f} -> {torch.cuda.memory_allocated() / MiB:.0f} MiB (peak "
           f"{torch.cuda.max_memory_allocated() / MiB:.0f}), reserved {reserved0 / MiB:.0f} -> "
           f"{torch.cuda.memory_reserved() / MiB:.0f} MiB (peak {torch.cuda.max_memory_reserved() / MiB:.0f}); "
           f"plans {s.extra.get('exact')} exact, {s.extra.get('cover')} cover")
    n = nbytes(got)
    allow = 1.05 * n + PER_ALLOC * len(got)
    msg = (f"peak GPU memory of {what}: {n / MiB:.0f} MiB loaded; torch peak reserved {rpeak / MiB:.0f} MiB "
           f"({rpeak / max(n, 1):.3f}x), allocated {peak / MiB:.0f} MiB ({peak / max(n, 1):.3f}x); driver-reported "
           f"{drv / MiB:.0f} MiB ({drv / max(n, 1):.3f}x); bound 1.05x + {PER_ALLOC >> 20} MiB a tensor "
           f"(+ {DRIVER_SLACK >> 20} MiB for the driver)")
    if strict:
        # Reserved memory holds every allocated block, so its peak bounds the
        # allocated peak: an allocated peak above it (seen once, 2.05x with
        # reserved and the driver at 1.003x) is torch's counter, not memory.
        c.check(rpeak <= allow and drv <= allow + DRIVER_SLACK, msg)
        if peak > max(rpeak, 1):
            c.info(f"{what}: torch.cuda.max_memory_allocated ({peak / MiB:.0f} MiB) is above the reserved peak "
                   f"({rpeak / MiB:.0f} MiB): a counter artifact")
    else:
        c.info(msg + " (covering reads stage whole rows: not held to the bound)")
    del got


def peak_memory(c) -> None:
    measure(c, "a full load", None)
    measure(c, "rank 0 of 8, row shards", (0, 0, 8))
    measure(c, "rank 0 of 8, column shards", (1, 0, 8), strict=False)


def owned_deletion(c) -> None:
    import torch
    c.drop_ref()
    got = phxmount.load_safetensors(c.mount_file, 0)
    torch.cuda.synchronize()
    size = {k: t.numel() * t.element_size() for k, t in got.items()}
    names = sorted(size, key=size.get)
    gone = names[1::2]
    rounded = sum(-(-size[k] // 512) * 512 for k in gone)
    big = sum(size[k] for k in gone if size[k] >= 10 * MiB)
    a0, f0 = torch.cuda.memory_allocated(), cuda.driver().mem_info(0)[0]
    for k in gone:
        del got[k]
    gc.collect()
    torch.cuda.synchronize()
    freed = a0 - torch.cuda.memory_allocated()
    torch.cuda.empty_cache()
    pruned = phxmount.prune_caches()
    drv = cuda.driver().mem_info(0)[0] - f0
    # torch's caching allocator rounds a block to 512 bytes, and leaves a
    # large block unsplit when less than 1 MiB would be left over: each
    # deleted tensor frees its bytes and at most 1 MiB more.
    slack = len(gone) * MiB
    c.check(rounded <= freed <= rounded + slack,
            f"owned: deleting {len(gone)} of {len(names)} tensors freed {freed / MiB:.1f} MiB in torch "
            f"(their bytes, rounded to 512: {rounded / MiB:.1f} MiB; allocator slack allowed {slack / MiB:.0f} MiB)")
    c.check(drv >= 0.95 * big, f"owned: after empty_cache the driver got {drv / MiB:.0f} MiB back (the deleted tensors "
            f"of >= 10 MiB hold {big / MiB:.0f} MiB; {pruned} registrations of freed memory released)")
    del got


SECTIONS = [("rank shards and the bytes counter", shards, 300), ("load_into and registration reuse", registrations, 120),
            ("a freed address reused", stale_address, 60), ("peak memory", peak_memory, 180),
            ("owned deletion", owned_deletion, 120)]

"""KV-cache restore through the mount, the pattern of
../shared/reference/kv_blocks.cu: from a hot file (4 GiB in the
benchmark), `total` bytes (2 GiB) of fixed-size blocks, each from a source
block chosen at random (seeded), into shuffled slots of one registered GPU
buffer; block sizes 16 / 64 / 256 / 1024 KiB. The blocks go as BATCH ioctls
of 409 extents, from 1 client thread and from 4, each keeping --inflight
(4) ioctls in flight through the library's submission path (BatchIO, as
the loaders do; every ioctl on its own descriptor); only the I/O is timed.
One ioctl at a time per client thread is measured too, for comparison. Then EVERY block
is checked byte for byte, outside the timing: one device-to-host copy of
the buffer, compared with the file. (The blocks are drawn with Python's
random from the seed: the reference's pattern and sizes, not its exact
std::mt19937_64 choice.)

    python3 gpu_kv.py --mount-file MNT/kv.bin --backing-file BACKING/kv.bin --out kv.json

--emu runs the same on a mount of the emulated device (no GPU, no torch):
the CPU tests do that with small sizes."""

import ctypes
import mmap
import os
import random
import sys
import threading
import time
from array import array

from benchlib import tool_args, Watchdog, failed, parse_size, record, say, warm, write_json

from phxmount import abi  # noqa: E402
from phxmount.batchio import BatchIO, wait_all  # noqa: E402
from phxmount.client import EmuBuffer  # noqa: E402
from phxmount.extents import Cols  # noqa: E402

EXTENTS = abi.MAX_EXTENTS  # 409 per BATCH ioctl


def plan(file_size: int, bs: int, total: int, seed: int):
    """(source block, destination slot) of each of total // bs blocks: the
    sources at random in the file, the slots a shuffle of the buffer's."""
    rng = random.Random(seed)
    n, nfile = total // bs, file_size // bs
    if nfile < 1:
        raise ValueError(f"a file of {file_size} bytes has no block of {bs}")
    src = [rng.randrange(nfile) for _ in range(n)]
    slots = list(range(n))
    rng.shuffle(slots)
    return src, slots


def columns(buf_id: int, base: int, bs: int, src, slots) -> Cols:
    n = len(src)
    return Cols(array("Q", (buf_id,)) * n, array("Q", (base + s * bs for s in slots)),
                array("Q", (bs,)) * n, array("Q", (b * bs for b in src)))


def split(cols: Cols, threads: int):
    """threads parts of whole batches, as even as batches allow."""
    batches = -(-len(cols) // EXTENTS)
    per = -(-batches // threads)
    return [cols.part(i * per * EXTENTS, (i + 1) * per * EXTENTS) for i in range(threads) if i * per < batches]


def run_streams(path: str, parts, timeout: float, inflight: int) -> float:
    """Each part on its own client thread, which keeps inflight BATCH
    ioctls of 409 extents in flight through the library's submission path
    (BatchIO: the loaders' threads, each with its own descriptor); returns
    the seconds from the common start to the last end."""
    ios = [BatchIO(path, inflight) for _ in parts]
    errors, go = [], threading.Barrier(len(parts) + 1)

    def work(io, part):
        go.wait()
        try:
            wait_all([io.submit(b) for b in part.split(EXTENTS)], timeout, "kv reads")
        except BaseException as e:  # reported by the caller
            errors.append(e)

    ts = [threading.Thread(target=work, args=(io, p), daemon=True) for io, p in zip(ios, parts)]
    for t in ts:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join(max(0.0, t0 + timeout - time.perf_counter()))
    dt = time.perf_counter() - t0
    if any(t.is_alive() for t in ts):
        raise TimeoutError(f"kv reads on {len(parts)} thread(s) not done after {timeout} s")
    for io in ios:
        io.close()
    if errors:
        raise errors[0]
    return dt


def verify(host, fmap, bs: int, src, slots) -> list:
    """The blocks whose bytes in host (the buffer) differ from the file."""
    return [i for i, (s, d) in enumerate(zip(src, slots))
            if bytes(host[d * bs:(d + 1) * bs]) != fmap[s * bs:(s + 1) * bs]]


class EmuDest:
    """The destination in the emulated device (a dry run without a GPU)."""

    def __init__(self, nbytes: int, path: str):
        from phxmount.hostbackends import emu_alloc
        from phxmount.regcache import cache_for
        self.buf = EmuBuffer(nbytes)
        a = emu_alloc(self.buf)
        self.buf_id, self.base = cache_for(path, abi.VENDOR_EMU, 0).locate(a, a.base, nbytes)

    def zero(self) -> None:
        self.buf.view[:] = bytes(len(self.buf.view))

    def to_host(self):
        return self.buf.view


class TorchDest:
    """The destination in GPU memory: one torch tensor, registered (through
    the mount's registration cache) before any timing."""

    def __init__(self, nbytes: int, path: str, device: int = 0):
        import torch
        from phxmount.torch_mem import cuda_cache, locate_tensor
        self.t = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
        self.buf_id, self.base = locate_tensor(cuda_cache(path, device), self.t)
        self.host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def zero(self) -> None:
        import torch
        self.t.zero_()
        torch.cuda.synchronize()

    def to_host(self):
        import torch
        self.host.copy_(self.t)
        torch.cuda.synchronize()
        n = self.host.numel()
        return memoryview((ctypes.c_ubyte * n).from_address(self.host.data_ptr())).cast("B")


def one_size(a, dest, fmap, file_size: int, bs: int, wd: Watchdog) -> list:
    src, slots = plan(file_size, bs, a.total, a.seed)
    cols = columns(dest.buf_id, dest.base, bs, src, slots)
    out = []
    # The rows' runs (the library's submission depth), then one ioctl at a
    # time per client thread for comparison (not a row).
    for threads, inflight in [(t, a.inflight) for t in a.threads] + [(t, 1) for t in a.threads if a.inflight > 1]:
        name = f"kv {bs >> 10}KiB {threads} thread{'s' if threads > 1 else ''}, {inflight} in flight each"
        try:
            dest.zero()
            wd.stage(f"{name}: reads", a.timeout)
            dt = run_streams(a.mount_file, split(cols, threads), a.timeout, inflight)
            wd.stage(f"{name}: verifying every block", a.timeout)
            bad = verify(dest.to_host(), fmap, bs, src, slots)
            out.append(record(name, len(src) * bs, dt, block=bs, threads=threads, inflight=inflight,
                              row=inflight == a.inflight, blocks=len(src), ioctls=-(-len(src) // EXTENTS),
                              extents_per_ioctl=EXTENTS, verified=len(src), mismatches=len(bad), first_bad=bad[:5]))
            if bad:
                say(f"FAIL {name}: {len(bad)} of {len(src)} blocks differ from the file (first {bad[:5]})")
        except Exception as e:  # the next size still runs
            out.append(failed(name, e))
    return out


def run_all(a, wd: Watchdog) -> dict:
    wd.stage("warm the file and register the buffer", a.timeout)
    warm(a.backing_file)
    dest = EmuDest(a.total, a.mount_file) if a.emu else TorchDest(a.total, a.mount_file)
    size = os.path.getsize(a.backing_file)
    res = {"tool": "gpu_kv", "file": a.backing_file, "file_bytes": size, "total_bytes": a.total, "seed": a.seed,
           "extents_per_ioctl": EXTENTS, "results": []}
    with open(a.backing_file, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as fmap:
        for kib in a.sizes.split(","):
            res["results"] += one_size(a, dest, fmap, size, int(kib) << 10, wd)
    return res


def main(argv=None) -> int:
    ap = tool_args(__doc__, backing_help="the same file, off the mount (for verification)")
    ap.add_argument("--sizes", default="16,64,256,1024", help="block sizes in KiB")
    ap.add_argument("--threads", default="1,4", help="client threads")
    ap.add_argument("--inflight", type=int, default=4,
                    help="BATCH ioctls each client thread keeps in flight (the loaders' default)")
    ap.add_argument("--total", default="2GiB", help="bytes moved per block size")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--timeout", type=float, default=120, help="seconds for each run's reads (and its check)")
    ap.add_argument("--emu", action="store_true", help="the emulated device (a mount with --vendor emu)")
    a = ap.parse_args(argv)
    a.total, a.threads = parse_size(a.total), [int(x) for x in a.threads.split(",")]
    wd = Watchdog("gpu_kv")
    try:
        res = run_all(a, wd)
    finally:
        wd.done()  # also when it raises: the watchdog must not end a caller that goes on
    write_json(a.out, res)
    bad = [r["name"] for r in res["results"] if r.get("error") or r.get("mismatches")]
    print(("FAIL gpu_kv: " + ", ".join(bad)) if bad else "PASS gpu_kv: every block of every run verified", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

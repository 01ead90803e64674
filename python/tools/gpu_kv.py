"""KV-cache blocks through the mount, both ways.

Restore (reads), the pattern of ../shared/reference/kv_blocks.cu: from a
hot file (4 GiB in the benchmark), `total` bytes (2 GiB) of fixed-size
blocks, each from a source block chosen at random (seeded), into shuffled
slots of one registered GPU buffer; block sizes 16 / 64 / 256 / 1024 KiB.
The blocks go as BATCH ioctls of 409 extents, from 1 client thread and
from 4, each keeping --inflight (4) ioctls in flight through the library's
submission path (BatchIO, as the loaders do; every ioctl on its own
descriptor); only the I/O is timed. One ioctl at a time per client thread
is measured too, for comparison. Then EVERY block is checked byte for
byte, outside the timing: one device-to-host copy of the buffer, compared
with the file. (The blocks are drawn with Python's random from the seed:
the reference's pattern and sizes, not its exact std::mt19937_64 choice.)

Offload (writes), measured the same way (sizes, threads, depth): the
buffer's slots, in shuffled order, written by BATCH_WRITE to distinct
block offsets drawn at random in a second file of the read file's size
(--write-name, next to it; made once). Its baseline runs in the same call
with the same client threads: the reference pipeline in reverse, each
thread gathering its blocks on the GPU into one contiguous device buffer
(index_select), one device-to-host copy into pinned memory, then a pwrite
per block to the backing file. Both sides write to the page cache, without
fsync, into the same file, whose blocks are allocated and cached and which
is synced before every run; the buffer is refilled with fresh random bytes
before every run and every written block is checked against it afterwards
(the file read through the backing path, outside the timing).

    python3 gpu_kv.py --mount-file MNT/kv.bin --backing-file BACKING/kv.bin --out kv.json

--emu runs the same on a mount of the emulated device (no GPU, no torch),
the baseline gathering into host memory: the CPU tests do that with small
sizes."""

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
# The cache state of the write runs, in their names: what the rows compare.
WRITE_STATE = "page cache, no fsync"


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


def plan_writes(file_size: int, bs: int, total: int, seed: int):
    """(destination block, source slot) of each of total // bs blocks: the
    destinations distinct, at random in the file (two writes to one block
    would leave the check nothing to hold them to), the slots a shuffle of
    the buffer's."""
    rng = random.Random(seed + 1)
    n, nfile = total // bs, file_size // bs
    if nfile < n:
        raise ValueError(f"a file of {file_size} bytes has {nfile} blocks of {bs}, fewer than the {n} to write")
    dst = rng.sample(range(nfile), n)
    slots = list(range(n))
    rng.shuffle(slots)
    return dst, slots


def columns(buf_id: int, base: int, bs: int, blocks, slots) -> Cols:
    """Block k between slot slots[k] of the buffer and block blocks[k] of the file."""
    n = len(blocks)
    return Cols(array("Q", (buf_id,)) * n, array("Q", (base + s * bs for s in slots)),
                array("Q", (bs,)) * n, array("Q", (b * bs for b in blocks)))


def ranges(n: int, threads: int):
    """[lo, hi) of each client thread's blocks: whole batches of 409, as
    even as batches allow (both write sides split the same way)."""
    batches = -(-n // EXTENTS)
    per = -(-batches // threads)
    return [(i * per * EXTENTS, min(n, (i + 1) * per * EXTENTS)) for i in range(threads) if i * per < batches]


def split(cols: Cols, threads: int):
    """threads parts of whole batches, as even as batches allow."""
    return [cols.part(lo, hi) for lo, hi in ranges(len(cols), threads)]


def run_threads(work, parts, timeout: float, what: str) -> float:
    """work(part) on a thread per part, all started together; returns the
    seconds from the common start to the last end."""
    errors, go = [], threading.Barrier(len(parts) + 1)

    def run(part):
        go.wait()
        try:
            work(part)
        except BaseException as e:  # reported by the caller
            errors.append(e)

    ts = [threading.Thread(target=run, args=(p,), daemon=True) for p in parts]
    for t in ts:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join(max(0.0, t0 + timeout - time.perf_counter()))
    dt = time.perf_counter() - t0
    if any(t.is_alive() for t in ts):
        raise TimeoutError(f"{what} on {len(parts)} thread(s) not done after {timeout} s")
    if errors:
        raise errors[0]
    return dt


def run_streams(path: str, parts, timeout: float, inflight: int, write: bool = False) -> float:
    """Each part on its own client thread, which keeps inflight BATCH
    ioctls of 409 extents in flight through the library's submission path
    (BatchIO: the loaders' threads, each with its own descriptor); returns
    the seconds from the common start to the last end."""
    what = "kv writes" if write else "kv reads"
    ios = {id(p): BatchIO(path, inflight, write=write) for p in parts}
    try:
        return run_threads(lambda p: wait_all([ios[id(p)].submit(b) for b in p.split(EXTENTS)], timeout, what),
                           parts, timeout, what)
    finally:
        for io in ios.values():
            io.close()


def verify(host, fmap, bs: int, blocks, slots) -> list:
    """The k whose slot slots[k] in host (the buffer) differs from block
    blocks[k] of the file."""
    return [i for i, (s, d) in enumerate(zip(blocks, slots))
            if bytes(host[d * bs:(d + 1) * bs]) != fmap[s * bs:(s + 1) * bs]]


class EmuDest:
    """The buffer in the emulated device (a dry run without a GPU)."""

    gather_name = "gather into host memory, pwrite per block"

    def __init__(self, nbytes: int, path: str):
        from phxmount.hostbackends import emu_alloc
        from phxmount.regcache import cache_for
        self.buf = EmuBuffer(nbytes)
        a = emu_alloc(self.buf)
        self.buf_id, self.base = cache_for(path, abi.VENDOR_EMU, 0).locate(a, a.base, nbytes)
        self.stage = None

    def zero(self) -> None:
        self.buf.view[:] = bytes(len(self.buf.view))

    def fill(self, seed: int) -> None:
        """Fresh random bytes (a block left from an earlier run differs);
        the check compares the file with the buffer, so no seed is needed."""
        v, chunk = self.buf.view, 64 << 20
        for i in range(0, len(v), chunk):
            n = min(chunk, len(v) - i)
            v[i:i + n] = os.urandom(n)

    def to_host(self):
        return self.buf.view

    def prepare_gather(self, bs: int, slots, threads: int) -> None:
        self.stage = bytearray(len(slots) * bs)

    def gather(self, bs: int, slots, lo: int, hi: int, thread: int) -> memoryview:
        """Blocks lo..hi of the reverse pipeline, gathered from their slots
        into one contiguous host buffer."""
        v, st = self.buf.view, self.stage
        for j in range(lo, hi):
            s = slots[j]
            st[j * bs:(j + 1) * bs] = v[s * bs:(s + 1) * bs]
        return memoryview(st)


class TorchDest:
    """The buffer in GPU memory: one torch tensor, registered (through the
    mount's registration cache) before any timing."""

    gather_name = "GPU gather (index_select), one D2H, pwrite per block"

    def __init__(self, nbytes: int, path: str, device: int = 0):
        import torch
        from phxmount.torch_mem import cuda_cache, locate_tensor
        self.dev = f"cuda:{device}"
        self.t = torch.empty(nbytes, dtype=torch.uint8, device=self.dev)
        self.buf_id, self.base = locate_tensor(cuda_cache(path, device), self.t)
        self.host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.gathered = self.idx = None
        self.streams = []

    def zero(self) -> None:
        import torch
        self.t.zero_()
        torch.cuda.synchronize()

    def fill(self, seed: int) -> None:
        import torch
        g = torch.Generator(device=self.dev)
        g.manual_seed(seed)
        self.t.random_(0, 256, generator=g)
        torch.cuda.synchronize()

    def to_host(self):
        import torch
        self.host.copy_(self.t)
        torch.cuda.synchronize()
        return self._host_view()

    def _host_view(self):
        n = self.host.numel()
        return memoryview((ctypes.c_ubyte * n).from_address(self.host.data_ptr())).cast("B")

    def prepare_gather(self, bs: int, slots, threads: int) -> None:
        """The device buffer the blocks are gathered into, their slots as a
        device index, and a stream per client thread: made before timing."""
        import torch
        if self.gathered is None:
            self.gathered = torch.empty(self.t.numel(), dtype=torch.uint8, device=self.dev)
        self.idx = torch.tensor(slots, dtype=torch.int64, device=self.dev)
        self.streams += [torch.cuda.Stream(self.dev) for _ in range(threads - len(self.streams))]
        torch.cuda.synchronize()

    def gather(self, bs: int, slots, lo: int, hi: int, thread: int) -> memoryview:
        """Blocks lo..hi: gathered on the GPU into one contiguous device
        buffer, then one device-to-host copy into pinned memory, on the
        client thread's own stream."""
        import torch
        s = self.streams[thread]
        with torch.cuda.stream(s):
            src = self.t[:len(slots) * bs].view(len(slots), bs)
            out = self.gathered[:len(slots) * bs].view(len(slots), bs)[lo:hi]
            torch.index_select(src, 0, self.idx[lo:hi], out=out)
            self.host[lo * bs:hi * bs].copy_(self.gathered[lo * bs:hi * bs], non_blocking=True)
        s.synchronize()
        return self._host_view()


def read_runs(a):
    """(threads, inflight, row) of every run of one size: the rows' runs
    (the library's submission depth), then one ioctl at a time per client
    thread for comparison (not a row)."""
    return [(t, a.inflight, True) for t in a.threads] + [(t, 1, False) for t in a.threads if a.inflight > 1]


def threads_name(n: int) -> str:
    return f"{n} thread{'s' if n > 1 else ''}"


def one_size(a, dest, fmap, file_size: int, bs: int, wd: Watchdog) -> list:
    src, slots = plan(file_size, bs, a.total, a.seed)
    cols = columns(dest.buf_id, dest.base, bs, src, slots)
    out = []
    for threads, inflight, is_row in read_runs(a):
        name = f"kv {bs >> 10}KiB {threads_name(threads)}, {inflight} in flight each"
        try:
            dest.zero()
            wd.stage(f"{name}: reads", a.timeout)
            dt = run_streams(a.mount_file, split(cols, threads), a.timeout, inflight)
            wd.stage(f"{name}: verifying every block", a.timeout)
            bad = verify(dest.to_host(), fmap, bs, src, slots)
            out.append(record(name, len(src) * bs, dt, direction="read", block=bs, threads=threads, inflight=inflight,
                              row=is_row, blocks=len(src), ioctls=-(-len(src) // EXTENTS),
                              extents_per_ioctl=EXTENTS, verified=len(src), mismatches=len(bad), first_bad=bad[:5]))
            if bad:
                say(f"FAIL {name}: {len(bad)} of {len(src)} blocks differ from the file (first {bad[:5]})")
        except Exception as e:  # the next size still runs
            out.append(dict(failed(name, e), direction="read", block=bs, threads=threads, inflight=inflight, row=is_row))
    return out


class WriteTarget:
    """The file the write runs write into: on the mount and its backing
    path, the read file's size, every block allocated and cached."""

    def __init__(self, a, size: int):
        self.mount = os.path.join(os.path.dirname(a.mount_file), a.write_name)
        self.backing = os.path.join(os.path.dirname(a.backing_file), a.write_name)
        self.size = size
        if not os.path.exists(self.backing) or os.path.getsize(self.backing) != size:
            self._make()
        warm(self.backing)
        self.fd = os.open(self.backing, os.O_RDWR | os.O_CLOEXEC)
        self.map = mmap.mmap(self.fd, size, prot=mmap.PROT_READ)

    def _make(self) -> None:
        zero = bytes(min(64 << 20, self.size))
        with open(self.backing, "wb") as f:
            done = 0
            while done < self.size:
                done += f.write(zero[:self.size - done])
            f.flush()
            os.fsync(f.fileno())

    def settle(self) -> None:
        """Before a run: no dirty page of an earlier run left to write back."""
        os.fsync(self.fd)

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


def reference_writes(dest, target: WriteTarget, bs: int, dst, slots, threads: int, timeout: float) -> float:
    """The reference pipeline in reverse, each client thread on its blocks:
    one gather into contiguous memory and one copy to the host (dest.gather),
    then a pwrite per block (os.pwrite lets go of the GIL)."""
    parts = list(enumerate(ranges(len(dst), threads)))
    dest.prepare_gather(bs, slots, len(parts))

    def work(part):
        k, (lo, hi) = part
        host = dest.gather(bs, slots, lo, hi, k)
        fd = target.fd
        for j in range(lo, hi):
            if os.pwrite(fd, host[j * bs:(j + 1) * bs], dst[j] * bs) != bs:
                raise OSError(f"short pwrite of block {j}")

    return run_threads(work, parts, timeout, "reference kv writes")


def write_size(a, dest, target: WriteTarget, bs: int, wd: Watchdog) -> list:
    """The write runs of one block size: BATCH_WRITE (the rows' runs and the
    comparison runs), then the reverse reference at each thread count."""
    dst, slots = plan_writes(target.size, bs, a.total, a.seed)
    cols = columns(dest.buf_id, dest.base, bs, dst, slots)
    runs = [("phxmount", t, n, row) for t, n, row in read_runs(a)] + [("reference", t, 0, True) for t in a.threads]
    out = []
    for k, (side, threads, inflight, is_row) in enumerate(runs):
        if side == "phxmount":
            name = f"kv write {bs >> 10}KiB {threads_name(threads)}, {inflight} in flight each ({WRITE_STATE})"
        else:
            name = f"kv write reference {bs >> 10}KiB {threads_name(threads)}: {dest.gather_name} ({WRITE_STATE})"
        try:
            wd.stage(f"{name}: fill the buffer, sync the file", a.timeout)
            dest.fill(a.seed * 1000 + k + bs)
            target.settle()
            wd.stage(f"{name}: writes", a.timeout)
            if side == "phxmount":
                dt = run_streams(target.mount, split(cols, threads), a.timeout, inflight, write=True)
            else:
                dt = reference_writes(dest, target, bs, dst, slots, threads, a.timeout)
            wd.stage(f"{name}: verifying every block", a.timeout)
            bad = verify(dest.to_host(), target.map, bs, dst, slots)
            extra = dict(inflight=inflight, ioctls=-(-len(dst) // EXTENTS), extents_per_ioctl=EXTENTS) \
                if side == "phxmount" else {}
            out.append(record(name, len(dst) * bs, dt, direction="write", side=side, block=bs, threads=threads,
                              row=is_row, cache=WRITE_STATE, blocks=len(dst), verified=len(dst),
                              mismatches=len(bad), first_bad=bad[:5], **extra))
            if bad:
                say(f"FAIL {name}: {len(bad)} of {len(dst)} blocks of the file differ from the buffer (first {bad[:5]})")
        except Exception as e:  # the next run still runs
            out.append(dict(failed(name, e), direction="write", side=side, block=bs, threads=threads, row=is_row))
    return out


def run_all(a, wd: Watchdog) -> dict:
    wd.stage("warm the file and register the buffer", a.timeout)
    warm(a.backing_file)
    dest = EmuDest(a.total, a.mount_file) if a.emu else TorchDest(a.total, a.mount_file)
    size = os.path.getsize(a.backing_file)
    res = {"tool": "gpu_kv", "file": a.backing_file, "file_bytes": size, "total_bytes": a.total, "seed": a.seed,
           "extents_per_ioctl": EXTENTS, "directions": a.directions, "results": []}
    sizes = [int(kib) << 10 for kib in a.sizes.split(",")]
    if "read" in a.directions:
        with open(a.backing_file, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as fmap:
            for bs in sizes:
                res["results"] += one_size(a, dest, fmap, size, bs, wd)
    if "write" in a.directions:
        wd.stage(f"make and warm the write file {a.write_name}", a.timeout)
        target = WriteTarget(a, size)
        res["write_file"] = target.backing
        try:
            for bs in sizes:
                res["results"] += write_size(a, dest, target, bs, wd)
        finally:
            target.close()
    return res


def main(argv=None) -> int:
    ap = tool_args(__doc__, backing_help="the same file, off the mount (for verification)")
    ap.add_argument("--sizes", default="16,64,256,1024", help="block sizes in KiB")
    ap.add_argument("--threads", default="1,4", help="client threads")
    ap.add_argument("--inflight", type=int, default=4,
                    help="BATCH ioctls each client thread keeps in flight (the loaders' default)")
    ap.add_argument("--total", default="2GiB", help="bytes moved per block size and run")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--timeout", type=float, default=120, help="seconds for each run's I/O (and its check)")
    ap.add_argument("--directions", default="read,write", help="read (restore), write (offload) or both")
    ap.add_argument("--write-name", default="kv-write.bin",
                    help="the file the writes go to, beside --mount-file and --backing-file (made at the read "
                         "file's size when absent)")
    ap.add_argument("--emu", action="store_true", help="the emulated device (a mount with --vendor emu)")
    a = ap.parse_args(argv)
    a.total, a.threads = parse_size(a.total), [int(x) for x in a.threads.split(",")]
    a.directions = [d for d in a.directions.split(",") if d]
    if not a.directions or set(a.directions) - {"read", "write"}:
        ap.error(f"--directions: read, write or both, not {','.join(a.directions)!r}")
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

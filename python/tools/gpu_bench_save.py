"""Saving, benchmarked (issue 9): the tensors of the benchmark file (8 GiB,
loaded into GPU memory once) written as a safetensors file

* through the mount with phxmount.save_safetensors (BATCH_WRITE), without
  and with fsync;
* with safetensors.torch.save_file to the backing directory (the same file
  system), without and with os.fsync;
* and the disk's write ceiling with fsync: the same byte count written
  sequentially in 64 MiB writes, buffered and O_DIRECT, then fsync.

Each side the best of N (fsync sides: --fsync-reps); every file is deleted
after its run, and the saved files are checked (header and size) once.
gpu_rows.py makes save_nofsync (against save_file), save_fsync (against
save_file + fsync) and save_fsync_vs_disk (against the better ceiling) of
them; the phxmount sides' notes say how much of the file the daemon
started writing back while it copied (user.phx.info's writeback keys)."""

import argparse
import mmap
import os
import sys

from benchlib import Watchdog, best_of, failed, record, say, write_json

import phxmount  # noqa: E402
from phxmount.client import phx_info_xattr  # noqa: E402
from phxmount.stformat import read_header  # noqa: E402

BLOCK = 64 << 20


def remove(path):
    if os.path.exists(path):
        os.remove(path)
    os.sync()


def check_file(path, tensors) -> str:
    h = read_header(path)
    want = {n: t.numel() * t.element_size() for n, t in tensors.items()}
    got = {t.name: t.nbytes for t in h.tensors}
    if got != want or os.path.getsize(path) != h.data_start + h.data_len:
        raise RuntimeError(f"{path}: the header or the size does not match the tensors")
    return f"{len(got)} tensors, header ok"


def phx_side(a, tensors, nbytes, fsync, reps):
    path = os.path.join(a.mount_dir, "bench-save-phx.safetensors")
    back = os.path.join(a.backing_dir, "bench-save-phx.safetensors")

    def run():
        w0 = writeback(a.mount_dir)
        s = phxmount.save_safetensors(tensors, path, fsync=fsync, threads=a.threads)
        w1 = writeback(a.mount_dir)
        started = (w1["writeback_started_bytes"] - w0["writeback_started_bytes"]) / 1e9 if w0 and w1 else None
        return (f"{s.extents} extents, {s.ioctls} ioctls, io {s.io_seconds:.3f}s, fsync {s.fsync_seconds:.3f}s, "
                + (f"the daemon started writeback of {started:.2f} GB during the save" if started is not None
                   else "the daemon reports no writeback keys"))

    # Removed through the mount: a file deleted on the backing side and
    # created again through the mount at once can meet the mount's cached
    # entry of the deleted one (the watcher's invalidation takes a few ms).
    best, note = best_of(reps, run, lambda: remove(path))
    note += "; " + check_file(back, tensors)
    remove(path)
    return record("phxmount save_safetensors" + (" fsync" if fsync else ""), nbytes, best, note=note)


def writeback(mount_dir):
    """user.phx.info's writeback counters (None from a daemon without them)."""
    info = phx_info_xattr(mount_dir)
    keys = ("writeback_started", "writeback_started_bytes", "writeback_dropped")
    return {k: int(info[k]) for k in keys} if all(k in info for k in keys) else None


def st_side(a, tensors, nbytes, fsync, reps):
    from safetensors.torch import save_file
    path = os.path.join(a.backing_dir, "bench-save-st.safetensors")

    def run():
        save_file(tensors, path)
        if fsync:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    best, _ = best_of(reps, run, lambda: remove(path))
    remove(path)
    return record("safetensors save_file" + (" fsync" if fsync else ""), nbytes, best, note="to the backing directory")


def ceiling(a, nbytes, direct, reps):
    path = os.path.join(a.backing_dir, "bench-save-ceiling.bin")
    buf = mmap.mmap(-1, BLOCK)  # page-aligned: O_DIRECT takes it
    buf.write(os.urandom(1 << 20) * (BLOCK >> 20))
    n = -(-nbytes // BLOCK) * BLOCK if direct else nbytes

    def run():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0), 0o644)
        try:
            done = 0
            while done < n:
                done += os.write(fd, memoryview(buf)[:min(BLOCK, n - done)])
            os.fsync(fd)
        finally:
            os.close(fd)

    best, _ = best_of(reps, run, lambda: remove(path))
    remove(path)
    return record(f"disk write ceiling fsync {'O_DIRECT' if direct else 'buffered'}", n, best,
                  note=f"{BLOCK >> 20} MiB writes then fsync, backing file system")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", required=True, help="the safetensors file on the mount whose tensors are saved")
    ap.add_argument("--mount-dir", required=True)
    ap.add_argument("--backing-dir", required=True, help="the mount's backing directory (same file system)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=1, help="runs of each side without fsync (best taken)")
    ap.add_argument("--fsync-reps", type=int, default=1, help="runs of each side with fsync, and of the ceilings")
    ap.add_argument("--threads", type=int, default=4)
    a = ap.parse_args()
    import torch
    wd = Watchdog("gpu_bench_save")
    wd.stage("load the tensors to save", 120)
    tensors = phxmount.load_safetensors(a.source, 0)
    torch.cuda.synchronize()
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    say(f"{len(tensors)} tensors, {nbytes / 1e9:.2f} GB to save each time")
    res = {"source": a.source, "bytes": nbytes, "results": []}
    steps = [("phxmount save", lambda: phx_side(a, tensors, nbytes, False, a.reps)),
             ("safetensors save_file", lambda: st_side(a, tensors, nbytes, False, a.reps)),
             ("phxmount save, fsync", lambda: phx_side(a, tensors, nbytes, True, a.fsync_reps)),
             ("safetensors save_file, fsync", lambda: st_side(a, tensors, nbytes, True, a.fsync_reps)),
             ("disk write ceiling, buffered", lambda: ceiling(a, nbytes, False, a.fsync_reps)),
             ("disk write ceiling, O_DIRECT", lambda: ceiling(a, nbytes, True, a.fsync_reps))]
    for what, fn in steps:
        wd.stage(what, 240)
        try:
            res["results"].append(fn())
        except Exception as e:  # the other sides still run
            res["results"].append(failed(what, e))
    wd.done()
    write_json(a.out, res)
    return 1 if any("error" in r for r in res["results"]) else 0


if __name__ == "__main__":
    sys.exit(main())

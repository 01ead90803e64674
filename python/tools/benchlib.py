"""What the GPU tools share (no torch here): progress lines, a watchdog that
ends a run that hangs (naming what hung), the page cache (warm, drop),
best-of-N timing, sizes, result records and JSON output."""

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

T0 = time.monotonic()


def say(msg: str) -> None:
    """A progress line, with the seconds since the tool started."""
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


class Watchdog:
    """Ends the process (exit status 3) when the stage now running takes
    longer than its limit, saying which stage: a hung ioctl cannot be
    interrupted from Python, and the GPU run must not wait for it."""

    def __init__(self, tool: str):
        self.tool = tool
        self._lock = threading.Lock()
        self._stage, self._deadline = "", None
        threading.Thread(target=self._run, daemon=True, name="watchdog").start()

    def stage(self, what: str, seconds: float) -> None:
        with self._lock:
            self._stage, self._deadline = what, time.monotonic() + seconds
        say(f"{self.tool}: {what} (limit {seconds:.0f} s)")

    def done(self) -> None:
        with self._lock:
            self._deadline = None

    def _run(self) -> None:
        while True:
            time.sleep(0.5)
            with self._lock:
                late = self._deadline is not None and time.monotonic() > self._deadline
                what = self._stage
            if late:
                print(f"FAIL {self.tool}: {what}: not done within its time limit; exiting", flush=True)
                os._exit(3)


def tool_args(doc: str, mount_help: str = "the file on the mount",
              backing_help: str = "the same file, off the mount") -> argparse.ArgumentParser:
    """The options every tool takes: --mount-file, --backing-file, --out."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--mount-file", required=True, help=mount_help)
    ap.add_argument("--backing-file", required=True, help=backing_help)
    ap.add_argument("--out", required=True, help="the raw results (JSON)")
    return ap


def drop_caches() -> None:
    """Empties the page cache (root): sync, then 3 > drop_caches."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def warm(path: str) -> None:
    """Reads the whole file, so it is in the page cache."""
    with open(path, "rb", buffering=0) as f:
        while f.read(64 << 20):
            pass


def best_of(n: int, fn, before=None):
    """Runs before() (untimed) then fn() n times; returns (best seconds,
    what fn returned on the best run)."""
    best, note = None, None
    for _ in range(n):
        if before is not None:
            before()
        t0 = time.perf_counter()
        r = fn()
        dt = time.perf_counter() - t0
        if best is None or dt < best:
            best, note = dt, r
    return best, note


def record(name: str, nbytes: int, seconds: float, **extra) -> dict:
    """A result as the report reads it: name, bytes, seconds, gbps."""
    r = {"name": name, "bytes": nbytes, "seconds": seconds, "gbps": nbytes / seconds / 1e9 if seconds else None}
    r.update(extra)
    say(f"{name:<52} {r['gbps'] or 0:8.2f} GB/s  {seconds:8.4f} s  "
        + " ".join(f"{k}={v}" for k, v in extra.items() if not isinstance(v, (dict, list))))
    return r


def failed(name: str, err: BaseException) -> dict:
    """A result that did not measure: the report shows it as not run."""
    say(f"FAIL {name}: {type(err).__name__}: {err}")
    return {"name": name, "error": f"{type(err).__name__}: {err}"}


def parse_size(s: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[:-len(u)]) * m)
    return int(s)


def write_json(path: str, obj) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)
    say(f"wrote {path}")


def pinned_ceiling_gbps() -> float:
    """The pinned host-to-device copy ceiling: 1 GiB from pinned memory to
    cuda:0 with torch, best of 5 (GB/s)."""
    import torch
    h = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    d = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
    best = None
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        d.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        s = time.perf_counter() - t0
        best = s if best is None else min(best, s)
    return (1 << 30) / best / 1e9


def in_threads(fn, n: int) -> None:
    """fn(0) ... fn(n-1), each on a thread of its own, all at once."""
    ts = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()

"""What the GPU tools share (no torch here): progress lines, a watchdog that
ends a run that hangs (naming what hung), the page cache (warm, drop, and
a check that dropped files are cold), best-of-N timing, sizes, result
records, the run a row belongs to, and JSON output."""

import argparse
import ctypes
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The safetensors format's one owner is phxmount's parser: the tools that
# write or read checkpoints take it from here (one import line to follow it).
from phxmount.stformat import DTYPE_SIZES, encode_header, read_header  # noqa: E402,F401

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


class NotCold(RuntimeError):
    """Files meant to be read cold still had pages in the page cache."""


_libc = None


def _c():
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
        lib.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        lib.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
        _libc = lib
    return _libc


MINCORE_WINDOW = 1 << 30  # bytes of a file mapped at a time to ask mincore about


def resident_pages(path: str):
    """(pages of path in the page cache, pages of path): mincore(2) on a
    read-only shared mapping of each window of the file (the mapping
    faults nothing in: mincore reports the page cache). OSError where the
    file cannot be mapped (a mount that does not support mmap)."""
    c, page = _c(), os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        resident = 0
        for off in range(0, size, MINCORE_WINDOW):
            n = min(MINCORE_WINDOW, size - off)
            addr = c.mmap(None, n, 1, 1, fd, off)  # PROT_READ, MAP_SHARED
            if addr in (None, ctypes.c_void_p(-1).value):
                e = ctypes.get_errno()
                raise OSError(e, f"mmap {path} at {off}: {os.strerror(e)}")
            try:
                pages = -(-n // page)
                vec = ctypes.create_string_buffer(pages)
                if c.mincore(addr, n, vec) != 0:
                    e = ctypes.get_errno()
                    raise OSError(e, f"mincore {path} at {off}: {os.strerror(e)}")
                resident += pages - vec.raw[:pages].count(0)
            finally:
                c.munmap(addr, n)
        return resident, -(-size // page)
    finally:
        os.close(fd)


def check_cold(paths, unchecked=()) -> str:
    """Raises NotCold naming every file of paths with a page in the page
    cache; returns what was checked. paths: files that must be cold (their
    bytes are what the clock times); unchecked: other names of the same
    bytes (a file through a mount) checked where they can be mapped."""
    hot, notes = [], []
    for p in paths:
        r, n = resident_pages(p)
        if r:
            hot.append(f"{p}: {r} of {n} pages resident")
    for p in unchecked:
        try:
            r, n = resident_pages(p)
        except OSError as e:
            notes.append(f"{p} not checked ({e.strerror or e})")
            continue
        if r:
            hot.append(f"{p}: {r} of {n} pages resident")
    if hot:
        raise NotCold("not cold after dropping caches: " + "; ".join(hot))
    return f"{len(paths) + len(unchecked) - len(notes)} file(s) checked cold (mincore)" + \
        (f"; {'; '.join(notes)}" if notes else "")


def cold_start(paths, unchecked=(), drop=None, tries: int = 3, pause: float = 1.0) -> str:
    """Drops the page cache (drop, default drop_caches) and checks that
    paths are cold (check_cold) before a cold run's clock starts. Pages a
    process still maps survive a drop (the daemon keeps a file's mapping a
    moment after a load), so it tries again, pause seconds apart, tries
    times in all; then raises NotCold: the run must not be timed."""
    drop = drop or drop_caches
    for i in range(tries):
        drop()
        try:
            return check_cold(paths, unchecked)
        except NotCold:
            if i == tries - 1:
                raise
            time.sleep(pause)


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


def this_run():
    """The run a tool's rows belong to, as gpu-test.sh names it in the
    environment (PHX_RUN_DATE, PHX_RUN_COMMIT, PHX_RUN_MACHINE), or None."""
    run = {k: os.environ.get(f"PHX_RUN_{k.upper()}") for k in ("date", "commit", "machine")}
    return run if all(run.values()) else None


def write_json(path: str, obj) -> None:
    """obj as JSON, atomically; the document and the rows in it (a tool's
    {"rows": [...]}) say which run measured them (this_run, "run") where
    the environment names it: the report's rows made from a tool's raw
    results take their run from it."""
    run = this_run()
    if run and isinstance(obj, dict):
        obj = dict(obj, run=obj.get("run") or run)
        if isinstance(obj.get("rows"), list):
            obj["rows"] = [r if r.get("run") else dict(r, run=run) for r in obj["rows"]]
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


def hook_stats():
    """What the phxmount hook did in this process (its report, hook.report:
    files, tensors, bytes landed, fallbacks, and the perf_counter of the
    first read asked for and the last landed), or None where it is not on.
    Importing the hook would turn it on: only a loaded one is asked (the
    .pth loads it at interpreter start when PHXMOUNT_HOOK is set)."""
    hook = sys.modules.get("phxmount.hook")
    mode = getattr(hook, "_mode", None)
    r = getattr(hook, "report", None)
    if hook is None or r is None or (mode is not None and not getattr(mode, "on", True)):
        return None
    out = {k: getattr(r, k, None) for k in ("files", "tensors", "bytes", "fallbacks", "starts", "opened_ahead", "first", "last")}
    out["summary"] = r.summary() if hasattr(r, "summary") else ""
    return out


def hook_fails(hooks, what: str) -> list:
    """What makes a hooked run's figure stock's: the hook not on, no file
    through phxmount, a fall-back to safetensors (hooks: hook_stats() of
    each run)."""
    out = []
    for h in hooks:
        if not h:
            out.append(f"{what}: the hook was not on")
        elif not h.get("files"):
            out.append(f"{what}: no file went through phxmount ({h.get('summary')})")
        elif h.get("fallbacks"):
            out.append(f"{what}: the hook fell back to safetensors ({h.get('summary')})")
    return sorted(set(out))


def fresh(cmd, hook: str = "", timeout: float = 300, env=None, pythonpath=()) -> dict:
    """cmd (a Python tool's child) in a fresh process, PHXMOUNT_HOOK=hook
    (unset when empty): the JSON its last stdout line holds, or {"error"}
    (its status and the end of its stderr). The hook's own lines on
    stderr are said."""
    import subprocess
    e = {k: v for k, v in (env or os.environ).items() if k != "PHXMOUNT_HOOK"}
    if hook:
        e["PHXMOUNT_HOOK"] = hook
    if pythonpath:
        e["PYTHONPATH"] = os.pathsep.join(list(pythonpath) + [e.get("PYTHONPATH", "")])
    try:
        r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s: {' '.join(cmd[1:4])}"}
    for line in r.stderr.splitlines():
        if "phxmount hook:" in line:
            say(f"  {line[:300]}")
    if r.returncode != 0:
        return {"error": f"exit {r.returncode}: {r.stderr[-800:]}"}
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": f"no JSON on stdout: {r.stdout[-300:]} {r.stderr[-300:]}"}


def barrier(directory: str, name: str, n: int, timeout: float, pause: float = 0.002) -> float:
    """Marks name done in directory, then waits until n names are (the
    processes of one measurement each at the end of its clock, so that
    what one does after its clock, e.g. its comparison with stock, cannot
    run beside another's clock). Returns the seconds it waited; raises
    TimeoutError when fewer than n arrived within timeout."""
    os.makedirs(directory, exist_ok=True)
    mark = os.path.join(directory, name + ".done")
    with open(mark + ".tmp", "w"):
        pass
    os.replace(mark + ".tmp", mark)
    t0 = time.monotonic()
    while True:
        got = sum(1 for f in os.listdir(directory) if f.endswith(".done"))
        if got >= n:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{got} of {n} processes reached the barrier in {directory} within {timeout:.0f} s")
        time.sleep(pause)


def in_threads(fn, n: int) -> None:
    """fn(0) ... fn(n-1), each on a thread of its own, all at once."""
    ts = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()

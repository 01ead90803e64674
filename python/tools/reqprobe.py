"""Where an open or a close of a file on a mount waits while a load runs
(no torch here). Three views of the same interval, side by side:

* this process: every os.open and os.close of a path under the mount,
  timed (the hook and the client open and close through os);
* another process: a file on the mount opened and closed every 2 ms, timed
  (it holds no GIL of this process and issues no ioctls);
* the daemon: its service time of each FUSE request (the
  phxmount_request_duration_seconds histogram of --metrics), the
  difference over the interval.

Slow in this process alone: the caller waits in Python (the GIL); slow in
both processes but quick in the daemon: the kernel queues the request;
slow in the daemon: the daemon serves it late."""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

# The bucket bound the "slow" count starts at: the histogram's
# (internal/metrics.RequestBuckets) nearest to fusefs.SlowRequest (50 ms).
SLOW_LE = "0.04096"

_PROBER = r"""
import json, os, sys, time
path, stop = sys.argv[1], sys.argv[2]
lat = []
while not os.path.exists(stop):
    t = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    t1 = time.perf_counter()
    os.close(fd)
    lat.append(((t1 - t) * 1e3, (time.perf_counter() - t1) * 1e3))
    time.sleep(0.002)
print(json.dumps(lat))
"""

_SAMPLE = re.compile(r'^phxmount_request_duration_seconds_(bucket|sum|count)\{([^}]*)\} (\S+)$')


def request_times(url: str) -> dict:
    """{request: {"count", "sum_ms", "slow"}} from the daemon's metrics at
    url (slow: requests over SLOW_LE seconds)."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        r = out.setdefault(labels["request"], {"count": 0, "sum_ms": 0.0, "slow": 0, "_le": 0})
        v = float(m.group(3))
        if m.group(1) == "count":
            r["count"] = int(v)
        elif m.group(1) == "sum":
            r["sum_ms"] = v * 1e3
        elif labels.get("le") == SLOW_LE:
            r["_le"] = int(v)
    for r in out.values():
        r["slow"] = r["count"] - r.pop("_le")
    return out


def spread(ms) -> dict:
    """n, p50, p99 and max of a list of milliseconds."""
    if not ms:
        return {"n": 0}
    s = sorted(ms)
    return {"n": len(s), "p50_ms": round(s[len(s) // 2], 3), "p99_ms": round(s[min(len(s) - 1, len(s) * 99 // 100)], 3),
            "max_ms": round(s[-1], 3)}


class RequestProbe:
    """with RequestProbe(mount, probe_file, metrics_url) as p: ...; then
    p.summary(). probe_file: a file on the mount the other process opens
    and closes; metrics_url: the daemon's /metrics (None: not asked)."""

    def __init__(self, mount: str, probe_file: str, metrics_url=None):
        self.mount = os.path.realpath(mount) + os.sep
        self.probe_file, self.url = probe_file, metrics_url
        self.opens, self.closes = [], []
        self._fds = set()
        self.other, self.daemon, self.why = None, None, {}

    def _open(self, path, flags, mode=0o777, *, dir_fd=None):
        t = time.perf_counter()
        fd = self._real_open(path, flags, mode, dir_fd=dir_fd)
        if dir_fd is None and os.path.realpath(os.fsdecode(path)).startswith(self.mount):
            self.opens.append((time.perf_counter() - t) * 1e3)
            self._fds.add(fd)
        return fd

    def _close(self, fd):
        t = time.perf_counter()
        try:
            self._real_close(fd)
        finally:
            if fd in self._fds:
                self._fds.discard(fd)
                self.closes.append((time.perf_counter() - t) * 1e3)

    def __enter__(self):
        if self.url:
            try:
                self._before = request_times(self.url)
            except OSError as e:
                self.why["daemon"], self.url = f"metrics at {self.url}: {e}", None
        self._stop = f"/tmp/reqprobe-{os.getpid()}.stop"
        if os.path.exists(self._stop):
            os.unlink(self._stop)
        self._proc = subprocess.Popen([sys.executable, "-c", _PROBER, self.probe_file, self._stop],
                                      stdout=subprocess.PIPE, text=True)
        self._real_open, self._real_close = os.open, os.close
        os.open, os.close = self._open, self._close
        return self

    def __exit__(self, *exc):
        os.open, os.close = self._real_open, self._real_close
        open(self._stop, "w").close()
        out, _ = self._proc.communicate(timeout=30)
        os.unlink(self._stop)
        if self._proc.returncode == 0:
            lat = json.loads(out)
            self.other = {"open": spread([o for o, _ in lat]), "close": spread([c for _, c in lat])}
        else:
            self.why["other_process"] = f"prober exited {self._proc.returncode}"
        if self.url:
            after = request_times(self.url)
            self.daemon = {k: {"count": v["count"] - self._before.get(k, {}).get("count", 0),
                               "sum_ms": round(v["sum_ms"] - self._before.get(k, {}).get("sum_ms", 0.0), 3),
                               "slow": v["slow"] - self._before.get(k, {}).get("slow", 0)}
                           for k, v in after.items()}
        return False

    def summary(self) -> dict:
        """The three views; a view not taken is "not run" with its reason."""
        return {"this_process": {"open": spread(self.opens), "close": spread(self.closes)},
                "other_process": self.other or f"not run: {self.why.get('other_process', '')}",
                "daemon": self.daemon or f"not run: {self.why.get('daemon', 'no --metrics')}"}

#!/usr/bin/env python3
"""Where a batch's time goes, from a runtime trace of the daemon
(PHXMOUNT_TRACE) or of phxbench-gpu kv (-trace): the duration of every
region (fusefs.ioctl, phxfs.prepare, phxfs.execute, phxfs.gather,
phxfs.read, phxfs.scatter, phxfs.await) and how many ioctls were in
service at once.

Runs where Go is (the GPU machine has none): the trace comes back from the
device call, then

    python3 scripts/gpu-probes/traceregions.py TRACE [TRACE...]

prints, per trace and region type: count, total ms, median, p90 and max
us, and for fusefs.ioctl the mean number in service over the span from the
first to the last (the client's in-flight depth as the daemon saw it).
"""

import re
import statistics
import subprocess
import sys

EVENT = re.compile(r"G=(\d+) Region(Begin|End) Time=(\d+) .*Type=\"([^\"]+)\"")


def regions(path: str):
    """{type: [(begin ns, end ns)]} of the trace's regions, paired per
    goroutine (regions nest on a goroutine, never interleave)."""
    out = subprocess.run(["go", "tool", "trace", "-d=parsed", path], capture_output=True, text=True, check=True).stdout
    open_, spans = {}, {}
    for m in EVENT.finditer(out):
        g, kind, t, typ = m.group(1), m.group(2), int(m.group(3)), m.group(4)
        stack = open_.setdefault(g, [])
        if kind == "Begin":
            stack.append((typ, t))
        elif stack and stack[-1][0] == typ:
            spans.setdefault(typ, []).append((stack.pop()[1], t))
    return spans


def in_service(spans) -> float:
    """The mean number of spans open at once, over first begin to last end."""
    if not spans:
        return 0.0
    lo, hi = min(b for b, _ in spans), max(e for _, e in spans)
    return sum(e - b for b, e in spans) / max(hi - lo, 1)


def report(path: str) -> None:
    spans = regions(path)
    print(f"== {path}")
    for typ in sorted(spans):
        d = sorted((e - b) / 1e3 for b, e in spans[typ])
        p90 = d[min(len(d) - 1, int(0.9 * len(d)))]
        line = (f"  {typ:16s} {len(d):7d} x  total {sum(d) / 1e3:9.1f} ms  median {statistics.median(d):8.1f} us  "
                f"p90 {p90:8.1f} us  max {d[-1]:8.1f} us")
        if typ == "fusefs.ioctl":
            line += f"  in service at once {in_service(spans[typ]):.2f}"
        print(line)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        report(p)

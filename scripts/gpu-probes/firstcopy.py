"""What a process's first device copies cost, against the same copies
again (run 69: the hooked narrow loop's first copy_, 19.5 MB from device
memory to device memory, took 16.6 ms with no Python below it). A fresh
process, its CUDA context made first, then each copy twice, synchronized
and timed: a contiguous device-to-device copy (torch's memcpy path), a
column slice into a contiguous tensor (an elementwise copy kernel), and a
contiguous host-to-device copy from pageable memory. If the first of a
kind costs milliseconds and the second microseconds, what the loop waits
in is the first use (the driver's or torch's lazy setup), which a hook can
pay ahead, off the caller's path.

    python3 scripts/gpu-probes/firstcopy.py        (prints one JSON line)
"""

import json
import time

import torch


def timed(fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return round((time.perf_counter() - t) * 1e3, 3)


def main():
    t = time.perf_counter()
    torch.empty(1, device="cuda:0")
    out = {"context_ms": round((time.perf_counter() - t) * 1e3, 1)}
    bf = torch.bfloat16
    src = torch.empty(19_500_000 // 2, dtype=bf, device="cuda:0")
    dst = torch.empty_like(src)
    out["d2d_first_ms"] = timed(lambda: dst.copy_(src))
    out["d2d_second_ms"] = timed(lambda: dst.copy_(src))
    wide = torch.empty(3584, 18944, dtype=bf, device="cuda:0")
    col = torch.empty(3584, 18944 // 8, dtype=bf, device="cuda:0")
    out["column_first_ms"] = timed(lambda: col.copy_(wide[:, 7 * 2368:]))
    out["column_second_ms"] = timed(lambda: col.copy_(wide[:, 7 * 2368:]))
    host = torch.empty(19_500_000 // 2, dtype=bf)
    out["h2d_first_ms"] = timed(lambda: dst.copy_(host))
    out["h2d_second_ms"] = timed(lambda: dst.copy_(host))
    f32 = torch.empty(3584, dtype=torch.float32, device="cuda:0")
    out["cast_first_ms"] = timed(lambda: f32.copy_(src[:3584]))
    out["cast_second_ms"] = timed(lambda: f32.copy_(src[:3584]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()

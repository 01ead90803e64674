"""What a torch allocation costs a thread while another runs Python (the
GIL): 2,000 CUDA tensors of 3 MB each way, alone and beside a busy thread,
at the interpreter's switch interval and at 0.2 ms. A probe (issue 27: a
from_pretrained start allocated at ~0.5 ms a tensor beside transformers'
loop, 20 us alone). Prints one JSON line."""

import json
import sys
import threading
import time

import torch

N, SHAPE = 2000, (768, 2048)
dev = torch.device("cuda:0")
torch.empty(1, device=dev)


def ways():
    aten = torch.ops.aten.empty.memory_format
    return {"torch.empty": lambda: torch.empty(SHAPE, dtype=torch.bfloat16, device=dev),
            "aten.empty": lambda: aten(SHAPE, dtype=torch.bfloat16, device=dev)}


def alloc_loop(make):
    keep = []
    t0 = time.perf_counter()
    for _ in range(N):
        keep.append(make())
    dt = time.perf_counter() - t0
    del keep
    torch.cuda.empty_cache()
    return round(dt / N * 1e6, 1)


def beside_busy(make, interval):
    old = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    stop = threading.Event()

    def busy():
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i
    t = threading.Thread(target=busy)
    t.start()
    time.sleep(0.02)
    try:
        return alloc_loop(make)
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)


out = {}
for name, make in ways().items():
    out[name] = {"alone_us": alloc_loop(make), "busy_5ms_us": beside_busy(make, 0.005),
                 "busy_0.2ms_us": beside_busy(make, 0.0002)}
print(json.dumps(out))

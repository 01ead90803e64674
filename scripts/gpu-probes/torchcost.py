"""What torch's per-tensor calls cost on this machine's CPU (a GPU probe,
issue 27): the pieces a hooked get_tensor could be made of, each timed
over N calls after a warm-up, in us a call. Decides whether handing out
views of one allocation a window (as_strided) would pay over one
torch.empty a tensor.

    python3 torchcost.py [N]"""

import sys
import time

import torch

N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
dev = torch.device("cuda", 0)
shape, dt = (512, 256), torch.bfloat16
nb = 512 * 256 * 2
buf = torch.empty(N * nb, dtype=torch.uint8, device=dev)
flat = buf.view(dt)
params = [torch.empty(shape, dtype=dt, device=dev) for _ in range(N)]
torch.cuda.synchronize()


def cost(label, f):
    for i in range(min(N, 200)):
        f(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(N):
        f(i)
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    print(f"{label:58s} {t / N * 1e6:7.2f} us")


keep = []
cost("torch.empty(shape, bf16, cuda), freed at once", lambda i: torch.empty(shape, dtype=dt, device=dev))
cost("torch.empty(shape, bf16, cuda), kept", lambda i: keep.append(torch.empty(shape, dtype=dt, device=dev)))
keep.clear()
cost("torch.empty(nb, uint8, cuda), freed at once", lambda i: torch.empty(nb, dtype=torch.uint8, device=dev))
el = nb // 2
cost("flat.as_strided(shape, (256, 1), i*el)", lambda i: flat.as_strided(shape, (256, 1), i * el))
cost("buf[a:b].view(bf16).view(shape)", lambda i: buf[i * nb:(i + 1) * nb].view(dt).view(shape))
cost("flat[a:b].view(shape)", lambda i: flat[i * el:(i + 1) * el].view(shape))
cost("t.data_ptr()", lambda i: params[i].data_ptr())
cost("t.numel() * t.element_size()", lambda i: params[i].numel() * params[i].element_size())
cost("t.nbytes", lambda i: params[i].nbytes)
cost("t.shape == shape", lambda i: params[i].shape == shape)
cost("param.copy_(view)", lambda i: params[i].copy_(flat.as_strided(shape, (256, 1), i * el)))
cost("torch.cuda.current_stream(0)", lambda i: torch.cuda.current_stream(0))

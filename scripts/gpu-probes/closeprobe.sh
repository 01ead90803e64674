#!/usr/bin/env bash
# Why a close of a mount file costs ms in a loading process: open/close
# timings with and without CUDA, with and without ioctls on the fd.
set -u
W=/var/tmp/phxgpu; mkdir -p $W/mnt
python3 -m pip install -q --no-index --no-deps --no-build-isolation ./python > $OUT/pip.log 2>&1
mkdir -p $W/backing; F=probe.safetensors
python3 -c "import torch, safetensors.torch as st; st.save_file({f't{i}': torch.ones(1024, 1024) for i in range(16)}, '$W/backing/$F')"
./.devcarry/phxmount --vendor nvidia $W/backing $W/mnt > $OUT/daemon.log 2>&1 &
D=$!
./.devcarry/phxmount wait --timeout 10 $W/mnt >> $OUT/daemon.log 2>&1 || { echo "no mount"; exit 1; }
cat > /tmp/cp.py <<'PY'
import os, sys, time, statistics
path = sys.argv[1]; mode = sys.argv[2]
if "cuda" in mode:
    import torch; torch.empty(1, device="cuda:0")
from phxmount.client import PhxFile
def t(fn, n=30):
    xs = []
    for _ in range(n):
        a = time.perf_counter(); fn(); xs.append((time.perf_counter() - a) * 1e3)
    xs.sort(); return f"p50 {xs[len(xs)//2]:.3f} ms max {xs[-1]:.3f} ms"
def oc():
    os.close(os.open(path, os.O_RDONLY))
def info_then_close():
    f = PhxFile(path); f.info(0); a = time.perf_counter(); f.close(); return a
closes = []
def c2():
    f = PhxFile(path); f.info(0); a = time.perf_counter(); f.close(); closes.append((time.perf_counter()-a)*1e3)
print(mode, "open+close:", t(oc), flush=True)
for _ in range(30): c2()
closes.sort(); print(mode, "close after an INFO ioctl: p50 %.3f max %.3f ms" % (closes[15], closes[-1]), flush=True)
if "load" in mode:
    import phxmount, torch
    cs = []
    for _ in range(5):
        r = phxmount.safe_open(path, "pt", device="cuda:0")
        x = r.get_tensor(r.keys()[0]); torch.cuda.synchronize()
        a = time.perf_counter(); r.close(); cs.append((time.perf_counter()-a)*1e3)
    print(mode, "reader close after a tensor:", [round(c, 3) for c in cs], flush=True)
PY
for m in plain cuda cuda+load; do python3 /tmp/cp.py $W/mnt/$F $m; done 2>&1 | tee $OUT/close.txt
umount $W/mnt; wait $D

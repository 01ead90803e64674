#!/usr/bin/env bash
# Where a dim-1 (column) shard load's time goes on the GPU machine: the
# daemon's CPU profile and a cProfile of the client, plus the in-process
# numbers. Results under $OUT.
set -u
W=/var/tmp/phxgpu; mkdir -p $W/backing $W/mnt
python3 -m pip install -q --no-index --no-deps --no-build-isolation ./python > $OUT/pip.log 2>&1
python3 - <<'PY'
import torch, safetensors.torch as st, os
p = "/var/tmp/phxgpu/backing/cols.safetensors"
if not os.path.exists(p):
    g = torch.Generator().manual_seed(0)
    ts = {}
    for i in range(12):
        ts[f"l{i:02d}.o"] = torch.randn(4096, 4096, generator=g).to(torch.bfloat16)
        ts[f"l{i:02d}.down"] = torch.randn(4096, 14336, generator=g).to(torch.bfloat16)
    st.save_file(ts, p)
print("file", os.path.getsize(p))
PY
cat $W/backing/cols.safetensors > /dev/null
PHXMOUNT_CPUPROFILE=$OUT/daemon.prof ./.devcarry/phxmount --vendor nvidia $W/backing $W/mnt > $OUT/daemon.log 2>&1 &
D=$!
./.devcarry/phxmount wait --timeout 10 $W/mnt >> $OUT/daemon.log 2>&1 || { echo "no mount"; tail $OUT/daemon.log; exit 1; }
python3 - > $OUT/client.txt 2>&1 <<'PY'
import time, torch, cProfile, pstats, io
import phxmount
p = "/var/tmp/phxgpu/mnt/cols.safetensors"
torch.empty(1, device="cuda:0")
def load(world, names=None):
    torch.cuda.synchronize(); t = time.perf_counter()
    r = phxmount.load_safetensors(p, 0, names=names, shard=(1, world - 1, world))
    torch.cuda.synchronize(); s = time.perf_counter() - t
    return r, s
for world in (2, 8):
    for names, what in ((lambda n: n.endswith(".o"), "o (8192-byte rows)"), (lambda n: n.endswith(".down"), "down (28672-byte rows)")):
        best, nb = 1e9, 0
        for _ in range(8):
            r, s = load(world, names)
            nb = sum(t.numel() * t.element_size() for t in r.values())
            best = min(best, s); del r
        print(f"W={world} {what}: {nb/1e9:.3f} GB best {best*1e3:.2f} ms = {nb/best/1e9:.2f} GB/s", flush=True)
# many loads for the daemon profile, and a client profile of one
for _ in range(40):
    r, s = load(8, lambda n: n.endswith(".o")); del r
pr = cProfile.Profile(); pr.enable()
r, s = load(8, lambda n: n.endswith(".o"))
pr.disable()
print("profiled load", s)
out = io.StringIO(); pstats.Stats(pr, stream=out).sort_stats("cumulative").print_stats(35); print(out.getvalue())
out = io.StringIO(); pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(20); print(out.getvalue())
PY
umount $W/mnt; wait $D
grep -E "W=|profiled" $OUT/client.txt
ls -la $OUT

#!/usr/bin/env bash
# Where the hooked world-8 engines' loop spends its time (checkpoint from a
# focus run on this machine): daemon CPU profile, client cProfile.
set -u
W=/var/tmp/phxgpu; mkdir -p $W/mnt
ls $W/backing/llama/*.safetensors >/dev/null || { echo "no checkpoint"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-build-isolation ./python > $OUT/pip.log 2>&1
cat $W/backing/llama/*.safetensors > /dev/null
PHXMOUNT_CPUPROFILE=$OUT/daemon.prof ./.devcarry/phxmount --vendor nvidia $W/backing $W/mnt > $OUT/daemon.log 2>&1 &
D=$!
./.devcarry/phxmount wait --timeout 10 $W/mnt >> $OUT/daemon.log 2>&1 || { echo "no mount"; exit 1; }
cd python/tools && python3 - > $OUT/client.txt 2>&1 <<'PY'
import time, torch, cProfile, pstats, io, os, sys
sys.path.insert(0, ".")
import gpu_tp
from phxmount import hook
files = gpu_tp.files_of("/var/tmp/phxgpu/mnt/llama")
torch.empty(1, device="cuda:0")
hook.install(hook.Mode(True, "cuda:0"))
for _ in range(6):
    out, s = gpu_tp.engine_loop(files, 7, 8)
    print("hooked world 8 rank 7", round(s, 4), flush=True); del out
pr = cProfile.Profile(); pr.enable()
out, s = gpu_tp.engine_loop(files, 7, 8)
pr.disable(); print("profiled", s); del out
o = io.StringIO(); pstats.Stats(pr, stream=o).sort_stats("cumulative").print_stats(45); print(o.getvalue())
o = io.StringIO(); pstats.Stats(pr, stream=o).sort_stats("tottime").print_stats(25); print(o.getvalue())
print(hook.report.summary())
PY
cd ../..
umount $W/mnt; wait $D
grep -E "hooked|profiled" $OUT/client.txt

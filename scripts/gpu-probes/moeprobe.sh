#!/usr/bin/env bash
# Which path fails a hooked load of a MoE checkpoint (1,611 tensors of 256
# KiB) with EINVAL (run 34): the same load under each PHX_SCATTER method,
# the daemon at debug level with CUDA's own error log (CUDA_LOG_FILE), and
# the library's load_safetensors beside the hook.
set -u
W=/var/tmp/phxgpu; mkdir -p $W/mnt $W/backing
python3 -m pip install -q --no-index --no-deps --no-build-isolation ./python > $OUT/pip.log 2>&1
python3 python/tools/ckpt_gen.py gen --quick --only moe --root $W/backing/ckpt27 > $OUT/gen.txt 2>&1
D0=$(ls -d $W/backing/ckpt27/moe-* | head -1); REL=${D0#$W/backing/}
cat > /tmp/moe.py <<'PY'
import os, sys, time, traceback
d = sys.argv[1]
files = sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".safetensors"))
import torch
import safetensors.torch as st
import phxmount
torch.empty(1, device="cuda:0")
bad = 0
for p in files:
    try:
        t0 = time.perf_counter()
        got = phxmount.load_safetensors(p, 0)
        torch.cuda.synchronize()
        print(f"load_safetensors {os.path.basename(p)}: {len(got)} tensors in {time.perf_counter() - t0:.3f} s", flush=True)
    except Exception as e:  # noqa: BLE001
        bad += 1
        print(f"load_safetensors {os.path.basename(p)}: FAILED {e!r}", flush=True)
        traceback.print_exc()
print("failures", bad)
PY
for m in auto copies batch kernel; do
	echo "=== PHX_SCATTER=$m" | tee -a $OUT/moe.txt
	CUDA_LOG_FILE=$OUT/cuda-$m.log PHX_SCATTER=$m ./.devcarry/phxmount --vendor nvidia --log-level debug $W/backing $W/mnt > $OUT/daemon-$m.log 2>&1 &
	D=$!
	./.devcarry/phxmount wait --timeout 10 $W/mnt >> $OUT/daemon-$m.log 2>&1 || { echo "no mount"; exit 1; }
	timeout 60 python3 /tmp/moe.py $W/mnt/$REL >> $OUT/moe.txt 2>&1
	PHXMOUNT_HOOK=1 timeout 60 python3 -c "
import os, sys, torch, safetensors.torch as st
d = sys.argv[1]; fs = sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith('.safetensors'))
for p in fs:
    a = st.load_file(p, device='cuda:0'); print('hooked load_file', os.path.basename(p), len(a), flush=True)
" $W/mnt/$REL >> $OUT/moe.txt 2>&1
	getfattr -n user.phx.info $W/mnt/$REL/$(ls $W/backing/$REL | grep safetensors | head -1) >> $OUT/moe.txt 2>&1
	umount $W/mnt; wait $D
	grep -v "registered\|released buffer" $OUT/daemon-$m.log | tail -40 > $OUT/daemon-$m.tail
done
tail -c 20000 $OUT/moe.txt

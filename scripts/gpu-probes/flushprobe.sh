#!/usr/bin/env bash
# Why a reader's close takes ms right after a column-slice load.
set -u
W=/var/tmp/phxgpu; mkdir -p $W/mnt $W/backing
python3 -m pip install -q --no-index --no-deps --no-build-isolation ./python > $OUT/pip.log 2>&1
python3 -c "import torch, safetensors.torch as st; st.save_file({f'l{i:02d}.o': torch.ones(4096, 4096, dtype=torch.bfloat16) for i in range(12)}, '$W/backing/o.safetensors')"
cat $W/backing/o.safetensors > /dev/null
./.devcarry/phxmount --vendor nvidia --metrics 127.0.0.1:0 $W/backing $W/mnt > $OUT/daemon.log 2>&1 &
D=$!
./.devcarry/phxmount wait --timeout 10 $W/mnt >> $OUT/daemon.log 2>&1 || { echo "no mount"; exit 1; }
URL=$(grep -o 'metrics: serving http://[0-9.:]*/metrics' $OUT/daemon.log | tail -1 | cut -d' ' -f3)
cd python/tools && python3 - "$URL" <<'PY' 2>&1 | tee $OUT/flush.txt
import sys, time, os, torch
sys.path.insert(0, ".")
from reqprobe import request_times
from phxmount.torch_load import open_reader
from phxmount.fetch import select
url = sys.argv[1]; p = "/var/tmp/phxgpu/mnt/o.safetensors"
torch.empty(1, device="cuda:0")
for shard in ((1, 7, 8), None):
    cl = []
    b = request_times(url)
    for _ in range(10):
        r = open_reader(p, 0)
        plans = select(r.fetcher, None, shard)
        out = [x.result() for x in r.fetcher.start(plans)]
        torch.cuda.synchronize()
        h = r.fetcher.io._h
        t = time.perf_counter(); os.close(os.dup(h.fd)); d1 = time.perf_counter() - t
        t = time.perf_counter(); r.close(); d2 = time.perf_counter() - t
        cl.append((round(d1 * 1e3, 3), round(d2 * 1e3, 3)))
        del out
    a = request_times(url)
    print("shard", shard, "close of a dup, then the reader's close (ms):", cl)
    print("  daemon flush:", {k: round(a[k]["sum_ms"] - b.get(k, {}).get("sum_ms", 0), 3) for k in ("flush", "release", "open")},
          "counts", {k: a[k]["count"] - b.get(k, {}).get("count", 0) for k in ("flush", "release", "open")})
PY
cd ../..; umount $W/mnt; wait $D

#!/usr/bin/env bash
# The shortest look at the scouts and the next-file start (issue 27): the
# hooked narrow loop and get_slice loop at world 8 (Qwen2), the MoE engines' loop and the MoE
# load_file, one fresh process each, with smallprof's tallies and timeline
# (PHXPROF_TIMELINE=1: reads in flight over the loop) and the hook's
# opened_ahead; no stock side (the issue27 rows have it); torchcost.py's
# per-call costs of torch first; the engines' and world-8 loops again with
# a 0.2 ms switch interval. ~65 s.
set -u
W=/var/tmp/phxgpu; C=$W/backing/ckpt27; mkdir -p $W/mnt "$OUT"
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-build-isolation ./python > $W/pip.log 2>&1
python3 python/tools/ckpt_gen.py gen --root $C --only moe,qwen2 --sync > $W/gen.log 2>&1 || { tail $W/gen.log; exit 1; }
cat $C/*/*.safetensors > /dev/null
./.devcarry/phxmount --vendor nvidia $W/backing $W/mnt > $OUT/daemon.log 2>&1 &
D=$!
./.devcarry/phxmount wait --timeout 10 $W/mnt >> $OUT/daemon.log 2>&1 || { echo "no mount"; exit 1; }
Q=$(basename "$(ls -d $C/qwen2-* | head -1)"); M=$(basename "$(ls -d $C/moe-* | head -1)")
python3 scripts/gpu-probes/torchcost.py > $OUT/torchcost.txt 2>&1
for c in narrow8:$Q slice8:$Q engine:$M load_file:$M narrow8:$Q engine:$M engine_floor:$M; do
	echo "== ${c%%:*}"
	env PHXMOUNT_HOOK=cuda:0 PHXPROF_TIMELINE=1 timeout 30 python3 scripts/gpu-probes/smallprof.py ${c%%:*} $W/mnt/ckpt27/${c##*:} 2>&1 | tail -c 12000
done > $OUT/probe.txt
# The interpreter's lock: the engines' loop and the world-8 loop with a
# 0.2 ms switch interval (default 5 ms). If the I/O threads wait for the
# lock behind the loop's main thread (each torch call gives it up and
# takes it back), the loops run faster here.
for c in engine:$M narrow8:$Q; do
	echo "== ${c%%:*} switch 0.0002"
	env PHXMOUNT_HOOK=cuda:0 PHXPROF_SWITCH=0.0002 timeout 30 python3 scripts/gpu-probes/smallprof.py ${c%%:*} $W/mnt/ckpt27/${c##*:} 2>&1 | tail -c 4000
done >> $OUT/probe.txt
umount $W/mnt; wait $D
python3 - $OUT/probe.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith('{"case"'):
        d = json.loads(line)
        t = d.get("timeline", {})
        print(d["case"], d["seconds"], "opened_ahead", (d.get("hook") or {}).get("opened_ahead"),
              "idle_ms", t.get("in_flight_ms", {}).get("0"), {f: (v.get("task_first"), v.get("task_last_end")) for f, v in t.get("files", {}).items()})
PY
echo "total $(( $(date +%s) - T0 )) s"

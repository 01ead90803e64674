#!/usr/bin/env bash
# The shortest look at the scouts and the next-file start (issue 27): the
# hooked narrow loop and get_slice loop at world 8 (Qwen2), the MoE engines' loop and the MoE
# load_file, one fresh process each, with smallprof's tallies and timeline
# (PHXPROF_TIMELINE=1: reads in flight over the loop) and the hook's
# opened_ahead; no stock side (the issue27 rows have it); torchcost.py's
# per-call costs of torch first; the engines' and world-8 loops again with
# a 0.2 ms switch interval. ~65 s.
set -u
. "$(dirname "$0")/moeqwen.sh"
python3 scripts/gpu-probes/torchcost.py > $OUT/torchcost.txt 2>&1
for c in narrow8:$QN slice8:$QN engine:$MN load_file:$MN narrow8:$QN engine:$MN engine_floor:$MN; do
	echo "== ${c%%:*}"
	env PHXMOUNT_HOOK=cuda:0 PHXPROF_TIMELINE=1 timeout 30 python3 scripts/gpu-probes/smallprof.py ${c%%:*} $W/mnt/ckpt27/${c##*:} 2>&1 | tail -c 12000
done > $OUT/probe.txt
# The interpreter's lock: the engines' loop and the world-8 loop with a
# 0.2 ms switch interval (default 5 ms). If the I/O threads wait for the
# lock behind the loop's main thread (each torch call gives it up and
# takes it back), the loops run faster here.
for c in engine:$MN narrow8:$QN; do
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

#!/usr/bin/env bash
# The main thread's slow calls (calltrace.py) in the tensor-parallel loops
# and the engines' loop, hooked, a fresh process each, after moeqwen.sh's
# setup: where a loop waits, and in what. CASES and MIN_MS to choose.
# ~30 s after the setup. Carry [".devcarry"].
set -u
. "$(dirname "$0")/moeqwen.sh"
for c in ${CASES:-narrow8 narrow4 slice8 engine}; do
	d=$Q; [ $c = engine ] && d=$M
	env PHXMOUNT_HOOK=cuda:0 timeout 60 python3 scripts/gpu-probes/calltrace.py $c $d ${MIN_MS:-0.3} > $OUT/trace-$c.txt 2>&1
	head -1 $OUT/trace-$c.txt
done
umount $W/mnt; wait $D
echo "total $(( $(date +%s) - T0 )) s"

#!/usr/bin/env bash
# The main thread's slow calls (calltrace.py) in the tensor-parallel loops
# and the engines' loop, hooked, a fresh process each, after moeqwen.sh's
# setup: where a loop waits, and in what. CASES and MIN_MS to choose;
# STOCK=1 traces stock's loop on the backing files too.
# ~30 s after the setup. Carry [".devcarry"].
set -u
. "$(dirname "$0")/moeqwen.sh"
for c in ${CASES:-narrow8 narrow4 slice8 engine}; do
	d=$Q sd=$C/$QN; [ $c = engine ] && d=$M sd=$C/$MN
	env PHXMOUNT_HOOK=cuda:0 timeout 60 python3 scripts/gpu-probes/calltrace.py $c $d ${MIN_MS:-0.3} > $OUT/trace-$c.txt 2>&1
	grep -m1 'traced' $OUT/trace-$c.txt
	# STOCK=1: the same loop off the mount, no hook (what stock's first
	# calls cost: a slow copy_ both sides pay is not the hook's)
	if [ -n "${STOCK:-}" ]; then
		env -u PHXMOUNT_HOOK timeout 60 python3 scripts/gpu-probes/calltrace.py $c $sd ${MIN_MS:-0.3} \
			> $OUT/trace-$c-stock.txt 2>&1
		grep -m1 'traced' $OUT/trace-$c-stock.txt
	fi
done
umount $W/mnt; wait $D
echo "total $(( $(date +%s) - T0 )) s"

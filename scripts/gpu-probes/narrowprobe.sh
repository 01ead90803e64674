#!/usr/bin/env bash
# Where the tensor-parallel loops' time goes (issue 27: vllm_tp_world4/8
# and slice_tp_world8 at 1.1-1.8x stock against 3-4): vLLM's narrow loop at
# world 4 and 8 and the get_slice loop at world 8 on the Qwen2 checkpoint,
# each in fresh processes: stock, hooked with smallprof's tallies and
# timeline (PHXPROF_TIMELINE=1), hooked under cProfile (its tottime names
# the functions; cProfile in 3.12 sees every thread's calls). ~60 s after
# moeqwen.sh's setup. Carry [".devcarry"].
set -u
. "$(dirname "$0")/moeqwen.sh"
P=scripts/gpu-probes/smallprof.py
for c in ${CASES:-narrow8 narrow4 slice8}; do
	{
	echo "== $c stock"; env -u PHXMOUNT_HOOK python3 $P $c $C/$QN 2>&1 | grep '^{' | cut -c1-300
	echo "== $c hooked, tallies and timeline"
	env PHXMOUNT_HOOK=cuda:0 PHXPROF_TIMELINE=1 python3 $P $c $Q 2>&1 | head -c 20000; echo
	echo "== $c hooked, profiled"
	env PHXMOUNT_HOOK=cuda:0 python3 $P $c $Q --profile 2>&1 | head -c 40000
	} > $OUT/narrow-$c.txt 2>&1
	grep -A1 '^==' $OUT/narrow-$c.txt | grep -o '^==.*\|"seconds": [0-9.]*' | paste - - 
done
umount $W/mnt; wait $D
echo "total $(( $(date +%s) - T0 )) s"

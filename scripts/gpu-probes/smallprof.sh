#!/usr/bin/env bash
# Where a many-request loop's time goes (issue 27): vLLM's narrow loop and
# the get_slice loop (Qwen2, 98 tensors) and the MoE engine loop and
# load_file (2,013 tensors), each in fresh processes: stock, hooked, hooked
# with a cProfile; smallprof.py tallies the hook's pieces and torch's
# allocator counters. A daemon CPU profile of the whole probe. QUICK=1:
# the narrow loop at world 8 and the MoE loops only, no cProfile. PHXPROF_TIMELINE=1: each
# case's timeline of starts and tasks (the fp case's), not only fp's. FP=1:
# the MoE checkpoint's from_pretrained, tallied (FPVARS: again with those
# variables; FPPROF=1: and profiled).
set -u
W=/var/tmp/phxgpu; C=$W/backing/ckpt27; mkdir -p $W/mnt
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-build-isolation ./python > $W/pip.log 2>&1
ONLY=moe,qwen2; [ -n "${FP:-}" ] && ONLY=moe
python3 python/tools/ckpt_gen.py gen --root $C --only $ONLY --sync > $W/gen.log 2>&1 || { tail $W/gen.log; exit 1; }
echo "generated in $(( $(date +%s) - T0 )) s"
cat $C/*/*.safetensors > /dev/null
PHXMOUNT_CPUPROFILE=$OUT/daemon.prof ./.devcarry/phxmount --vendor nvidia $W/backing $W/mnt > $OUT/daemon.log 2>&1 &
D=$!
./.devcarry/phxmount wait --timeout 10 $W/mnt >> $OUT/daemon.log 2>&1 || { echo "no mount"; tail $OUT/daemon.log; exit 1; }
Q=$(basename "$(ls -d $C/qwen2-* 2>/dev/null | head -1)"); M=$(basename $(ls -d $C/moe-*))
P=scripts/gpu-probes/smallprof.py
one() { # case dir-name extra-env...
	local c=$1 n=$2; shift 2
	echo "== $c $n stock";  env -u PHXMOUNT_HOOK python3 $P $c $C/$n 2>&1 | head -c 3000; echo
	echo "== $c $n hooked $*"; env PHXMOUNT_HOOK=cuda:0 "$@" python3 $P $c $W/mnt/ckpt27/$n 2>&1 | head -c 16000; echo
}
if [ -n "${FP:-}" ]; then
	# from_pretrained of the MoE checkpoint: hooked (tallies), then hooked
	# with a cProfile; stock's time is in the issue27 rows.
	{
	echo "== fp $M hooked"; env PHXMOUNT_HOOK=1 python3 $P fp $W/mnt/ckpt27/$M 2>&1 | head -c 8000; echo
	# FPVARS="A=1,B=2 C=3": the same again with each set of variables
	for v in ${FPVARS:-}; do
		echo "== fp $M hooked ${v//,/ }"; env PHXMOUNT_HOOK=1 ${v//,/ } python3 $P fp $W/mnt/ckpt27/$M 2>&1 | head -c 8000; echo
	done
	[ -n "${FPPROF:-}" ] && { echo "=== profile fp"; env PHXMOUNT_HOOK=1 python3 $P fp $W/mnt/ckpt27/$M --profile 2>&1 | head -c 30000; }
	} > $OUT/probe.txt 2>&1
	umount $W/mnt; wait $D
	grep -E '^==|"seconds"' $OUT/probe.txt | cut -c1-600
	echo "total $(( $(date +%s) - T0 )) s"
	exit 0
fi
{
one narrow8 $Q
[ -n "${QUICK:-}" ] || one narrow8 $Q PHXMOUNT_HOOK_DEFER=0
[ -n "${QUICK:-}" ] || one narrow2 $Q
[ -n "${QUICK:-}" ] || one slice8 $Q
one engine $M
# ENGINEVAR="NAME=VALUE ...": the engine loop again, hooked with that
# environment (PHXMOUNT_HOOK_TASK=..., PHXMOUNT_HOOK_DEFER=0)
[ -n "${ENGINEVAR:-}" ] && one engine $M $ENGINEVAR
one engine_floor $M
one load_file $M
for rw in "7 8" "0 2"; do
	[ -n "${QUICK:-}" ] && [ "$rw" = "0 2" ] && continue
	set -- $rw
	echo "== check narrow rank $1 world $2 (every tensor and --ops against stock)"
	env PHXMOUNT_HOOK=cuda:0 python3 python/tools/tploops.py child --loop narrow --dir $W/mnt/ckpt27/$Q --ref $C/$Q --rank $1 --world $2 --ops 2>&1 | tail -c 1500
done
echo "== profiles"
# PROFS: the cases to profile (default none with QUICK, else narrow8 engine load_file)
for c in ${PROFS:-${QUICK:+none}${QUICK:-narrow8 engine load_file}}; do
	case $c in narrow*|slice*) c=$c:$Q ;; *) c=$c:$M ;; esac
	[ "${c%%:*}" = none ] && continue
	echo "=== profile ${c%%:*}"
	env PHXMOUNT_HOOK=cuda:0 python3 $P ${c%%:*} $W/mnt/ckpt27/${c##*:} --profile 2>&1 | head -c 20000
done
} > $OUT/probe.txt 2>&1
umount $W/mnt; wait $D
grep -E '^==|"seconds"|mismatch' $OUT/probe.txt | cut -c1-400
echo "total $(( $(date +%s) - T0 )) s"

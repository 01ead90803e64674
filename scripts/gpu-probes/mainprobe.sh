#!/usr/bin/env bash
# Is the hooked engines' loop bound by its main thread (issue 27)? Fresh
# processes of mainprobe.py on the MoE checkpoint (the engines' loop with
# deferral on, off, and a 4 GiB window; load_file) and the Qwen2 (the
# world-8 narrow loop), each printing its main thread's CPU against the
# loop's wall time, its waits for reads and every thread's CPU. ~90 s on a
# bare machine (the checkpoints are generated first). Carry [".devcarry"].
# With .devcarry/pyold/python (an older tree of python/, made here with
# `mkdir -p .devcarry/pyold && git archive COMMIT python | tar -x -C
# .devcarry/pyold`), every case runs again with that tree first on
# PYTHONPATH (the .pth hook imports whichever phxmount comes first): an A/B
# of the two in the same call, each line's "tree" says which.
set -u
. "$(dirname "$0")/moeqwen.sh"
P=scripts/gpu-probes/mainprobe.py
# (AB=1: the cases an A/B needs, fewer)
CASES=("engine $M" "load_file $M" "engine $M" "load_file $M" "narrow8 $Q" "narrow8 $Q"
	"engine $M PHXMOUNT_HOOK_DEFER=0" "engine $M PHXMOUNT_HOOK_WINDOW=4294967296" "engine $M PHXMOUNT_HOOK_DEFER=0")
[ -n "${AB:-}" ] && CASES=("engine $M" "load_file $M" "narrow8 $Q" "whole $Q" "engine $M" "load_file $M" "whole $Q"
	"engine $M PHXMOUNT_HOOK_DEFER=0" "narrow8 $Q")
for c in "${CASES[@]}"; do
	set -- $c
	for tree in new old; do
		pp=
		if [ $tree = old ]; then
			[ -d .devcarry/pyold/python ] || continue
			pp=$PWD/.devcarry/pyold/python
		fi
		line=$(env PYTHONPATH=$pp PHXMOUNT_HOOK=cuda:0 ${3:-} timeout 60 python3 $P $1 $2 2>$W/mainprobe.err | grep '^{')
		[ -n "$line" ] || { line="{\"case\": \"$1\", \"failed\": true}"; tail -3 $W/mainprobe.err >&2; }
		echo "{\"tree\": \"$tree\", ${line#\{}"
	done
done | tee $OUT/mainprobe.jsonl
# KV=1: gpu_kv.py's 16 KiB restore through the mount (1 and 4 client
# threads, 4 ioctls in flight each, 1 GiB a run, every block verified) with
# each tree in turn: the client's Python per ioctl (encode, decode, the
# submission) is the interpreter's lock's, whatever the threads.
if [ -n "${KV:-}" ]; then
	[ -f $W/backing/kvab.bin ] || head -c 1073741824 /dev/urandom > $W/backing/kvab.bin
	cat $W/backing/kvab.bin > /dev/null
	for tree in new old new old; do
		pp=
		if [ $tree = old ]; then
			[ -d .devcarry/pyold/python ] || continue
			pp=$PWD/.devcarry/pyold/python
		fi
		(cd python/tools && env PYTHONPATH=$pp timeout 120 python3 gpu_kv.py --mount-file $W/mnt/kvab.bin \
			--backing-file $W/backing/kvab.bin --out $OUT/kv-$tree.json --sizes 16 --threads 1,4 --directions read \
			--total 1GiB > $W/kv-$tree.log 2>&1) || tail -3 $W/kv-$tree.log
		python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], [(r['name'], round(r['gbps'], 2)) for r in d['results']])" \
			$OUT/kv-$tree.json $tree
	done | tee $OUT/kv.txt
fi
umount $W/mnt; wait $D
echo "total $(( $(date +%s) - T0 )) s"

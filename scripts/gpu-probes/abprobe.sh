#!/usr/bin/env bash
# An A/B of two python/ trees on one machine for the rows run 67 saw fall
# (docs/gpu-notes.md): 8 rank processes of world 8 at once, each the hooked
# get_slice loop on the Qwen2 checkpoint (aggregate GB/s from the first
# start to the last end), and the hooked from_pretrained of the MoE
# checkpoint (smallprof.py fp: the call's seconds and the hook's span),
# each tree in turn, twice (TREES to choose); GC=1: mainprobe.py's cyclic
# collections first; LOOPS=1: the single-process loops (below); NOFP=1: no from_pretrained. The old tree is .devcarry/pyold/python (made
# here with `git archive COMMIT python | tar -x -C .devcarry/pyold`),
# first on PYTHONPATH. ~150 s after moeqwen.sh's setup. Carry [".devcarry"].
set -u
. "$(dirname "$0")/moeqwen.sh"
[ -d .devcarry/pyold/python ] || { echo "no .devcarry/pyold/python"; exit 1; }
procs8() { # tree
	local pp=; [ "$1" = old ] && pp=$PWD/.devcarry/pyold/python
	local at; at=$(python3 -c 'import time; print(time.time() + 12)')
	for r in 0 1 2 3 4 5 6 7; do
		env PYTHONPATH=$pp PHXMOUNT_HOOK=cuda:0 python3 python/tools/tploops.py child --loop slice --dir $Q \
			--rank $r --world 8 --start-at $at > $W/p8-$r.json 2>$W/p8-$r.err &
	done
	wait
	python3 - "$1" $W/p8-*.json <<'PY'
import json, sys
rs = [json.loads(l) for p in sys.argv[2:] for l in open(p) if l.startswith("{")]
if len(rs) < 8:
    print(sys.argv[1], "procs8 failed:", len(rs), "ranks")
else:
    t0, t1 = min(r["start"] for r in rs), max(r["end"] for r in rs)
    b = sum(r["bytes"] for r in rs)
    print(sys.argv[1], f"procs8 qwen2: {b / (t1 - t0) / 1e9:.1f} GB/s, {t1 - t0:.3f} s, ranks "
          + " ".join(f"{r['seconds']:.3f}" for r in sorted(rs, key=lambda r: r["rank"])))
PY
}
fp() { # tree
	local pp=; [ "$1" = old ] && pp=$PWD/.devcarry/pyold/python
	env PYTHONPATH=$pp PHXMOUNT_HOOK=1 timeout 90 python3 scripts/gpu-probes/smallprof.py fp $M 2>&1 | grep '^{' | \
		python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(sys.argv[1], 'fp moe:', d['seconds'], 's;', d['hook'].get('summary','')[:200])" "$1"
}
# GC=1 first: the loops' cyclic collections (mainprobe.py's "gc": count and
# ms per generation), with and without gc.freeze() before the loop.
if [ -n "${GC:-}" ]; then
	for c in "engine $M" "engine $M" "narrow8 $Q" "load_file $M"; do
		set -- $c
		for fz in "" 1; do
			env MAINPROBE_FREEZE=$fz PHXMOUNT_HOOK=cuda:0 timeout 60 python3 scripts/gpu-probes/mainprobe.py $1 $2 2>/dev/null | \
				python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(d['case'], 'freeze' if sys.argv[1] else 'as is', d['wall'], d['main_cpu'], 'gc', d['gc'], d['gc_tracked'])" "$fz"
		done
	done | tee $OUT/gc.txt
fi
# LOOPS=1: each tree's single-process loops first, alternating, a fresh
# process each (mainprobe.py: wall and main-thread CPU): vLLM's narrow loop
# at world 4 and 8 on the Qwen2, the engines' loop on the MoE (CASES: mainprobe.py's
# cases in order, each on the MoE where engine, load_file or whole, else the Qwen2).
if [ -n "${LOOPS:-}" ]; then
	for c in ${CASES:-narrow4 narrow8 engine narrow4 narrow8 engine}; do
		case $c in engine|load_file|whole) set -- $c $M ;; *) set -- $c $Q ;; esac
		for tree in ${TREES:-new old}; do
			pp=; [ $tree = old ] && pp=$PWD/.devcarry/pyold/python
			env PYTHONPATH=$pp PHXMOUNT_HOOK=cuda:0 timeout 60 python3 scripts/gpu-probes/mainprobe.py $1 $2 2>/dev/null | \
				python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(sys.argv[1], d['case'], 'wall', round(d['wall'], 4), 'main_cpu', round(d['main_cpu'], 4))" $tree
		done
	done | tee $OUT/loops.txt
fi
for tree in ${TREES:-new old new old}; do procs8 $tree; done | tee $OUT/ab.txt
[ -n "${NOFP:-}" ] || for tree in ${TREES:-new old new old}; do fp $tree; done | tee -a $OUT/ab.txt
umount $W/mnt; wait $D
echo "total $(( $(date +%s) - T0 )) s"

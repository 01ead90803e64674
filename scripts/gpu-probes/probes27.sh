#!/usr/bin/env bash
# Issue 27's three open questions in one device call (~450 s), each probe's
# outputs in a folder of its own, packed, beside its summary:
#   1. kvprof.sh: small KV blocks' per-batch cost (16 and 64 KiB), with a
#      worker's least share and the wait mode as variables, and through
#      the mount a daemon per rule (spread, slot, load) (~200-300 s);
#   2. importprobe.sh: what the hook costs a program before it loads (~40 s);
#   3. smallprof.sh QUICK=1: the world-8 narrow loop's and the MoE loops'
#      tallies (~100 s);
#   4. smallprof.sh FP=1: the MoE from_pretrained's timeline with and
#      without hook_spec (PHXMOUNT_HOOK_SPECULATE=0) (~60 s).
# Each runs only while the call has time for it (PROBES_DEADLINE_S, 570).
#
#   bash scripts/gpu-probes/kvprof.sh build   here (Go), then on the GPU
#   bash scripts/gpu-probes/probes27.sh       machine (carry [".devcarry"]):
#                                             $OUT gets kvprof.txt,
#                                             importprobe.txt, smallprof.txt,
#                                             fpprof.txt
#                                             and one .tgz a probe
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-.devcarry/out}
DEADLINE=${PROBES_DEADLINE_S:-570}
T0=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
probe() { # name, seconds it needs, the most it may take, command...
	local name=$1 need=$2 most=$3
	shift 3
	if [ "$(left)" -lt "$need" ]; then
		echo "$name: not run ($(left) s left, needs ~$need)" | tee "$OUT/$name.txt"
		return
	fi
	mkdir -p "$OUT/$name.d"
	echo "== $name at $(($(date +%s) - T0)) s"
	local t
	t=$(left)
	[ "$t" -gt "$most" ] && t=$most
	OUT=$OUT/$name.d timeout "$t" "$@" >"$OUT/$name.d/console.log" 2>&1
	echo "$name: exit $?, $(($(date +%s) - T0)) s" >>"$OUT/$name.d/console.log"
	tail -5 "$OUT/$name.d/console.log"
	for f in "$OUT/$name.d/$name.txt" "$OUT/$name.d/probe.txt"; do
		[ -f "$f" ] && cp "$f" "$OUT/$name.txt"
	done
	tar -czf "$OUT/$name.tgz" -C "$OUT/$name.d" . && rm -rf "$OUT/$name.d"
}
probe kvprof 200 300 bash scripts/gpu-probes/kvprof.sh
probe importprobe 40 60 bash scripts/gpu-probes/importprobe.sh
probe smallprof 100 150 env QUICK=1 bash scripts/gpu-probes/smallprof.sh
probe fpprof 60 90 env FP=1 FPVARS="PHXMOUNT_HOOK_SPECULATE=0" bash scripts/gpu-probes/smallprof.sh
ls -la "$OUT"

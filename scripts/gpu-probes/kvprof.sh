#!/usr/bin/env bash
# Issue 27 item 4, small KV blocks, in one device call (~200 s): are 16 and
# 64 KiB blocks still bound by the daemon's per-batch cost, and does
# splitting a batch among workers by load (PHX_STAGED_SHARE=load, phxfs
# Config.StagedByLoad: 2 scatters a 16 KiB batch among sixteen plans
# instead of 7) or a bounce buffer's worth a worker (PHX_STAGED_SHARE=slot:
# 2 alone) pay on the GPU? It runs, on the same hot 4 GiB file:
#   1. kv_blocks.cu (../shared/reference) at 16 and 64 KiB, built here;
#   2. phxbench-gpu kv (the library in-process) per block size, 1 and 4
#      threads x 1 and 4 batches in flight, both rules, with a CPU profile;
#   3. python/tools/gpu_kv.py reads through the mount (1 and 4 threads, 4
#      ioctls in flight each; 1 GiB a run), once a daemon per rule, each
#      daemon with PHXMOUNT_CPUPROFILE;
# and prints a compact per-batch breakdown: the rows against kv_blocks.cu
# B/D, each run's batches, scatters and blocks a scatter, and CPU ms a batch
# in planning, gathering, cachestat, scatter enqueue, fence waits, driver
# calls, the FUSE ioctl, scheduling and GC (from the profiles, with the
# carried pprof).
#
#   bash scripts/gpu-probes/kvprof.sh build   here, where Go is: gpu-test.sh
#                                              build, plus .devcarry/pprof
#   bash scripts/gpu-probes/kvprof.sh         on the GPU machine (carry
#                                              [".devcarry"]): $OUT gets
#                                              kvprof.txt and raw.tgz
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
C=$ROOT/.devcarry
if [ "${1:-}" = build ]; then
	bash scripts/gpu-test.sh build || exit 1
	CGO_ENABLED=0 go build -ldflags="-s -w" -o "$C/pprof" cmd/pprof || exit 1
	du -sh "$C"
	exit 0
fi
PROBE=kvprof NEED="phxmount phxbench-gpu pprof" HOW="bash scripts/gpu-probes/kvprof.sh build"
. scripts/gpu-probes/kvsetup.sh
[ -n "$NV" ] && wait "$NV"

say "--- 1. kv_blocks.cu 16 64 ($(el))"
if [ -x "$C/ref/kv_blocks" ]; then
	timeout 60 "$C/ref/kv_blocks" "$KV" 16 64 >"$R/ref-kv_blocks.txt" 2>&1
	tee -a "$T" <"$R/ref-kv_blocks.txt"
else
	say "kv_blocks not built (nvcc.log)"; tail -3 "$R/nvcc.log" | tee -a "$T"
fi
pack

# breakdown PROFILE BATCHES WHAT: CPU ms a batch in each part of the
# staged read path (cum time of the function, all samples of the process).
breakdown() {
	local prof=$1 n=$2 what=$3
	[ -s "$prof" ] && [ "${n:-0}" -gt 0 ] || { say "  $what: no profile or no batches"; return; }
	"$C/pprof" -top -cum -nodecount=100000 -nodefraction=0 -edgefraction=0 -unit=ms "$prof" 2>/dev/null >"$prof.top"
	awk -v n="$n" -v what="$what" '
	function ms(s) { sub(/ms$/, "", s); return s + 0 }
	BEGIN {
		split("plan|phxfs.(*Lib).prepare gather|phxfs.(*stagedReader).gatherGroup cachestat|phxfs.resident " \
		      "wholeresident|phxfs.wholeResident scatter|phxfs.(*stagedReader).scatter fence|nvidia.(*Stream).Fence " \
		      "await|phxfs.slotFences.await driver|runtime.cgocall ioctl|fusefs.(*ControlServer).Ioctl " \
		      "handoff|runtime.schedule gc|runtime.gcBgMarkWorker", c, " ")
		for (i in c) { split(c[i], kv, "|"); key[kv[2]] = kv[1]; order[i] = kv[1] }
	}
	/^Duration:/ { total = $0 }
	NF >= 6 {
		name = $6; sub(/^github.com\/phxmount\/phxmount\//, "", name)
		if (name in key && !(key[name] in v)) v[key[name]] = ms($4)
	}
	END {
		line = sprintf("  %s, %d batches: CPU ms a batch:", what, n)
		for (i = 1; i <= length(order); i++) { k = order[i]; line = line sprintf(" %s %.3f", k, (k in v ? v[k] : 0) / n) }
		print line; print "   (" total ")"
	}' "$prof.top" | tee -a "$T"
}

say "--- 2. the library in-process: phxbench-gpu kv ($(el))"
for bk in 16 64; do
	timeout 70 "$C/phxbench-gpu" kv -file "$KV" -blocks $bk -threads 1,4 -inflight 1,4 -rules spread,load -scatter auto \
		-cpuprofile "$R/gokv-$bk.prof" -out "$R/gokv-$bk.json" >"$R/gokv-$bk.txt" 2>&1 || say "phxbench-gpu kv $bk KiB failed"
	grep -E "GB/s|per batch|verify|not run|rror" "$R/gokv-$bk.txt" | sed -e 's/409 requests per batch, hot file, registered before the clock//' | tee -a "$T"
	breakdown "$R/gokv-$bk.prof" "$(awk '/per batch:/ {s += $3} END {print s + 0}' "$R/gokv-$bk.txt")" "in-process $bk KiB, all runs"
	pack
done

say "--- 2b. 16 and 64 KiB, 4 threads x 4 in flight, spread: a worker's least share 1 MiB (the default) against 4 MiB (a slot: fewer scatters, fences and waits a batch), and waits that yield ($(el))"
for bk in 16 64; do
	for v in "1024 spin" "4096 spin" "1024 yield" "4096 yield"; do
		set -- $v
		sync=$2; [ "$sync" = spin ] && sync=
		PHX_CUDA_SYNC=$sync timeout 40 "$C/phxbench-gpu" kv -file "$KV" -blocks $bk -threads 4 -inflight 4 -rules spread -scatter auto \
			-share "$1" -out "$R/gokv-share-$bk-$1-$2.json" >"$R/gokv-share-$bk-$1-$2.txt" 2>&1 || say "phxbench-gpu kv -share $1 failed"
		grep -E "GB/s|per batch|rror" "$R/gokv-share-$bk-$1-$2.txt" | sed -e "s/^/  share $1 KiB, waits ${2}: /" \
			-e 's/409 requests per batch, hot file, registered before the clock//' | tee -a "$T"
	done
done
pack

say "--- 3. through the mount: gpu_kv.py reads, a daemon per rule: spread, slot (a bounce buffer's worth a worker), load ($(el))"
python3 -m pip install -q --no-index --no-deps --no-build-isolation ./python >"$R/pip.log" 2>&1 || say "pip install ./python failed (pip.log)"
for rule in spread slot load; do
	[ $(($(date +%s) - T0)) -lt "${KV_STEP3_BY_S:-260}" ] || { say "rule $rule: not run (out of time)"; continue; }
	mounted_kv "$rule" phxmount 16,64 1,4 75 PHX_STAGED_SHARE="$rule" PHXMOUNT_CPUPROFILE="$R/daemon-$rule.prof"
	# 4 runs a size (1 and 4 threads; 4 in flight and 1), 1 GiB each:
	# 161 ioctls a run at 16 KiB, 41 at 64 KiB.
	breakdown "$R/daemon-$rule.prof" $((4 * 161 + 4 * 41)) "daemon, rule $rule, 16 and 64 KiB mixed (per ioctl)"
	pack
done
say "=== kvprof done in $(el); raw outputs (profiles, JSON, logs) in raw.tgz"
pack
ls -la "$OUT"

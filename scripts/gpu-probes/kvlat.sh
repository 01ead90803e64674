#!/usr/bin/env bash
# Issue 27 item 4: where one 16 KiB KV batch's time goes (~90 s). Through
# the mount a lone batch of 409 blocks took 1.15 ms (5.7 GB/s, run 66) and
# four in flight gave ~16 GB/s however many client threads sent them, where
# the library in-process reached 32.7 with 4 x 4 (run 55). This runs, on
# one hot 4 GiB file, each with a runtime trace whose regions time every
# step of every batch (fusefs.ioctl around phxfs.prepare, phxfs.execute,
# phxfs.gather, phxfs.scatter, phxfs.await):
#   1. kv_blocks.cu at 16 KiB (the reference), built here;
#   2. phxbench-gpu kv in-process, 1 thread x 1 and 4 batches in flight;
#   3. gpu_kv.py through the mount, 1 thread x 4 and x 1 in flight, a
#      daemon with PHXMOUNT_TRACE (gathers from the file's mapping, the
#      default), then .devcarry/phxmount-old where carried (an older
#      daemon: an A/B), then a daemon with PHX_GATHER=off (every block
#      read by the engine).
# Here afterwards: python3 scripts/gpu-probes/traceregions.py on the
# traces of raw.tgz.
#
#   bash scripts/gpu-probes/kvlat.sh     on the GPU machine after
#                                        `gpu-test.sh build` here (carry
#                                        [".devcarry"]): $OUT gets kvlat.txt
#                                        and raw.tgz
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
C=$ROOT/.devcarry
PROBE=kvlat NEED="phxmount phxbench-gpu" HOW="bash scripts/gpu-test.sh build"
. scripts/gpu-probes/kvsetup.sh
python3 -m pip install -q --no-index --no-deps --no-build-isolation ./python >"$R/pip.log" 2>&1 || say "pip install ./python failed (pip.log)"

say "--- 2. in-process: phxbench-gpu kv, 16 KiB, 1 thread x 1 and 4 in flight ($(el))"
timeout 60 "$C/phxbench-gpu" kv -file "$KV" -blocks 16 -threads 1 -inflight 1,4 -rules spread -scatter auto \
	-trace "$R/inproc.trace" -out "$R/inproc.json" >"$R/inproc.txt" 2>&1 || say "phxbench-gpu kv failed"
grep -E "GB/s|per batch|rror" "$R/inproc.txt" | tee -a "$T"
pack

say "--- 3. through the mount: gpu_kv.py, 16 KiB, 1 thread x 4 and x 1 in flight ($(el))"
for v in gather:auto:phxmount old:auto:phxmount-old gather2:auto:phxmount old2:auto:phxmount-old nogather:off:phxmount; do
	IFS=: read -r name gather bin <<<"$v"
	[ -x "$C/$bin" ] || continue
	mounted_kv "$name" "$bin" 16 1 60 PHX_GATHER="$gather" PHXMOUNT_TRACE="$R/daemon-$name.trace"
	pack
done

say "--- 1. kv_blocks.cu 16 ($(el))"
[ -n "$NV" ] && wait "$NV"
if [ -x "$C/ref/kv_blocks" ]; then
	timeout 40 "$C/ref/kv_blocks" "$KV" 16 >"$R/ref-kv_blocks.txt" 2>&1
	tee -a "$T" <"$R/ref-kv_blocks.txt"
else
	say "kv_blocks not built"; tail -3 "$R/nvcc.log" 2>/dev/null | tee -a "$T"
fi
say "=== kvlat done in $(el)"
pack
ls -la "$OUT"

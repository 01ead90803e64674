#!/usr/bin/env bash
# Issue 27 item 4: what the daemon's garbage collector costs 16 KiB KV
# restores through the mount. Run 72's kvcap (traced) gave 4 client
# threads x 4 in flight 9.6 GB/s at Go's default GOGC=100 and 13.7 with
# GOGC=off, three collections in a 0.1 s run (the heap 12 to 34 MB: ~80 KB
# of garbage an ioctl). Here untraced: gpu_kv.py, 1 and 4 threads (4 and 1
# in flight each, every block verified), the daemon at each of GCS (GOGC
# values, default "100 400 off") in turn, ROUNDS rounds (default 2), the
# collections counted (gctrace). ~15 s a daemon after the file is made.
# BINS: the .devcarry daemons to take turns (default phxmount; e.g.
# "phxmount-old phxmount" for an A/B of two trees at GCS=100).
#
#   bash scripts/gpu-probes/kvgc.sh   on the GPU machine after
#                                     `gpu-test.sh build` here (carry
#                                     [".devcarry"]): $OUT gets kvgc.txt
#                                     and raw.tgz
set -u
NOREF=1 PIP=1 PROBE=kvgc NEED="phxmount" HOW="bash scripts/gpu-test.sh build"
. "$(dirname "$0")/kvsetup.sh"
for r in $(seq "${ROUNDS:-2}"); do
	for bin in ${BINS:-phxmount}; do
		for gc in ${GCS:-100 400 off}; do
			name=r$r-$bin-gc$gc
			mounted_kv "$name" "$bin" 16 1,4 60 GOGC="$gc" GODEBUG=gctrace=1
			say "  $name: $(grep -c '^gc ' "$R/daemon-$name.log") collections"
		done
	done
done
say "=== kvgc done in $(el)"
pack

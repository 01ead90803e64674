#!/usr/bin/env bash
# Issue 27 item 4: what caps 16 KiB KV restores through the mount (~60 s).
# Through the mount 1 and 4 client threads, each keeping 4 BATCH ioctls
# in flight, gave the same ~15 GB/s (run 65), where the library
# in-process reached 32.7 with 4 x 4 (run 55): something all batches pass
# through serves ~2,300 a second. This runs, on one hot 4 GiB file:
#   1. phxbench-gpu kv in-process, 1 and 4 threads x 4 in flight, traced;
#   2. gpu_kv.py through the mount, 1 and 4 threads x 4 in flight, the
#      daemon traced (PHXMOUNT_TRACE), the client's CPU seconds (user,
#      system) and the daemon's (from /proc before the unmount) printed:
#      a client near one CPU second a second is the interpreter's lock, a
#      daemon holding ~16 ioctls each slower is the daemon, one holding ~4
#      is the client or FUSE. 4 threads again with GOGC=off: what the
#      daemon's collections cost (gctrace counts them). The daemon is
#      .devcarry/phxmount-old where carried (the tree before a change),
#      then .devcarry/phxmount (the change), 4 and 1.
# NOINPROC=1 leaves out step 1; CONFIGS="THREADS:GOGC:BIN ..." chooses
# step 2's daemons (default: the five above).
# Here afterwards: python3 scripts/gpu-probes/traceregions.py on the
# traces of raw.tgz.
#
#   bash scripts/gpu-probes/kvcap.sh     on the GPU machine after
#                                        `gpu-test.sh build` here (carry
#                                        [".devcarry"]): $OUT gets kvcap.txt
#                                        and raw.tgz
set -u
NOREF=1 PIP=1 PROBE=kvcap NEED="phxmount phxbench-gpu" HOW="bash scripts/gpu-test.sh build"
. "$(dirname "$0")/kvsetup.sh"

say "--- 1. in-process: phxbench-gpu kv, 16 KiB, 1 and 4 threads x 4 in flight ($(el))"
[ -n "${NOINPROC:-}" ] || timeout 60 "$C/phxbench-gpu" kv -file "$KV" -blocks 16 -threads 1,4 -inflight 4 -rules spread -scatter auto \
	-trace "$R/inproc.trace" -out "$R/inproc.json" >"$R/inproc.txt" 2>&1 || say "phxbench-gpu kv failed"
grep -E "GB/s|per batch|rror" "$R/inproc.txt" | tee -a "$T"
pack

# cpu PID: user and system seconds of a process so far.
cpu() { awk -v t="$(getconf CLK_TCK)" '{printf "user %.2f s, system %.2f s", $14 / t, $15 / t}' "/proc/$1/stat"; }

say "--- 2. through the mount: gpu_kv.py, 16 KiB, 1 and 4 threads x 4 in flight ($(el))"
for v in ${CONFIGS:-1:100:phxmount-old 4:100:phxmount-old 4:off:phxmount-old 4:100:phxmount 1:100:phxmount}; do
	IFS=: read -r th gc bin <<<"$v"
	[ -x "$C/$bin" ] || continue
	name=$bin$th-gc$gc
	GOGC=$gc GODEBUG=gctrace=1 PHXMOUNT_TRACE="$R/daemon-$name.trace" "$C/$bin" --vendor nvidia "$W/backing" "$W/mnt" >"$R/daemon-$name.log" 2>&1 &
	D=$!
	if "$C/phxmount" wait --timeout 10 "$W/mnt" >>"$R/daemon-$name.log" 2>&1; then
		timeout 90 python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:])
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"client CPU: user {r.ru_utime:.2f} s, system {r.ru_stime:.2f} s")' \
			python3 python/tools/gpu_kv.py --mount-file "$W/mnt/kv.bin" --backing-file "$KV" \
			--out "$R/kv-$name.json" --sizes 16 --threads "$th" --total 1GiB --directions read \
			--timeout 30 >"$R/kv-$name.txt" 2>&1
		grep -E "GB/s|PASS|FAIL|client CPU" "$R/kv-$name.txt" | sed "s/^/  $name: /" | cut -c1-160 | tee -a "$T"
		say "  $name: daemon CPU $(cpu "$D"), $(grep -c '^gc ' "$R/daemon-$name.log") collections"
		umount "$W/mnt" 2>/dev/null || umount -l "$W/mnt"
	else
		say "$name: no mount"; tail -3 "$R/daemon-$name.log" | tee -a "$T"
		kill "$D" 2>/dev/null
	fi
	wait "$D"
	pack
done
say "=== kvcap done in $(el)"
pack
ls -la "$OUT"

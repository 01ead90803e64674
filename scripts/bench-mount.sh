#!/usr/bin/env bash
# make bench-mount: phxmount against its backing directory, side by side in
# one run. Prints a table of ratios (medians of a few repetitions) and writes
# the raw numbers to $BENCH_MOUNT_RAW (default bench-mount-raw.json).
#
# Cold rows: before each, phxbench-mount reads the file once with O_DIRECT
# (under a VM the host caches the virtual disk, which no guest drop reaches:
# this leaves both sides equally host-warm), syncs, drops the guest's caches
# and checks with cachestat(2) that no page of the file is resident through
# either path; a row with a sample that was not cold prints
# "not cold: N pages resident" instead of its ratio.
#
# Needs root (drop_caches, mounting). Env: BENCH_DIR (a directory on a real
# disk, default /var/tmp), BENCH_REPS (3), BENCH_SIZE_MB (256),
# BENCH_FILES (10000), PHXMOUNT_ARGS (extra phxmount arguments).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
[ -x "$BIN/phxmount" ] && [ -x "$BIN/phxbench-mount" ] && [ -x "$BIN/phxbench-ioctl" ] || {
	mkdir -p "$BIN"
	CGO_ENABLED=0 go build -ldflags=-checklinkname=0 -o "$BIN/" ./cmd/phxmount ./cmd/phxbench-mount ./cmd/phxbench-ioctl
}
if [ "$(id -u)" != 0 ]; then echo "bench-mount: needs root (mount, drop_caches)" >&2; exit 1; fi
RAW=${BENCH_MOUNT_RAW:-$PWD/bench-mount-raw.json}
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/phxbench-mount.XXXXXX")
backing=$work/backing mnt=$work/mnt log=$work/phxmount.log
mkdir -p "$backing" "$mnt"
pid=
cleanup() {
	[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
	mountpoint -q "$mnt" && umount -l "$mnt" || true
	rm -rf "$work"
}
trap cleanup EXIT

"$BIN/phxmount" ${PHXMOUNT_ARGS:-} "$backing" "$mnt" 2>"$log" &
pid=$!
"$BIN/phxmount" wait --timeout 15 "$mnt" || { echo "bench-mount: phxmount did not mount:" >&2; cat "$log" >&2; exit 1; }
state=$(grep -o 'passthrough [a-z]*: [^"]*' "$log" | head -1)
echo "phxmount: $state"
echo "kernel $(uname -r), $(nproc) cores; backing $backing ($(df --output=fstype "$backing" | tail -1))"

"$BIN/phxbench-mount" -backing "$backing" -mount "$mnt" \
	-reps "${BENCH_REPS:-3}" -size-mb "${BENCH_SIZE_MB:-256}" -files "${BENCH_FILES:-10000}" \
	-raw "$RAW" -note "$state"

# The control protocol's rows: ioctl read through the same mount against
# phxfs called directly (its own table; raw numbers beside the others).
echo
"$BIN/phxbench-ioctl" -mount "$mnt" -backing "$backing" \
	-reps "${BENCH_REPS:-3}" -raw "${RAW%.json}-ioctl.json"

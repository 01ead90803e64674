#!/usr/bin/env bash
# make bench-mount: phxmount against its backing directory, side by side in
# one run, for each configuration: passthrough on and off, each with
# -o cache=auto, exclusive and off. Each configuration is mounted in turn
# and measured against the backing directory in the same phxbench-mount
# run (ratios of medians of a few repetitions, plus the staleness row: ms
# from a write on the backing directory until stat and read through the
# mount show it). Then one summary table, a column per configuration ("not
# run" where a configuration could not mount, e.g. passthrough on a kernel
# without it), and the ioctl table on a default mount. Raw numbers:
# ${BENCH_MOUNT_RAW%.json}-CONFIG.json (default bench-mount-raw-*.json).
#
# Cold rows: before each, phxbench-mount reads the file once with O_DIRECT
# (under a VM the host caches the virtual disk, which no guest drop reaches:
# this leaves both sides equally host-warm), syncs, drops the guest's caches
# and checks with cachestat(2) that no page of the file is resident through
# either path; a row with a sample that was not cold prints
# "not cold: N pages resident" instead of its ratio.
#
# Needs root (drop_caches, mounting). Env: BENCH_DIR (a directory on a real
# disk, default /var/tmp), BENCH_REPS (4: even, so that each side goes
# first as often), BENCH_SIZE_MB (256),
# BENCH_FILES (10000), PHXMOUNT_ARGS (extra phxmount arguments),
# BENCH_CONFIGS (default "on:auto on:exclusive on:off off:auto
# off:exclusive off:off", passthrough:cache pairs).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
[ -x "$BIN/phxmount" ] && [ -x "$BIN/phxbench-mount" ] && [ -x "$BIN/phxbench-ioctl" ] || {
	mkdir -p "$BIN"
	CGO_ENABLED=0 go build -o "$BIN/" ./cmd/phxmount ./cmd/phxbench-mount ./cmd/phxbench-ioctl
}
if [ "$(id -u)" != 0 ]; then echo "bench-mount: needs root (mount, drop_caches)" >&2; exit 1; fi
RAW=${BENCH_MOUNT_RAW:-$PWD/bench-mount-raw.json}
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/phxbench-mount.XXXXXX")
backing=$work/backing mnt=$work/mnt log=$work/phxmount.log
mkdir -p "$backing" "$mnt"
pid=
stop() {
	[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
	pid=
	mountpoint -q "$mnt" && umount -l "$mnt" || true
}
cleanup() {
	stop
	rm -rf "$work"
}
trap cleanup EXIT

# start ARGS...: mount with the arguments; 1 (and the log) when it did not.
start() {
	"$BIN/phxmount" ${PHXMOUNT_ARGS:-} "$@" "$backing" "$mnt" 2>"$log" &
	pid=$!
	"$BIN/phxmount" wait --timeout 15 "$mnt" >/dev/null 2>&1 && return 0
	wait "$pid" 2>/dev/null || true
	pid=
	return 1
}

echo "kernel $(uname -r), $(nproc) cores; backing $backing ($(df --output=fstype "$backing" | tail -1))"
raws=()
for cfg in ${BENCH_CONFIGS:-on:auto on:exclusive on:off off:auto off:exclusive off:off}; do
	pt=${cfg%%:*} cache=${cfg#*:}
	label="pt=$pt cache=$cache"
	raw="${RAW%.json}-pt-$pt-cache-$cache.json"
	raws+=("$raw")
	echo
	if ! start --passthrough "$pt" -o "cache=$cache"; then
		why=$(grep -o 'phxmount: .*' "$log" | head -1)
		echo "$label: not run: ${why:-phxmount did not mount}"
		printf '{"config": "%s", "passthrough": "%s", "cache": "%s", "not_run": "%s", "rows": []}\n' \
			"$label" "$pt" "$cache" "$(echo "${why:-did not mount}" | tr -d '"\\')" >"$raw"
		continue
	fi
	state=$(grep -o 'passthrough [a-z]*: [^;"]*' "$log" | head -1)
	echo "$label: $state; $(grep -o 'cache=[a-z]* on [^"]*' "$log" | head -1)"
	"$BIN/phxbench-mount" -backing "$backing" -mount "$mnt" -config "$label" -passthrough "$pt" -cache "$cache" \
		-reps "${BENCH_REPS:-4}" -size-mb "${BENCH_SIZE_MB:-256}" -files "${BENCH_FILES:-10000}" \
		-raw "$raw" -note "$state"
	stop
done

echo
echo "== summary: mount/backing ratios (staleness: ms), each against its configuration's target"
"$BIN/phxbench-mount" -summary "${raws[@]}"

# The control protocol's rows: ioctl read through a default mount against
# phxfs called directly (its own table; raw numbers beside the others).
echo
start || { echo "bench-mount: phxmount did not mount:" >&2; cat "$log" >&2; exit 1; }
"$BIN/phxbench-ioctl" -mount "$mnt" -backing "$backing" \
	-reps "${BENCH_REPS:-4}" -raw "${RAW%.json}-ioctl.json"

#!/usr/bin/env bash
# make demo: phxmount end to end on a machine without a GPU, in about a
# minute. Builds, makes a safetensors-shaped dataset, mounts phxmount over it
# on the emulated device, shows ordinary tools through the mount, loads the
# file into an emulated device buffer through the ioctl path from a separate
# client process, verifies it against a plain read, and unmounts. Leaves
# nothing mounted, even when a step fails.
#
# Needs root and /dev/fuse; mounts with --vendor emu, GPU or not. Env:
# DEMO_DIR (default /var/tmp), DEMO_SIZE_MB (256), PHXMOUNT_ARGS (extra
# phxmount arguments, e.g. --engine sync).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

if [ "$(id -u)" != 0 ]; then echo "demo: needs root to mount FUSE (try: sudo make demo)" >&2; exit 1; fi
if [ ! -e /dev/fuse ]; then echo "demo: no /dev/fuse on this machine" >&2; exit 1; fi

bash scripts/deps.sh
step "build (CGO_ENABLED=0)"
make --no-print-directory build

work=$(mktemp -d "${DEMO_DIR:-/var/tmp}/phxdemo.XXXXXX")
backing=$work/backing mnt=$work/mnt log=$work/phxmount.log
mkdir -p "$backing" "$mnt"
pid=
cleanup() {
	status=$?
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	if mountpoint -q "$mnt" 2>/dev/null; then umount "$mnt" 2>/dev/null || umount -l "$mnt" || true; fi
	rm -rf "$work"
	if [ "$status" != 0 ]; then
		echo "demo: FAILED (status $status); daemon log:" >&2
		[ -f "$log" ] && tail -20 "$log" >&2 || true
	fi
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "a sample dataset: a safetensors-shaped file (deterministic)"
run "$BIN/phxdemo" gen -out "$backing/model.safetensors" -size-mb "${DEMO_SIZE_MB:-256}"

# The client (phxdemo load) registers an emulated device buffer, so the
# mount must use the emulated device even where a GPU would make
# `--vendor auto` pick nvidia: --vendor emu, always (cmd/phxdemo's tests
# check this line).
step "mount phxmount over it on the emulated device (--vendor emu: the demo needs no GPU)"
printf '$ %s\n' "$BIN/phxmount --vendor emu ${PHXMOUNT_ARGS:-} $backing $mnt &"
# shellcheck disable=SC2086
"$BIN/phxmount" --vendor emu ${PHXMOUNT_ARGS:-} "$backing" "$mnt" 2>"$log" &
pid=$!
"$BIN/phxmount" wait --timeout 15 "$mnt" || { echo "demo: phxmount did not mount:" >&2; cat "$log" >&2; exit 1; }
sed -e 's/^time="[^"]*" //' "$log"
vendor=$(getfattr --absolute-names --only-values -n user.phx.info "$mnt" | sed -n 's/^vendor=//p')
[ "$vendor" = emu ] || { echo "demo: the mount uses vendor '$vendor', not the emulated device (PHXMOUNT_ARGS=${PHXMOUNT_ARGS:-})" >&2; exit 1; }
echo "the mount's vendor: $vendor"

step "ordinary tools through the mount"
run ls -l "$mnt"
run sha256sum "$backing/model.safetensors" "$mnt/model.safetensors"
a=$(sha256sum <"$backing/model.safetensors") b=$(sha256sum <"$mnt/model.safetensors")
[ "$a" = "$b" ] || { echo "demo: the mount and the backing file differ" >&2; exit 1; }
echo "identical on both sides"
run getfattr --only-values -n user.phx.info "$mnt/model.safetensors"

step "a separate client process: register an emulated device buffer, load every tensor with batched ioctls, verify"
run "$BIN/phxdemo" load -file "$mnt/model.safetensors"

step "the daemon after the client exited (user.phx.info on the mount root)"
getfattr --only-values -n user.phx.info "$mnt" | grep -E '^(transport|buffers_[a-z]+|released_[a-z]+|ioctl_bytes_read|ioctl_extents)='

step "unmount"
run umount "$mnt"
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
wait "$pid" 2>/dev/null || true
pid=
if mountpoint -q "$mnt"; then echo "demo: $mnt is still mounted" >&2; exit 1; fi
grep -E 'registered|released|unmounted' "$log" | sed -e 's/^time="[^"]*" //' || true
echo
echo "demo: OK — nothing left mounted"

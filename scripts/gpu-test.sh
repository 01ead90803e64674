#!/usr/bin/env bash
# Tier 4: the GPU path on a real NVIDIA GPU (make gpu-test).
#
#   bash scripts/gpu-test.sh build   here (needs Go): binaries into .devcarry/
#   bash scripts/gpu-test.sh run     on the GPU machine (no Go needed): the
#                                    nvidia connector tests, the phxfs suites on
#                                    the nvidia connector, the Python client's
#                                    tests, and end to end: phxmount --vendor
#                                    nvidia over a generated safetensors file,
#                                    loaded by the Python client + torch and
#                                    compared with safetensors.torch.load_file
#   bash scripts/gpu-test.sh bench   the benchmark (after run; same file)
#   bash scripts/gpu-test.sh all     run, then bench
#   bash scripts/gpu-test.sh         build, then run where there is a GPU;
#                                    elsewhere SKIP (exit 0) and say why
#
# Environment: OUT (logs and results; default .devcarry/out), PHX_GPU_SIZE
# (data bytes of the generated file, default 8GiB), PHX_GPU_WORK (work
# directory on a real disk, default /var/tmp/phxgpu).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY=$ROOT/.devcarry
OUT=${OUT:-$CARRY/out}
WORK=${PHX_GPU_WORK:-/var/tmp/phxgpu}
SIZE=${PHX_GPU_SIZE:-8GiB}
FILE=$WORK/backing/model.safetensors
MNT=$WORK/mnt
mkdir -p "$OUT"
LOG=$OUT/gpu-test.log
fails=0

say() { echo "$*" | tee -a "$LOG"; }
pass() { say "PASS $*"; }
fail() { say "FAIL $*"; fails=$((fails + 1)); }

build() {
	cd "$ROOT" || exit 1
	mkdir -p "$CARRY"
	export CGO_ENABLED=0
	local fl=-ldflags=-checklinkname=0
	go build $fl -o "$CARRY/phxmount" ./cmd/phxmount &&
		go build $fl -o "$CARRY/phxbench-gpu" ./cmd/phxbench-gpu &&
		go test $fl -c -o "$CARRY/phxfs.test" ./phxfs &&
		go test $fl -c -o "$CARRY/nvidia.test" ./connector/nvidia || {
		echo "FAIL build"
		exit 1
	}
	echo "build: $(ls "$CARRY" | grep -v '^out$' | tr '\n' ' ')in .devcarry/ (CGO_ENABLED=0)"
}

# why_no_gpu prints why this machine cannot run the GPU tier, or nothing.
why_no_gpu() {
	if ! command -v nvidia-smi >/dev/null 2>&1; then
		echo "no nvidia-smi"
	elif ! nvidia-smi -L >/dev/null 2>&1; then
		echo "nvidia-smi sees no GPU"
	elif ! python3 -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' 2>/dev/null; then
		echo "libcuda.so.1 does not load"
	fi
}

need_binaries() {
	for b in phxmount phxbench-gpu phxfs.test nvidia.test; do
		[ -x "$CARRY/$b" ] || {
			fail "no .devcarry/$b: run 'bash scripts/gpu-test.sh build' where Go is, and carry .devcarry"
			exit 1
		}
	done
}

unmount() {
	if mountpoint -q "$MNT" 2>/dev/null; then umount "$MNT" 2>/dev/null || umount -l "$MNT"; fi
	if [ -n "${DAEMON:-}" ]; then wait "$DAEMON" 2>/dev/null; DAEMON=; fi
}

# mount_phx [phxmount flags]: phxmount --vendor nvidia over $WORK/backing.
mount_phx() {
	mkdir -p "$MNT"
	unmount
	"$CARRY/phxmount" --vendor nvidia "$@" "$WORK/backing" "$MNT" >>"$OUT/phxmount.log" 2>&1 &
	DAEMON=$!
	for _ in $(seq 100); do
		mountpoint -q "$MNT" && grep -q "mounted;" "$OUT/phxmount.log" && return 0
		kill -0 "$DAEMON" 2>/dev/null || break
		sleep 0.1
	done
	fail "phxmount --vendor nvidia did not mount (see phxmount.log)"
	tail -5 "$OUT/phxmount.log" | tee -a "$LOG"
	return 1
}

gen_shards() { # a 2-shard checkpoint beside the file, for load_sharded
	local d=$WORK/backing/sharded
	[ -f "$d/model.safetensors.index.json" ] && return 0
	mkdir -p "$d"
	for i in 1 2; do
		"$CARRY/phxbench-gpu" gen -out "$d/model-0000$i-of-00002.safetensors" -size 512MiB -seed $((i + 1)) -prefix "shard$i." >/dev/null || return 1
	done
	python3 - "$d" <<'PY' || return 1
import json, os, struct, sys
d = sys.argv[1]
wm = {}
for n in sorted(os.listdir(d)):
    if n.endswith(".safetensors"):
        with open(os.path.join(d, n), "rb") as f:
            (hl,) = struct.unpack("<Q", f.read(8))
            for k in json.loads(f.read(hl)):
                if k != "__metadata__":
                    wm[k] = n
json.dump({"metadata": {}, "weight_map": wm}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
PY
}

gen_file() {
	[ -f "$FILE" ] && return 0
	mkdir -p "$WORK/backing"
	say "--- generate a $SIZE safetensors file in $WORK ($(df -T "$WORK" | awk 'NR==2{print $1" "$2}'))"
	timeout 300 "$CARRY/phxbench-gpu" gen -out "$FILE" -size "$SIZE" 2>&1 | tee -a "$LOG" || { fail "generate $FILE"; return 1; }
	sync
}

run() {
	cd "$ROOT" || exit 1
	need_binaries
	say "=== gpu-test run: $(date -u +%FT%TZ) $(nvidia-smi -L 2>&1 | head -1); kernel $(uname -r); python $(python3 -c 'import sys; print(sys.version.split()[0])')"
	say "--- connector/nvidia tests"
	if timeout 150 ./.devcarry/nvidia.test -test.v -test.count=1 >"$OUT/nvidia-test.log" 2>&1; then
		pass "connector/nvidia: $(grep -c '^--- PASS' "$OUT/nvidia-test.log") tests passed, $(grep -c -- '--- SKIP' "$OUT/nvidia-test.log") skipped"
	else
		fail "connector/nvidia: $(grep -E '^(--- FAIL|FAIL|panic)' "$OUT/nvidia-test.log" | head -5 | tr '\n' ' ')"
	fi
	say "--- phxfs suites on the nvidia connector (staged transport)"
	if (cd phxfs && PHX_TEST_CONNECTOR=nvidia timeout 170 ../.devcarry/phxfs.test -test.v -test.count=1 -test.timeout=160s) >"$OUT/phxfs-test.log" 2>&1; then
		pass "phxfs on nvidia: $(grep -c -- '--- PASS' "$OUT/phxfs-test.log") (sub)tests passed, $(grep -c -- '--- SKIP' "$OUT/phxfs-test.log") skipped"
	else
		fail "phxfs on nvidia: $(grep -E -- '--- FAIL|^FAIL|panic' "$OUT/phxfs-test.log" | head -5 | tr '\n' ' ')"
	fi
	grep -E '^ +[a-z_]+_test\.go:[0-9]+: ' "$OUT/phxfs-test.log" | sed 's/^ */why: /' | sort | uniq -c | head -5 | tee -a "$LOG"
	say "--- the Python client's unit tests (emu mounts included)"
	if (cd python && PHXMOUNT_BIN=$CARRY/phxmount timeout 120 python3 -m unittest discover -s tests) >>"$LOG" 2>&1; then
		pass "python unit tests"
	else
		fail "python unit tests (see gpu-test.log)"
	fi
	say "--- end to end: phxmount --vendor nvidia, the Python client + torch vs safetensors"
	gen_file || return
	gen_shards || fail "generate the sharded checkpoint"
	mount_phx || return
	if PYTHONUNBUFFERED=1 timeout 300 python3 python/tools/gpu_e2e.py --mount-file "$MNT/model.safetensors" --backing-file "$FILE" --shard-dir sharded 2>&1 | tee -a "$LOG"; then
		pass "end to end"
	else
		fail "end to end"
	fi
	grep -E "registered .* buffer" "$OUT/phxmount.log" | head -2 | sed -e 's/^time="[^"]*" //' | tee -a "$LOG"
	unmount
}

bench() {
	cd "$ROOT" || exit 1
	need_binaries
	gen_file || return
	say "=== benchmark: file -> GPU memory, $SIZE safetensors, hot and cold"
	timeout 300 "$CARRY/phxbench-gpu" bench -file "$FILE" -out "$OUT/bench-go.json" -sweep-engines io_uring -sweep-buffers 2 -sweep-bounce 2,4 -sweep-round 64,256 2>&1 | tee -a "$LOG" || fail "Go benchmark"
	local w e b
	read -r w e b < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["chosen"]["workers"], d["env"]["engine"], d["chosen"]["buffers"])' "$OUT/bench-go.json" 2>/dev/null)
	say "phxmount for the benchmark: --workers ${w:-16} --engine ${e:-io_uring}, PHX_STAGED_BUFFERS=${b:-2} (the Go sweep's best at this shape)"
	PHX_STAGED_BUFFERS=${b:-2} mount_phx --workers "${w:-16}" --engine "${e:-io_uring}" || return
	PYTHONUNBUFFERED=1 timeout 300 python3 python/tools/gpu_bench.py --mount-file "$MNT/model.safetensors" --backing-file "$FILE" \
		--out "$OUT/bench-py.json" 2>&1 | tee -a "$LOG" || fail "Python benchmark"
	unmount
	python3 python/tools/gpu_report.py "$OUT/bench-go.json" "$OUT/bench-py.json" "$OUT/bench.md" | tee -a "$LOG"
}

trap unmount EXIT
case "${1:-}" in
build) build ;;
run) run ;;
bench) bench ;;
all)
	run
	bench
	;;
"")
	command -v go >/dev/null && build
	why=$(why_no_gpu)
	if [ -n "$why" ]; then
		echo "SKIP gpu-test: $why on this machine. The binaries are in .devcarry/; on the GPU machine run: bash scripts/gpu-test.sh run"
		exit 0
	fi
	run
	;;
*)
	echo "usage: $0 [build|run|bench|all]" >&2
	exit 2
	;;
esac
say "gpu-test: $fails failure(s)"
[ "$fails" = 0 ]

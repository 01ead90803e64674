#!/usr/bin/env bash
# Tier 4: the GPU path on a real NVIDIA GPU (make gpu-test).
#
#   bash scripts/gpu-test.sh build   here (needs Go): binaries into .devcarry/,
#                                    the reference programs of ../shared/reference
#                                    into .devcarry/ref/ (built on the GPU machine
#                                    with nvcc; never copied into the tree), the
#                                    commit into .devcarry/commit
#   bash scripts/gpu-test.sh run     on the GPU machine (no Go needed): the
#                                    nvidia connector tests, the phxfs suites on
#                                    the nvidia connector, the Python client's
#                                    tests, and end to end: phxmount --vendor
#                                    nvidia over a generated safetensors file,
#                                    loaded by the Python client + torch and
#                                    compared with safetensors.torch.load_file
#   bash scripts/gpu-test.sh bench   the benchmark (after run; same file): the Go
#                                    bench, the reference programs, the Python
#                                    loads (hot, cold), KV blocks read and
#                                    written, rank shards, saving; then
#                                    gpu_report.py: $OUT/bench.md and
#                                    $OUT/gpu-latest.json (for docs/bench/)
#   bash scripts/gpu-test.sh hf      the drop-in's and the tensor-parallel checks
#                                    and rows alone (gpu_hf.py, gpu_tp.py; run
#                                    does them too)
#   bash scripts/gpu-test.sh focus   the Go suites on the GPU, hf's checks and rows,
#                                    and the report (one device call's worth)
#   bash scripts/gpu-test.sh issue27 issue 27's Targets table in one call: the
#                                    checkpoints of python/tools/ckpt_gen.py (made
#                                    once a session, kept in $WORK/backing/ckpt27),
#                                    staged_ceiling.cu and kv_blocks.cu built here
#                                    and run on the same files, every row in fresh
#                                    processes (python/tools/gpu_shapes.py), the
#                                    report; within PHX27_DEADLINE_S (570) of its
#                                    start, each step's time planned and printed
#   bash scripts/gpu-test.sh issue27-quick  the same on small checkpoints, one
#                                    repetition, in under 250 s (PHX27_DEADLINE_S
#                                    240): a first look, no issue's figures
#   bash scripts/gpu-test.sh issue27-plan   what issue27 would do and how long each
#                                    step should take (no GPU needed; issue27-quick-plan:
#                                    issue27-quick's)
#   bash scripts/gpu-test.sh report  gpu_report.py over the raw files in $RAW
#                                    (PHX_GPU_RAW; no GPU needed: raw.tgz of
#                                    several runs unpacked into one folder)
#   bash scripts/gpu-test.sh all     run, then bench
#   bash scripts/gpu-test.sh         build, then run where there is a GPU;
#                                    elsewhere SKIP (exit 0) and say why
#
# Environment: OUT (what comes back: gpu-test.log, raw.tgz, bench.md,
# gpu-latest.json; default .devcarry/out), PHX_GPU_RAW (the raw outputs,
# default $PHX_GPU_WORK/raw), PHX_GPU_SIZE
# (data bytes of the generated file, default 8GiB), PHX_GPU_WORK (work
# directory on a real disk, default /var/tmp/phxgpu), PHX_BENCH_ONLY (the
# bench steps to run, of: go gokv refs py kv shard save two; default all of
# them, more than one device call's 10 minutes: split it), PHX_EXTRA_ROWS (JSON files of more
# report rows, space-separated), PHX_TP_RANKS (both: the tp_world rows take the one of ranks 0
# and W-1 with the lower speed-up, each repetition a fresh process; last: W-1 alone, half the processes), PHX27_REPS
# (issue27's fresh processes a side and row, default 2; quick 1), PHX27_DEADLINE_S, PHX27_RESERVE_S
# (issue27's seconds in all, and those kept for the report). PHX_RUN_DATE, PHX_RUN_COMMIT,
# PHX_RUN_MACHINE: the run every row says it belongs to (set here when unset).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY=$ROOT/.devcarry
OUT=${OUT:-$CARRY/out}
WORK=${PHX_GPU_WORK:-/var/tmp/phxgpu}
SIZE=${PHX_GPU_SIZE:-8GiB}
FILE=$WORK/backing/model.safetensors
KVFILE=$WORK/backing/kv.bin
REF=$CARRY/ref
MNT=$WORK/mnt
# The daemon's Prometheus endpoint (request and ioctl latencies; the
# tensor-parallel tool's request probe reads it): a free loopback port, the
# URL read back from the daemon's log by mount_phx.
METRICS_URL=
# The device tool brings back at most 8 files from $OUT: the raw outputs
# (logs, JSON, the reference programs' stdout) go to $RAW, packed into
# $OUT/raw.tgz after every step (pack); $OUT keeps gpu-test.log, raw.tgz,
# bench.md and gpu-latest.json.
RAW=${PHX_GPU_RAW:-$WORK/raw}
mkdir -p "$OUT" "$RAW"
LOG=$OUT/gpu-test.log
fails=0

say() { echo "$*" | tee -a "$LOG"; }
# pack refreshes $OUT/raw.tgz (after every PASS or FAIL: a run cut short
# still brings back what it measured).
pack() {
	[ -n "$(ls -A "$RAW" 2>/dev/null)" ] || return 0
	tar -czf "$OUT/raw.tgz.tmp" -C "$RAW" . 2>/dev/null && mv "$OUT/raw.tgz.tmp" "$OUT/raw.tgz"
}
pass() {
	say "PASS $*"
	pack
}
fail() {
	say "FAIL $*"
	fails=$((fails + 1))
	pack
}

build() {
	cd "$ROOT" || exit 1
	mkdir -p "$CARRY"
	export CGO_ENABLED=0
	go build -o "$CARRY/phxmount" ./cmd/phxmount &&
		go build -o "$CARRY/phxbench-gpu" ./cmd/phxbench-gpu &&
		go test -c -o "$CARRY/phxfs.test" ./phxfs &&
		go test -c -o "$CARRY/nvidia.test" ./connector/nvidia || {
		echo "FAIL build"
		exit 1
	}
	mkdir -p "$REF"
	if ls "$ROOT"/../shared/reference/*.cu >/dev/null 2>&1; then
		cp "$ROOT"/../shared/reference/*.cu "$REF"/
	else
		echo "WARN build: no ../shared/reference/*.cu: the benchmark's reference rows will be 'not run'"
	fi
	local dirty=
	[ -z "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ] || dirty=-dirty
	echo "$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$dirty" >"$CARRY/commit"
	echo "build: $(ls "$CARRY" | grep -v '^out$' | tr '\n' ' ')in .devcarry/ (CGO_ENABLED=0); commit $(cat "$CARRY/commit")"
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
	for b in ${*:-phxmount phxbench-gpu phxfs.test nvidia.test}; do
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
	local from
	from=$(($(wc -l <"$RAW/phxmount.log" 2>/dev/null || echo 0) + 1))
	"$CARRY/phxmount" --vendor nvidia --metrics 127.0.0.1:0 "$@" "$WORK/backing" "$MNT" >>"$RAW/phxmount.log" 2>&1 &
	DAEMON=$!
	# phxmount wait: the one readiness check (the INFO ioctl answers).
	if "$CARRY/phxmount" wait --timeout 10 "$MNT" >>"$RAW/phxmount.log" 2>&1; then
		METRICS_URL=$(tail -n +"$from" "$RAW/phxmount.log" | grep -o 'metrics: serving http://[0-9.:]*/metrics' |
			tail -1 | cut -d' ' -f3)
		return 0
	fi
	fail "phxmount --vendor nvidia did not mount (see phxmount.log)"
	tail -5 "$RAW/phxmount.log" | tee -a "$LOG"
	return 1
}

# gen_shards DIR SIZE: a 2-shard checkpoint (SIZE per shard) in
# $WORK/backing/DIR, with its index JSON.
gen_shards() {
	local d=$WORK/backing/$1 size=$2
	[ -f "$d/model.safetensors.index.json" ] && return 0
	mkdir -p "$d"
	for i in 1 2; do
		"$CARRY/phxbench-gpu" gen -out "$d/model-0000$i-of-00002.safetensors" -size "$size" -seed $((i + 1)) -prefix "shard$i." >/dev/null || return 1
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

# gpus is the number of GPUs here.
gpus() { nvidia-smi -L 2>/dev/null | grep -c '^GPU'; }

gen_kv() { # the KV benchmark's hot 4 GiB file (random bytes; any file does)
	[ -f "$KVFILE" ] && return 0
	timeout 300 "$CARRY/phxbench-gpu" gen -out "$KVFILE" -size 4GiB -seed 3 >/dev/null 2>&1 || {
		fail "generate $KVFILE"
		return 1
	}
}

gen_file() {
	[ -f "$FILE" ] && return 0
	mkdir -p "$WORK/backing"
	say "--- generate a $SIZE safetensors file in $WORK ($(df -T "$WORK" | awk 'NR==2{print $1" "$2}'))"
	timeout 300 "$CARRY/phxbench-gpu" gen -out "$FILE" -size "$SIZE" 2>&1 | tee -a "$LOG" || { fail "generate $FILE"; return 1; }
	sync
}

# install_py: pip install ./python into this python3, as a user does: its
# phxmount-hook.pth is what PHXMOUNT_HOOK needs at interpreter start.
install_py() {
	if python3 -m pip install -q --no-index --no-deps --no-build-isolation "$ROOT/python" >"$RAW/pip.log" 2>&1; then
		say "pip install ./python: $(python3 -c 'import phxmount; print(phxmount.__version__, phxmount.__file__)')"
	else
		fail "pip install ./python (see pip.log)"
		return 1
	fi
}

# drop_in: issue 19's checks and rows on a Llama-shaped checkpoint that
# transformers writes (python/tools/gpu_hf.py), the mount up.
drop_in() {
	install_py || return
	if [ ! -f "$WORK/backing/llama/config.json" ]; then
		say "--- generate the Llama-shaped checkpoint (transformers save_pretrained)"
		timeout 300 python3 python/tools/gpu_hf.py gen --dir "$WORK/backing/llama" 2>&1 | tail -3 | tee -a "$LOG" ||
			{ fail "generate the Llama-shaped checkpoint"; return 1; }
	fi
	py_tool gpu_hf 900 run --mount-dir "$MNT" --backing-dir "$WORK/backing" --ckpt llama \
		--phxmount "$CARRY/phxmount" --out "$RAW/run-hf.json"
}

# tensor_parallel: issue 20's checks and rows on the same checkpoint
# (python/tools/gpu_tp.py), with col_shard.cu run beside it on the
# checkpoint's file at both row widths of its dim-1 tensors.
tensor_parallel() {
	local f w outs=()
	f=$(ls "$WORK"/backing/llama/*.safetensors 2>/dev/null | head -1)
	[ -n "$f" ] || { fail "tensor parallel: no Llama-shaped checkpoint (drop_in writes it)"; return 1; }
	build_refs col_shard
	if [ -x "$REF/col_shard" ]; then
		for w in 8192 28672; do
			timeout 120 "$REF/col_shard" "$f" 4096 $w >"$RAW/ref-col_shard-$w.txt" 2>&1 || fail "col_shard.cu ($w-byte rows)"
			tee -a "$LOG" <"$RAW/ref-col_shard-$w.txt"
			outs+=("$RAW/ref-col_shard-$w.txt")
		done
	fi
	py_tool gpu_tp 600 run --mount-dir "$MNT" --backing-dir "$WORK/backing" --ckpt llama --out "$RAW/run-tp.json" \
		--ranks "${PHX_TP_RANKS:-both}" ${METRICS_URL:+--metrics-url "$METRICS_URL"} --ref-col "${outs[@]}"
}

# go_tests: the nvidia connector's tests and the phxfs suites on it.
go_tests() {
	say "--- connector/nvidia tests"
	if timeout 150 ./.devcarry/nvidia.test -test.v -test.count=1 >"$RAW/nvidia-test.log" 2>&1; then
		pass "connector/nvidia: $(grep -c '^--- PASS' "$RAW/nvidia-test.log") tests passed, $(grep -c -- '--- SKIP' "$RAW/nvidia-test.log") skipped"
	else
		fail "connector/nvidia: $(grep -E '^(--- FAIL|FAIL|panic)' "$RAW/nvidia-test.log" | head -5 | tr '\n' ' ')"
	fi
	say "--- phxfs suites on the nvidia connector (staged transport)"
	if (cd phxfs && PHX_TEST_CONNECTOR=nvidia timeout 170 ../.devcarry/phxfs.test -test.v -test.count=1 -test.timeout=160s) >"$RAW/phxfs-test.log" 2>&1; then
		pass "phxfs on nvidia: $(grep -c -- '--- PASS' "$RAW/phxfs-test.log") (sub)tests passed, $(grep -c -- '--- SKIP' "$RAW/phxfs-test.log") skipped"
	else
		fail "phxfs on nvidia: $(grep -E -- '--- FAIL|^FAIL|panic' "$RAW/phxfs-test.log" | head -5 | tr '\n' ' ')"
	fi
	grep -E '^ +[a-z_]+_test\.go:[0-9]+: ' "$RAW/phxfs-test.log" | sed 's/^ */why: /' | sort | uniq -c | head -5 | tee -a "$LOG"
}

run_header() {
	cd "$ROOT" || exit 1
	need_binaries
	run_identity
	rm -f "$RAW"/run-*.json
	say "=== gpu-test $1: $(date -u +%FT%TZ) $(nvidia-smi -L 2>&1 | head -1); kernel $(uname -r); python $(python3 -c 'import sys; print(sys.version.split()[0])')"
}

run() {
	run_header run
	go_tests
	say "--- the Python client's unit tests (emu mounts included)"
	if (cd python && PHXMOUNT_BIN=$CARRY/phxmount timeout 240 python3 -m unittest discover -s tests) >>"$LOG" 2>&1; then
		pass "python unit tests"
	else
		fail "python unit tests (see gpu-test.log)"
	fi
	say "--- end to end: phxmount --vendor nvidia, the Python client + torch vs safetensors"
	gen_file || return
	gen_shards sharded 512MiB || fail "generate the sharded checkpoint"
	mount_phx || return
	if PYTHONUNBUFFERED=1 timeout 480 python3 python/tools/gpu_e2e.py --mount-file "$MNT/model.safetensors" \
		--backing-file "$FILE" --shard-dir sharded --slices 200 2>&1 | tee -a "$LOG"; then
		pass "end to end"
	else
		fail "end to end"
	fi
	if [ "$(gpus)" -ge 2 ]; then
		gen_shards sharded2 4GiB || fail "generate the 2 x 4 GiB checkpoint"
		py_tool gpu_two 320 test --mount-dir "$MNT" --backing-dir "$WORK/backing" --shards sharded2
	else
		say "two GPUs: not run (this machine has $(gpus) GPU)"
	fi
	drop_in
	tensor_parallel
	grep -E "registered .* buffer" "$RAW/phxmount.log" | head -2 | sed -e 's/^time="[^"]*" //' | tee -a "$LOG"
	unmount
}

# build_refs [NAME...] builds the reference programs (default: those the
# benchmark uses) in .devcarry/ref with this machine's nvcc, by the build
# line in each file's header (plus -arch=sm_90; without it when that fails).
build_refs() {
	local nvcc p line pids=() progs=("${@:-staged_ceiling kv_blocks two_gpu}")
	# shellcheck disable=SC2206 # the default is words
	progs=(${progs[*]})
	nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
	if [ -z "$nvcc" ]; then
		fail "no nvcc: the reference programs cannot be built (their rows will be 'not run')"
		return 1
	fi
	for p in "${progs[@]}"; do
		if [ ! -f "$REF/$p.cu" ]; then
			fail "no .devcarry/ref/$p.cu ('bash scripts/gpu-test.sh build' copies ../shared/reference there)"
			continue
		fi
		[ "$REF/$p" -nt "$REF/$p.cu" ] && continue
		line=$(sed -n 's|^// Build: *||p' "$REF/$p.cu" | sed 's/ *;.*//' | head -1)
		[ -n "$line" ] || line="nvcc -O2 -std=c++17 -o $p $p.cu -lpthread"
		# shellcheck disable=SC2086 # the build line is words
		( (cd "$REF" && timeout "${NVCC_TIMEOUT:-300}" $nvcc ${line#nvcc } -arch=sm_90) >"$RAW/ref-build-$p.log" 2>&1 ||
			(cd "$REF" && timeout "${NVCC_TIMEOUT:-300}" $nvcc ${line#nvcc }) >>"$RAW/ref-build-$p.log" 2>&1) &
		pids+=($!)
	done
	# Only the builds: a bare wait would also wait for a mounted daemon.
	[ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"
	for p in "${progs[@]}"; do
		[ -x "$REF/$p" ] || fail "build the reference $p (see ref-build-$p.log)"
	done
}

# run_refs runs the reference programs on the files the project's rows use;
# their stdout is what gpu_report.py parses.
run_refs() {
	say "--- reference programs (../shared/reference, built here)"
	if [ -x "$REF/staged_ceiling" ]; then
		timeout 300 "$REF/staged_ceiling" "$FILE" >"$RAW/ref-staged_ceiling.txt" 2>&1 || fail "staged_ceiling.cu run"
		tee -a "$LOG" <"$RAW/ref-staged_ceiling.txt"
	fi
	if [ -x "$REF/kv_blocks" ]; then
		timeout 300 "$REF/kv_blocks" "$KVFILE" >"$RAW/ref-kv_blocks.txt" 2>&1 || fail "kv_blocks.cu run"
		tee -a "$LOG" <"$RAW/ref-kv_blocks.txt"
	fi
	if [ -x "$REF/two_gpu" ] && [ "$(gpus)" -ge 2 ]; then
		timeout 300 "$REF/two_gpu" "$FILE" >"$RAW/ref-two_gpu.txt" 2>&1 || fail "two_gpu.cu run"
		tee -a "$LOG" <"$RAW/ref-two_gpu.txt"
	fi
	pack
}

# py_tool NAME TIMEOUT ARGS...: one of the Python benchmark tools.
py_tool() {
	local name=$1 limit=$2
	shift 2
	say "--- $name"
	if PYTHONUNBUFFERED=1 timeout "$limit" python3 "python/tools/$name.py" "$@" 2>&1 | tee -a "$LOG"; then
		pass "$name"
	else
		fail "$name (see gpu-test.log)"
	fi
}

# run_identity names the run every tool's rows belong to (benchlib.this_run
# reads it; the report stamps the rows it makes with the same).
run_identity() {
	export PHX_RUN_DATE=${PHX_RUN_DATE:-$(date -u +%FT%TZ)}
	export PHX_RUN_COMMIT=${PHX_RUN_COMMIT:-$(cat "$CARRY/commit" 2>/dev/null || echo unknown)}
	[ -n "${PHX_RUN_MACHINE:-}" ] ||
		export PHX_RUN_MACHINE="$(nvidia-smi -L 2>/dev/null | wc -l) x $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB"
}

# report [--table NAME]: docs/bench/gpu-latest.json's rows from $RAW.
report() {
	run_identity
	# shellcheck disable=SC2086 # PHX_EXTRA_ROWS: JSON files of more rows, space-separated
	python3 python/tools/gpu_report.py --go "$RAW/bench-go.json" --py "$RAW/bench-py.json" --kv "$RAW/bench-kv.json" \
		--shard "$RAW/bench-shard.json" --save "$RAW/bench-save.json" --ref-staged "$RAW/ref-staged_ceiling.txt" \
		--ref-kv "$RAW/ref-kv_blocks.txt" --rows $(ls "$RAW"/bench-two.json "$RAW"/run-*.json 2>/dev/null) ${PHX_EXTRA_ROWS:-} --commit "$PHX_RUN_COMMIT" \
		--machine "$PHX_RUN_MACHINE" --date "$PHX_RUN_DATE" "$@" --json-out "$OUT/gpu-latest.json" "$ROOT/docs/bench/gpu-latest.json" --md-out "$OUT/bench.md" |
		tee -a "$LOG" || fail "gpu_report"
}

# issue27 [quick|plan]: issue 27's rows in one call (see the header). Every
# step's time is said as it ends; the Python part gets what is left of
# PHX27_DEADLINE_S less PHX27_RESERVE_S (unmount, report, pack) and runs
# only the steps that fit it.
issue27() {
	local mode=${1:-full} q= deadline reserve=${PHX27_RESERVE_S:-25} need free t budget refpid setup
	[ "$mode" = full ] || q=--quick
	deadline=${PHX27_DEADLINE_S:-$([ "$mode" = full ] && echo 570 || echo 240)}
	local ckpts=$WORK/backing/ckpt27 reps=${PHX27_REPS:+--reps $PHX27_REPS}
	cd "$ROOT" || exit 1
	if [ "${2:-}" = plan ]; then
		# What a bare machine spends before the rows: the package, nvcc
		# (beside the generation), the checkpoints at about 1.5 GB/s to
		# the disk, their sync.
		need=$(python3 python/tools/ckpt_gen.py need --root "$ckpts" $q)
		setup=$((15 + (need / 1000000000 * 2 / 3 > 35 ? need / 1000000000 * 2 / 3 : 35)))
		echo "issue27 $mode: deadline ${deadline} s; setup ~${setup} s (package, nvcc beside generating $((need / 1000000000)) GB); report and unmount ${reserve} s"
		# shellcheck disable=SC2086
		python3 python/tools/ckpt_gen.py plan $q
		# shellcheck disable=SC2086
		python3 python/tools/gpu_shapes.py plan --budget-s $((deadline - reserve - setup)) $q $reps
		return
	fi
	need_binaries phxmount
	run_identity
	rm -f "$RAW"/run-*.json "$RAW"/bench-*.json "$RAW"/ref-*.txt "$OUT/gpu-latest.json" "$OUT/bench.md"
	say "=== gpu-test issue27 ($mode): $PHX_RUN_DATE $PHX_RUN_MACHINE; commit $PHX_RUN_COMMIT; deadline ${deadline} s"
	# shellcheck disable=SC2086
	python3 python/tools/ckpt_gen.py plan $q | tee -a "$LOG"
	# The disk: what is not generated yet must fit, with 2 GB to spare;
	# checkpoints of other layouts go first.
	need=$(python3 python/tools/ckpt_gen.py need --root "$ckpts" $q)
	free=$(df -B1 --output=avail "$WORK" | tail -1)
	if [ "$need" -gt $((free - 2000000000)) ]; then
		python3 python/tools/ckpt_gen.py prune --root "$ckpts" | tee -a "$LOG"
		free=$(df -B1 --output=avail "$WORK" | tail -1)
	fi
	say "disk: $((need / 1000000000)) GB to write, $((free / 1000000000)) GB free on $WORK"
	[ "$need" -le $((free - 2000000000)) ] || { fail "issue27: the checkpoints need $need bytes, $free free on $WORK"; return 1; }
	say "--- [${SECONDS} s] reference programs built in the background (nvcc), the package installed, checkpoints generated"
	# Each nvcc try gets a sixth of the deadline (two tries: a third): the wait below is bounded.
	NVCC_TIMEOUT=$((deadline / 6)) build_refs staged_ceiling kv_blocks >"$RAW/ref-build.txt" 2>&1 &
	refpid=$!
	install_py || return 1
	t=$SECONDS
	# shellcheck disable=SC2086
	timeout $((deadline / 2)) python3 python/tools/ckpt_gen.py gen --root "$ckpts" $q --sync 2>&1 | tee -a "$LOG" ||
		{ fail "issue27: generate the checkpoints"; return 1; }
	say "checkpoints: $((SECONDS - t)) s"
	t=$SECONDS
	wait "$refpid"
	say "reference builds: waited $((SECONDS - t)) s more"
	for p in staged_ceiling kv_blocks; do
		[ -x "$REF/$p" ] || fail "issue27: the reference $p did not build (see ref-build.txt, ref-build-$p.log): its rows have no ref"
	done
	mount_phx || return 1
	budget=$((deadline - reserve - SECONDS))
	# Too little left still runs the tool: its rows then say they were not run, and why.
	[ "$budget" -ge 10 ] || budget=10
	say "--- [${SECONDS} s] gpu_shapes: ${budget} s of the budget left for the rows"
	# shellcheck disable=SC2086
	py_tool gpu_shapes $((budget + 15)) run --backing-dir "$WORK/backing" --mount-dir "$MNT" --ckpt-root "$ckpts" \
		--ref-dir "$REF" --raw "$RAW" --out "$RAW/run-shapes.json" --budget-s "$budget" $q $reps
	unmount
	say "--- [${SECONDS} s] report"
	report --table issue27
	say "issue27 ($mode): ${SECONDS} s in all"
}

# step NAME: whether PHX_BENCH_ONLY (default: every step) includes NAME.
step() { [[ " ${PHX_BENCH_ONLY:-go gokv refs py kv shard save two} " == *" $1 "* ]]; }

# go_kv: KV blocks through the library in-process (the daemon's share of
# the mount's KV figure), per client threads, scatter method and share.
go_kv() {
	local share
	say "--- KV blocks through the library in-process (phxbench-gpu kv)"
	for share in ${PHX_KV_SHARES:-1024}; do
		timeout 120 "$CARRY/phxbench-gpu" kv -file "$KVFILE" -share $share -scatter auto,kernel,batch \
			-out "$RAW/bench-gokv-$share.json" 2>&1 | tee -a "$LOG" || fail "Go KV benchmark (share $share KiB)"
	done
}

# two: issue 10's rows on a machine with two GPUs (the mount is up).
two() {
	if [ "$(gpus)" -lt 2 ]; then
		say "two GPUs: not run (this machine has $(gpus) GPU)"
		return 0
	fi
	gen_shards sharded2 4GiB || { fail "generate the 2 x 4 GiB checkpoint"; return 1; }
	timeout 200 "$CARRY/phxbench-gpu" two -file "$FILE" -out "$RAW/bench-two-go.json" 2>&1 | tee -a "$LOG" || fail "Go two-GPU benchmark"
	py_tool gpu_two 500 bench --mount-dir "$MNT" --backing-dir "$WORK/backing" --shards sharded2 \
		--ref-two "$RAW/ref-two_gpu.txt" --go "$RAW/bench-go.json" --out "$RAW/bench-two.json"
}

bench() {
	cd "$ROOT" || exit 1
	need_binaries
	run_identity
	gen_file || return
	gen_kv || return
	say "=== benchmark: file -> GPU memory, $SIZE safetensors, hot and cold; KV blocks; rank shards; saving"
	# A step that does not run must not leave an older run's figures behind.
	rm -f "$RAW"/bench-*.json "$RAW"/ref-*.txt "$OUT/gpu-latest.json" "$OUT/bench.md"
	step refs && build_refs
	step gokv && go_kv
	if step go; then
		timeout 300 "$CARRY/phxbench-gpu" bench -file "$FILE" -out "$RAW/bench-go.json" -sweep-engines io_uring \
			-sweep-buffers 2 -sweep-bounce ${PHX_SWEEP_BOUNCE:-4} -sweep-workers ${PHX_SWEEP_WORKERS:-16} -sweep-round 1024 2>&1 |
			tee -a "$LOG" || fail "Go benchmark"
	fi
	step refs && run_refs
	local w e b
	read -r w e b < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["chosen"]["workers"], d["env"]["engine"], d["chosen"]["buffers"])' "$RAW/bench-go.json" 2>/dev/null)
	say "phxmount for the benchmark: --workers ${w:-16} --engine ${e:-io_uring}, PHX_STAGED_BUFFERS=${b:-2} (the Go sweep's best at this shape)"
	PHX_STAGED_BUFFERS=${b:-2} mount_phx --workers "${w:-16}" --engine "${e:-io_uring}" || return
	step py && py_tool gpu_bench 420 --mount-file "$MNT/model.safetensors" --backing-file "$FILE" --out "$RAW/bench-py.json" \
		--cold-reps "${PHX_COLD_REPS:-1}"
	# Reads, then writes into kv-write.bin beside kv.bin (made once, 4 GiB):
	# about 3 minutes on one H200.
	step kv && py_tool gpu_kv 540 --mount-file "$MNT/kv.bin" --backing-file "$KVFILE" --out "$RAW/bench-kv.json"
	step shard && py_tool gpu_bench_shard 300 --mount-file "$MNT/model.safetensors" --backing-file "$FILE" \
		--out "$RAW/bench-shard.json"
	step save && py_tool gpu_bench_save 420 --source "$MNT/model.safetensors" --mount-dir "$MNT" \
		--backing-dir "$WORK/backing" --out "$RAW/bench-save.json"
	step two && two
	unmount
	report
}

trap 'unmount; pack' EXIT
case "${1:-}" in
build) build ;;
run) run ;;
bench) bench ;;
report) report ;;
issue27) issue27 full ;;
issue27-quick) issue27 quick ;;
issue27-plan)
	issue27 full plan
	exit $?
	;;
issue27-quick-plan)
	issue27 quick plan
	exit $?
	;;
hf)
	cd "$ROOT" && need_binaries && mount_phx && drop_in && tensor_parallel
	unmount
	;;
focus)
	# What one device call of 10 minutes holds: the Go suites on the GPU,
	# the drop-in and the tensor-parallel checks and rows, and their report
	# (the benchmark's other rows "not run").
	mkdir -p "$WORK/backing"
	run_header focus
	# An earlier call's benchmark files are no part of this run: its
	# report must not make rows of them under this run's name.
	rm -f "$RAW"/bench-*.json "$RAW"/ref-*.txt
	go_tests
	mount_phx && drop_in && tensor_parallel
	unmount
	report
	;;
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
	echo "usage: $0 [build|run|bench|all|focus|hf|issue27|issue27-quick|issue27-plan|issue27-quick-plan|report]" >&2
	exit 2
	;;
esac
say "gpu-test: $fails failure(s)"
[ "$fails" = 0 ]

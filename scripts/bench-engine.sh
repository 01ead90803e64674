#!/usr/bin/env bash
# make bench-engine: the phxfs batch API against fio on the same file, block
# size and queue depth, in one run. Random 4 KiB and sequential 1 MiB
# O_DIRECT reads, page cache dropped before each measurement, into
# registered emulated-device buffers. Prints ratios to fio and writes the
# raw numbers to $BENCH_ENGINE_RAW (default bench-engine-raw.jsonl).
#
# Env: BENCH_DIR (a directory on a real disk, default /var/tmp),
# BENCH_FILE_GB (file size, default 4), BENCH_SECONDS (per run, default 5),
# BENCH_QD (default 64), BENCH_REPS (default 3: the runs of a comparison
# alternate, and each figure is the median of its repetitions, since the
# virtual disk's speed moves by several times between minutes here).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
[ -x "$BIN/phxbench-engine" ] || { mkdir -p "$BIN"; CGO_ENABLED=0 go build -ldflags=-checklinkname=0 -o "$BIN/" ./cmd/phxbench-engine; }
if [ "$(id -u)" != 0 ]; then echo "bench-engine: needs root (drop_caches)" >&2; exit 1; fi
if ! command -v fio >/dev/null; then
	echo "bench-engine: installing fio" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >/dev/null || { echo "bench-engine: fio is missing and could not be installed" >&2; exit 1; }
fi
command -v jq >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq >/dev/null

RAW=${BENCH_ENGINE_RAW:-$PWD/bench-engine-raw.jsonl}
GB=${BENCH_FILE_GB:-4} SECS=${BENCH_SECONDS:-5} QD=${BENCH_QD:-64} REPS=${BENCH_REPS:-3}
dir=${BENCH_DIR:-/var/tmp}/phxbench-engine
file=$dir/data.${GB}g
mkdir -p "$dir"
if [ "$(stat -c %s "$file" 2>/dev/null || echo 0)" != $((GB << 30)) ]; then
	echo "bench-engine: writing a ${GB} GiB file at $file (kept for later runs)"
	# Real blocks, not a sparse or preallocated file: reads must hit the disk.
	head -c $((GB << 30)) /dev/urandom | dd of="$file" bs=1M iflag=fullblock oflag=direct status=none
fi
: >"$RAW"
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }

fio_run() { # pattern bs
	local rw=randread
	[ "$1" = seq ] && rw=read
	drop
	fio --name=bench --filename="$file" --rw=$rw --bs="$2" --iodepth="$QD" --ioengine=io_uring \
		--direct=1 --numjobs=1 --time_based --runtime="$SECS" --output-format=json --randrepeat=0 |
		jq -c --arg p "$1" '{tool:"fio", pattern:$p, bs:.jobs[0]["job options"].bs,
			iops:.jobs[0].read.iops, mb_per_s:(.jobs[0].read.bw_bytes/1e6)}' | tee -a "$RAW"
}
phx_run() { # pattern bs engine transport workers [cmp] (env PHX_STAGED_BUFFERS passes through)
	drop
	"$BIN/phxbench-engine" -file "$file" -pattern "$1" -bs "$2" -engine "$3" -transport "$4" \
		-workers "$5" -qd $((QD / $5)) -seconds "$SECS" | jq -c --arg cmp "${6:-}" '. + {tool:"phxfs", cmp:($cmp != "")}' | tee -a "$RAW"
}
# val SELECT FIELD: the median of FIELD over the runs that SELECT matches.
val() { jq -s -r "map(select($1) | .$2) | sort | .[(length - 1) / 2 | floor]" "$RAW"; }

echo "kernel $(uname -r), $(nproc) cores, file $file, $SECS s per run, queue depth $QD, medians of $REPS"
for rep in $(seq "$REPS"); do
for p in "rand 4096" "seq 1048576"; do
	set -- $p
	fio_run "$1" "$2"
	phx_run "$1" "$2" io_uring host 1
	phx_run "$1" "$2" sync host 1
	if [ "$1" = seq ]; then # the transports side by side, same workers and depth
		phx_run "$1" "$2" io_uring host 4 cmp
		# Staged keeps half its bounce buffers' reads in flight: 32 buffers
		# per worker give the same depth as the host run.
		PHX_STAGED_BUFFERS=$((2 * QD / 4)) phx_run "$1" "$2" io_uring staged 4
	fi
done
done >/dev/null

printf '\n%-44s %12s %10s %8s %s\n' "benchmark" "IOPS" "MB/s" "ratio" "target"
row() { # label select-expr baseline-expr target
	local iops mbps base ratio
	iops=$(val "$2" iops) mbps=$(val "$2" mb_per_s) base=$(val "$3" mb_per_s)
	ratio=$(awk -v a="$mbps" -v b="$base" 'BEGIN { printf "%.2f", a / b }')
	local verdict=""
	[ -n "$4" ] && verdict=$(awk -v r="$ratio" -v t="$4" 'BEGIN { print (r >= t ? "≥ " t " met" : "≥ " t " MISSED") }')
	printf '%-44s %12.0f %10.1f %7sx %s\n' "$1" "$iops" "$mbps" "$ratio" "$verdict"
}
for p in rand seq; do
	f=".tool==\"fio\" and .pattern==\"$p\""
	u=".tool==\"phxfs\" and .pattern==\"$p\" and .engine==\"io_uring\" and .transport==\"host\" and .workers==1"
	s=".tool==\"phxfs\" and .pattern==\"$p\" and .engine==\"sync\""
	bs=4k; [ $p = seq ] && bs=1m
	row "fio io_uring $p $bs QD$QD (baseline)" "$f" "$f" ""
	row "phxfs batch io_uring $p $bs vs fio" "$u" "$f" 0.95
	row "phxfs batch sync $p $bs vs fio" "$s" "$f" ""
done
st=".tool==\"phxfs\" and .transport==\"staged\""
row "phxfs staged seq 1m vs host (4 workers each)" "$st" ".cmp==true" 0.90
echo "(the virtual disk is cached by the host beneath this VM: dropping the guest's page cache does"
echo " not make reads cold there, so sequential figures above the disk's ~1.5 GB/s are that cache)"
echo "raw numbers: $RAW"

#!/usr/bin/env bash
# make bench-engine: the phxfs batch API against fio on the same file, block
# size and queue depth, in one run. Random 4 KiB and sequential 1 MiB
# O_DIRECT reads, page cache dropped before each measurement, into
# registered emulated-device buffers. Prints ratios to fio and writes the
# raw numbers to $BENCH_ENGINE_RAW (default bench-engine-raw.jsonl).
# The rows compared with fio reach the engine as fio's do: one op per
# request, unsorted (cmd/phxbench-engine/plan.go); what phxfs's coalescing
# of contiguous requests buys is its own row, labelled as such.
#
# Env: BENCH_DIR (a directory on a real disk, default /var/tmp),
# BENCH_FILE_GB (file size, default 4), BENCH_SECONDS (per run, default 5),
# BENCH_QD (default 64), BENCH_REPS (default 3: the runs of a comparison
# alternate, and each figure is the median of its repetitions, since the
# virtual disk's speed moves by several times between minutes here).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
[ -x "$BIN/phxbench-engine" ] || { mkdir -p "$BIN"; CGO_ENABLED=0 go build -o "$BIN/" ./cmd/phxbench-engine; }
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
# Under a VM the host may cache the virtual disk beyond any guest drop: one
# O_DIRECT pass up front leaves the file equally host-warm for every run,
# instead of making the first run alone read from the disk.
dd if="$file" of=/dev/null bs=1M iflag=direct status=none
: >"$RAW"
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }

fio_run() { # pattern bs ioengine depth
	local rw=randread
	[ "$1" = seq ] && rw=read
	drop
	fio --name=bench --filename="$file" --rw=$rw --bs="$2" --iodepth="$4" --ioengine="$3" \
		--direct=1 --numjobs=1 --time_based --runtime="$SECS" --output-format=json --randrepeat=0 |
		jq -c --arg p "$1" --arg e "$3" --argjson qd "$4" '{tool:"fio", pattern:$p, engine:$e, qd:$qd,
			bs:.jobs[0]["job options"].bs, iops:.jobs[0].read.iops, mb_per_s:(.jobs[0].read.bw_bytes/1e6)}' | tee -a "$RAW"
}
phx_run() { # plan bs engine transport workers [cmp] (env PHX_STAGED_BUFFERS passes through)
	drop
	"$BIN/phxbench-engine" -file "$file" -pattern "$1" -bs "$2" -engine "$3" -transport "$4" \
		-workers "$5" -qd $((QD / $5)) -seconds "$SECS" |
		jq -c --arg cmp "${6:-}" '. + {tool:"phxfs", cmp:($cmp != ""),
			per_batch:(.requests / .batches), ops_per_batch:(.ops / .batches)}' | tee -a "$RAW"
}
# val SELECT FIELD: the median of FIELD over the runs that SELECT matches
# ("null" when none ran).
val() { jq -s -r "map(select($1) | .$2) | sort | .[(length - 1) / 2 | floor]" "$RAW"; }

echo "kernel $(uname -r), $(nproc) cores, file $file, $SECS s per run, queue depth $QD, medians of $REPS"
# phxfs plans (cmd/phxbench-engine/plan.go): rand and seq reach the engine as
# one op per request in submission order, as fio's do (the command fails
# otherwise); seq-contig lets phxfs coalesce and is reported on its own row.
# The sync engine reads one request at a time, so its baseline is fio psync
# at depth 1.
for rep in $(seq "$REPS"); do
for p in "rand 4096" "seq 1048576"; do
	set -- $p
	fio_run "$1" "$2" io_uring "$QD"
	phx_run "$1" "$2" io_uring host 1
	fio_run "$1" "$2" psync 1
	phx_run "$1" "$2" sync host 1
	if [ "$1" = seq ]; then
		phx_run seq-contig "$2" io_uring host 1
		# The transports side by side, same plan, workers and depth.
		phx_run "$1" "$2" io_uring host 4 cmp
		# Staged keeps half its bounce buffers' reads in flight: 32 buffers
		# per worker give the same depth as the host run.
		PHX_STAGED_BUFFERS=$((2 * QD / 4)) phx_run "$1" "$2" io_uring staged 4
	fi
done
done >/dev/null

W=96
printf '\n%-*s %12s %10s %8s %s\n' $W "benchmark (what is timed)" "IOPS" "MB/s" "ratio" "target"
row() { # label select-expr baseline-expr target
	local iops mbps base ratio verdict=""
	iops=$(val "$2" iops) mbps=$(val "$2" mb_per_s) base=$(val "$3" mb_per_s)
	if [ "$mbps" = null ] || [ "$base" = null ]; then
		printf '%-*s %12s\n' $W "$1" "not run"
		return
	fi
	ratio=$(awk -v a="$mbps" -v b="$base" 'BEGIN { printf "%.2f", a / b }')
	[ -n "$4" ] && verdict=$(awk -v r="$ratio" -v t="$4" 'BEGIN { print (r >= t ? "≥ " t " met" : "≥ " t " MISSED") }')
	printf '%-*s %12.0f %10.1f %7sx %s\n' $W "$1" "$iops" "$mbps" "$ratio" "$verdict"
}
sel_phx() { # plan engine transport workers: select one phxfs configuration
	echo ".tool==\"phxfs\" and .pattern==\"$1\" and .engine==\"$2\" and .transport==\"$3\" and .workers==$4"
}
sel_fio() { echo ".tool==\"fio\" and .pattern==\"$1\" and .engine==\"$2\""; }
for p in rand seq; do
	if [ $p = rand ]; then bs="4 KiB" how="unsorted, "; else bs="1 MiB" how=""; fi
	n=$(val "$(sel_phx $p io_uring host 1)" per_batch)
	row "fio io_uring $p $bs QD$QD, 1 job (baseline)" "$(sel_fio $p io_uring)" "$(sel_fio $p io_uring)" ""
	row "phxfs io_uring $p $bs QD$QD, ${how}1 op/request, batches of $n, vs fio" \
		"$(sel_phx $p io_uring host 1)" "$(sel_fio $p io_uring)" 0.95
	row "fio psync $p $bs QD1 (baseline)" "$(sel_fio $p psync)" "$(sel_fio $p psync)" ""
	row "phxfs sync engine $p $bs QD1, ${how}1 op/request, vs fio psync" \
		"$(sel_phx $p sync host 1)" "$(sel_fio $p psync)" ""
done
c=$(sel_phx seq-contig io_uring host 1)
n=$(val "$c" per_batch) m=$(val "$c" ops_per_batch) ops=ops
[ "$m" = 1 ] && ops=op
row "seq 1 MiB, contiguous buffer: phxfs coalesces $n requests into $m $ops, vs fio QD$QD" \
	"$c" "$(sel_fio seq io_uring)" ""
row "phxfs staged (figures) vs host (ratio), seq 1 MiB, 1 op/request, 4 workers x QD$((QD / 4)) each" \
	"$(sel_phx seq io_uring staged 4)" ".cmp==true" 0.90
echo "(unsorted: phxfs gets the random offsets in fio's order, not sorted into offset order; the"
echo " coalescing row is not the same shape as its baseline, fio's 1 MiB ops: it shows what merging buys)"
if grep -qw hypervisor /proc/cpuinfo; then
	echo "(guest page cache dropped before every run, all reads O_DIRECT; this is a VM, whose host may"
	echo " cache the virtual disk beyond any guest drop: a figure above the disk's own speed is that cache)"
else
	echo "(page cache dropped before every run, all reads O_DIRECT)"
fi
echo "raw numbers: $RAW"

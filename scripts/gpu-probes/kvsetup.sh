# Sourced by the KV probes (kvprof.sh, kvlat.sh, kvcap.sh, kvgc.sh) on the
# GPU machine, after they set PROBE (their name), NEED (the .devcarry
# binaries they run) and HOW (how to build them where Go is): the
# repository root as the working directory (ROOT; C its .devcarry), the
# work folders, the summary $OUT/$PROBE.txt with say, el (seconds so far)
# and pack (the raw outputs of $R into $OUT/raw.tgz), the header line,
# kv_blocks.cu building in the background (NV: its pid, empty when it
# cannot) and the 4 GiB block file $KV, hot. NOREF=1: no reference is
# built. PIP=1: ./python installed too (for gpu_kv.py).
ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
cd "$ROOT" || exit 1
C=${C:-$ROOT/.devcarry}
OUT=${OUT:-$C/out}
W=/var/tmp/phxgpu R=/var/tmp/phxgpu/$PROBE KV=/var/tmp/phxgpu/backing/kv.bin
mkdir -p "$OUT" "$R" "$W/backing" "$W/mnt"
T=$OUT/$PROBE.txt
: >"$T"
T0=$(date +%s)
say() { echo "$*" | tee -a "$T"; }
el() { echo "$(($(date +%s) - T0)) s"; }
pack() { tar -czf "$OUT/raw.tgz" -C "$R" . 2>/dev/null; }
for b in $NEED; do
	[ -x "$C/$b" ] || { say "no .devcarry/$b: run '$HOW' where Go is"; exit 1; }
done
say "=== $PROBE $(date -u +%FT%TZ) commit $(cat "$C/commit" 2>/dev/null) $(nvidia-smi -L 2>&1 | head -1)"

# The reference builds while the file is made and read.
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
NV=
if [ -n "${NOREF:-}" ]; then
	: # the probe runs no reference (its CPUs stay the measured runs')
elif [ -n "$NVCC" ] && [ -f "$C/ref/kv_blocks.cu" ]; then
	(cd "$C/ref" && { [ kv_blocks -nt kv_blocks.cu ] || timeout 90 "$NVCC" -O2 -std=c++17 -arch=sm_90 -o kv_blocks kv_blocks.cu -lpthread; }) >"$R/nvcc.log" 2>&1 &
	NV=$!
else
	say "no nvcc or no .devcarry/ref/kv_blocks.cu: no reference row"
fi
# Any bytes do (gpu-test.sh's kv.bin is random too); urandom is quicker
# than phxbench-gpu gen, and leaves the file in the page cache (hot).
[ -f "$KV" ] || head -c 4G /dev/urandom >"$KV"
cat "$KV" >/dev/null
say "file $(stat -c %s "$KV") bytes, hot ($(el))"
if [ -n "${PIP:-}" ]; then
	python3 -m pip install -q --no-index --no-deps --no-build-isolation ./python >"$R/pip.log" 2>&1 ||
		say "pip install ./python failed (pip.log)"
fi

# mounted_kv NAME BIN SIZES THREADS LIMIT [VAR=VALUE...]: a daemon
# (.devcarry/BIN, with the variables) on $W/mnt, gpu_kv.py's reads of $KV
# through it (KiB sizes, client threads, 1 GiB a run, within LIMIT
# seconds), its lines in the summary, the mount gone after; its log and
# JSON in $R as daemon-NAME.log and kv-NAME.json.
mounted_kv() {
	local name=$1 bin=$2 sizes=$3 threads=$4 limit=$5 D
	shift 5
	env "$@" "$C/$bin" --vendor nvidia "$W/backing" "$W/mnt" >"$R/daemon-$name.log" 2>&1 &
	D=$!
	if "$C/phxmount" wait --timeout 10 "$W/mnt" >>"$R/daemon-$name.log" 2>&1; then
		timeout "$limit" python3 python/tools/gpu_kv.py --mount-file "$W/mnt/kv.bin" --backing-file "$KV" \
			--out "$R/kv-$name.json" --sizes "$sizes" --threads "$threads" --total 1GiB --directions read \
			--timeout 30 >"$R/kv-$name.txt" 2>&1
		grep -E "GB/s|PASS|FAIL" "$R/kv-$name.txt" | sed "s/^/  $name: /" | cut -c1-200 | tee -a "$T"
		umount "$W/mnt" 2>/dev/null || umount -l "$W/mnt"
	else
		say "$name: no mount"; tail -3 "$R/daemon-$name.log" | tee -a "$T"
		kill "$D" 2>/dev/null
	fi
	wait "$D"
}

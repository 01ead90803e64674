# Sourced by the KV probes (kvprof.sh, kvlat.sh) on the GPU machine, after
# they set PROBE (their name), NEED (the .devcarry binaries they run) and
# HOW (how to build them where Go is): the work folders, the summary
# $OUT/$PROBE.txt with say, el (seconds so far) and pack (the raw outputs
# of $R into $OUT/raw.tgz), the header line, kv_blocks.cu building in the
# background (NV: its pid, empty when it cannot) and the 4 GiB block file
# $KV, hot.
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
if [ -n "$NVCC" ] && [ -f "$C/ref/kv_blocks.cu" ]; then
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

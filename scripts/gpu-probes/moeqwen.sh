# Sourced by the probes that read the MoE and Qwen2 checkpoints through a
# mount (nextprobe.sh, mainprobe.sh): installs ./python, generates both
# checkpoints (ckpt_gen.py, kept between calls on a warm machine), reads
# them once into the page cache and mounts /var/tmp/phxgpu/backing with
# the carried daemon. Sets W (the work folder), C (the checkpoints), T0,
# D (the daemon's pid), QN and MN (the two checkpoints' folder names) and
# Q and M (their folders on the mount). Needs OUT.
W=/var/tmp/phxgpu; C=$W/backing/ckpt27; mkdir -p $W/mnt "$OUT"
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-build-isolation ./python > $W/pip.log 2>&1
python3 python/tools/ckpt_gen.py gen --root $C --only moe,qwen2 --sync > $W/gen.log 2>&1 || { tail $W/gen.log; exit 1; }
cat $C/*/*.safetensors > /dev/null
echo "setup $(( $(date +%s) - T0 )) s"
./.devcarry/phxmount --vendor nvidia $W/backing $W/mnt > $OUT/daemon.log 2>&1 &
D=$!
./.devcarry/phxmount wait --timeout 10 $W/mnt >> $OUT/daemon.log 2>&1 || { echo "no mount"; exit 1; }
QN=$(basename "$(ls -d $C/qwen2-* | head -1)"); MN=$(basename "$(ls -d $C/moe-* | head -1)")
Q=$W/mnt/ckpt27/$QN; M=$W/mnt/ckpt27/$MN

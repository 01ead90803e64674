# Mount the NVMe disk that holds the pattern file.
set -e
mkdir -p /mnt
mount -t ext4 /dev/nvme0n1 /mnt
[ -f /mnt/pattern.bin ] || { echo "no /mnt/pattern.bin"; exit 1; }
mkdir -p /mnt/scratch
echo "check ok: /dev/nvme0n1 mounted, pattern.bin $(stat -c %s /mnt/pattern.bin) bytes"
# /var/tmp (where tests put files that need O_DIRECT) lives on the NVMe disk
mkdir -p /mnt/scratch/var-tmp /var
ln -sfn /mnt/scratch/var-tmp /var/tmp
echo "check ok: /var/tmp is on /dev/nvme0n1"

# Mount the NVMe disk that holds the pattern file.
set -e
mkdir -p /mnt
mount -t ext4 /dev/nvme0n1 /mnt
[ -f /mnt/pattern.bin ] || { echo "no /mnt/pattern.bin"; exit 1; }
mkdir -p /mnt/scratch
echo "check ok: /dev/nvme0n1 mounted, pattern.bin $(stat -c %s /mnt/pattern.bin) bytes"

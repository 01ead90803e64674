# Unload phxfs: no registration left, the class and device node gone.
set -e
sync
umount /mnt 2>/dev/null || true
n=$(cat /sys/class/phxfs/phxfs_dev0/registrations)
[ "$n" = 0 ] || { echo "registrations $n before rmmod"; exit 1; }
echo "check ok: no registration left"
rmmod phxfs
[ ! -e /sys/class/phxfs ] || { echo "/sys/class/phxfs still there"; exit 1; }
[ ! -e /dev/phxfs_dev0 ] || { echo "/dev/phxfs_dev0 still there"; exit 1; }
grep -q phxfs /proc/iomem && { echo "phxfs still in /proc/iomem"; exit 1; }
echo "check ok: rmmod phxfs, device node, class and BAR region released"

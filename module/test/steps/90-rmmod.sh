# Unload phxfs (and fuse): no registration or mapped byte left, the class
# and device node gone.
set -e
sync
umount /mnt 2>/dev/null || true
sys=/sys/class/phxfs/phxfs_dev0
n=$(cat $sys/registrations)
[ "$n" = 0 ] || { echo "registrations $n before rmmod"; exit 1; }
b=$(cat $sys/mapped_bytes)
[ "$b" = 0 ] || { echo "mapped_bytes $b before rmmod"; exit 1; }
echo "check ok: no registration left, mapped_bytes 0"
rmmod phxfs
[ ! -e /sys/class/phxfs ] || { echo "/sys/class/phxfs still there"; exit 1; }
[ ! -e /dev/phxfs_dev0 ] || { echo "/dev/phxfs_dev0 still there"; exit 1; }
grep -q phxfs /proc/iomem && { echo "phxfs still in /proc/iomem"; exit 1; }
echo "check ok: rmmod phxfs, device node, class and BAR region released"
# no FUSE mount or /dev/fuse descriptor outlived phxmount
if grep -q " fuse" /proc/mounts; then
	grep " fuse" /proc/mounts
	echo "a FUSE mount is left"
	exit 1
fi
rmmod fuse || { echo "rmmod fuse failed: a FUSE connection is still open"; exit 1; }
echo "check ok: rmmod fuse"

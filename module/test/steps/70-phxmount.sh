# phxmount inside the VM (fuse.ko and phxfs.ko loaded). For now: doctor
# sees the module and /dev/fuse. Next: mount, GPU-direct ioctl read into
# the BAR (a PHXFS-LANDED line for the host check).
if [ ! -x /bin/phxmount ]; then
	echo "no phxmount binary"
	exit 0
fi
out=$(/bin/phxmount doctor 2>&1)
echo "$out"
echo "$out" | grep -q '^ok.*/dev/fuse' || { echo "doctor: /dev/fuse not ok"; exit 1; }
echo "check ok: phxmount doctor: /dev/fuse ok"
echo "$out" | grep -q '^ok.*phxfs kernel module' || { echo "doctor: phxfs module not ok"; exit 1; }
echo "check ok: phxmount doctor: phxfs kernel module ok"

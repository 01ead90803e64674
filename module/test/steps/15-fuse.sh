# Load fuse.ko (a module in the cloud kernel) for the phxmount steps.
set -e
insmod /lib/modules/fuse.ko
[ -c /dev/fuse ] || { echo "/dev/fuse missing"; exit 1; }
echo "check ok: insmod fuse.ko, /dev/fuse present"

# Load phxfs.ko; check the device node and its sysfs attributes.
set -e
ok() { echo "check ok: $*"; }

ivshmem=""
for d in /sys/bus/pci/devices/*; do
	if [ "$(cat $d/vendor)" = 0x1af4 ] && [ "$(cat $d/device)" = 0x1110 ]; then
		ivshmem=$(basename $d)
		break
	fi
done
[ -n "$ivshmem" ] || { echo "no ivshmem device"; exit 1; }

# device 1: reserved RAM (the kernel runs with memmap=128M$0x40000000)
insmod /lib/modules/phxfs.ko emu_ram=128M@0x40000000
ok "insmod phxfs.ko emu_ram=128M@0x40000000"
[ -c /dev/phxfs_dev0 ] || { echo "/dev/phxfs_dev0 missing"; exit 1; }
ok "/dev/phxfs_dev0 is a character device (minor $(stat -c %T /dev/phxfs_dev0))"
sys=/sys/class/phxfs/phxfs_dev0
[ "$(cat $sys/pci_address)" = "$ivshmem" ] || { echo "pci_address $(cat $sys/pci_address), want $ivshmem"; exit 1; }
ok "pci_address is $ivshmem"
[ "$(cat $sys/backend)" = emu ] || { echo "backend $(cat $sys/backend)"; exit 1; }
[ "$(cat $sys/registrations)" = 0 ] || { echo "registrations $(cat $sys/registrations)"; exit 1; }
[ "$(cat $sys/devaddr_base)" = 0x100000000000 ] || { echo "devaddr_base $(cat $sys/devaddr_base)"; exit 1; }
ok "backend emu, devaddr_base $(cat $sys/devaddr_base), mem_size $(cat $sys/mem_size), $(cat $sys/page_type) pages"
[ "$(readlink /sys/bus/pci/devices/$ivshmem/driver)" != "" ] && ok "ivshmem bound to $(basename $(readlink /sys/bus/pci/devices/$ivshmem/driver))"
grep phxfs /proc/iomem | sed 's/^/iomem: /'
sys1=/sys/class/phxfs/phxfs_dev1
[ -c /dev/phxfs_dev1 ] || { echo "/dev/phxfs_dev1 (reserved RAM) missing"; exit 1; }
[ "$(cat $sys1/pci_address)" = none ] && [ "$(cat $sys1/mem_size)" = 134217728 ] ||
	{ echo "phxfs_dev1: pci_address $(cat $sys1/pci_address), mem_size $(cat $sys1/mem_size)"; exit 1; }
ok "phxfs_dev1 over reserved RAM: no PCI address, 128 MiB, devaddr_base $(cat $sys1/devaddr_base)"

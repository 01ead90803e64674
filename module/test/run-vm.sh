#!/bin/bash
# module-test (tier 3): the phxfs kernel module, for real, in a QEMU VM.
#
# Builds phxfs.ko (emu backend; the nvidia backend is compile-checked) for
# Debian bookworm's cloud kernel, boots that kernel under TCG with an
# emulated NVMe disk and an ivshmem-plain device whose BAR stands in for GPU
# memory, runs module/test/steps/*.sh inside (Go tests, O_DIRECT/io_uring
# reads from NVMe into device pages, phxmount over the disk and over an NFS
# export of it served by the VM's own nfsd, rmmod), then checks FROM THE HOST that
# the bytes landed in the BAR's backing file under /dev/shm.
#
# Works from a fresh Debian 12 machine as root: installs what it needs.
# Downloads and build products are cached under module/test/work/.
# Prints one line "module-test: PASS (N checks) ..." or "module-test: FAIL: ...".
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TEST=$ROOT/module/test
WORK=$TEST/work
START=$(date +%s)
BAR_SIZE=${PHX_VM_BAR_SIZE:-4G}        # > 2 GiB: one registration spans it
VM_TIMEOUT=${PHX_VM_TIMEOUT:-420}       # seconds for the whole boot
SHM=/dev/shm/phxfs-vm-bar.$$
QEMU_PID=

log() { echo "module-test: $*"; }
fail() {
	echo "module-test: FAIL: $* ($(($(date +%s) - START)) s)"
	exit 1
}
cleanup() {
	if [ -n "$QEMU_PID" ]; then kill "$QEMU_PID" 2>/dev/null || true; fi
	rm -f "$SHM"
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || fail "must run as root (apt-get, /dev/shm)"
mkdir -p "$WORK"

# --- packages -------------------------------------------------------------
export DEBIAN_FRONTEND=noninteractive
apt_updated=
apt_update() {
	[ -n "$apt_updated" ] && return
	log "apt-get update"
	apt-get update -qq >"$WORK/apt.log" 2>&1 || fail "apt-get update (see $WORK/apt.log)"
	apt_updated=1
}
meta_kver() {
	apt-cache show --no-all-versions linux-headers-cloud-amd64 2>/dev/null |
		sed -n 's/^Depends:.*linux-headers-\([0-9][^ ,]*-cloud-amd64\).*/\1/p' | head -n1
}
KVER=$(meta_kver || true)
if [ -z "$KVER" ]; then
	apt_update
	KVER=$(meta_kver || true)
fi
[ -n "$KVER" ] || fail "cannot derive the kernel ABI from linux-headers-cloud-amd64's Depends"
KDIR=/usr/src/linux-headers-$KVER

need=()
for p in "linux-headers-$KVER" gcc-12 make qemu-system-x86 busybox-static e2fsprogs cpio; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	apt_update
	log "apt-get install ${need[*]}"
	apt-get install -y -qq --no-install-recommends "${need[@]}" >>"$WORK/apt.log" 2>&1 ||
		fail "apt-get install ${need[*]} (see $WORK/apt.log)"
fi
command -v go >/dev/null || fail "go not found in PATH"

# --- the kernel: ./boot, fuse.ko and the NFS modules out of linux-image-$KVER
# (NFS client and server are modules there: 80-nfs.sh runs nfsd and mounts
# its export in the VM)
KERNEL=$WORK/kernel/$KVER
NFS_MODS="net/sunrpc/sunrpc fs/nfs_common/grace fs/lockd/lockd fs/nfs_common/nfs_acl net/sunrpc/auth_gss/auth_rpcgss
	fs/nfsd/nfsd fs/netfs/netfs fs/fscache/fscache fs/nfs/nfs net/dns_resolver/dns_resolver fs/nfs/nfsv4"
if [ ! -f "$KERNEL/vmlinuz" ] || [ ! -f "$KERNEL/fuse.ko" ] || [ ! -f "$KERNEL/nfs/nfsv4.ko" ]; then
	mkdir -p "$WORK/debs" "$KERNEL"
	if ! ls "$WORK/debs/linux-image-${KVER}_"*.deb >/dev/null 2>&1; then
		apt_update
		log "apt-get download linux-image-$KVER"
		(cd "$WORK/debs" && apt-get download -qq "linux-image-$KVER" >>"$WORK/apt.log" 2>&1) ||
			fail "apt-get download linux-image-$KVER (see $WORK/apt.log)"
	fi
	deb=$(ls "$WORK/debs/linux-image-${KVER}_"*.deb | head -n1)
	tmp=$WORK/kernel/extract
	rm -rf "$tmp" && mkdir -p "$tmp"
	globs=(./boot "./lib/modules/$KVER/kernel/fs/fuse/fuse.ko*")
	for m in $NFS_MODS; do globs+=("./lib/modules/$KVER/kernel/$m.ko*"); done
	dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" --wildcards "${globs[@]}"
	cp "$tmp/boot/vmlinuz-$KVER" "$KERNEL/vmlinuz"
	unpack_ko() { # path-without-.ko destination
		local ko
		ko=$(ls "$tmp/lib/modules/$KVER/kernel/$1".ko* | head -n1)
		case "$ko" in
		*.xz) xz -dc "$ko" >"$2" ;;
		*.zst) zstd -qdc "$ko" >"$2" ;;
		*) cp "$ko" "$2" ;;
		esac
	}
	unpack_ko fs/fuse/fuse "$KERNEL/fuse.ko"
	mkdir -p "$KERNEL/nfs"
	for m in $NFS_MODS; do unpack_ko "$m" "$KERNEL/nfs/$(basename "$m").ko"; done
	rm -rf "$tmp"
fi

# --- the module -----------------------------------------------------------
BUILD=$WORK/build
build_module() { # vendor dir [kdir [make args...]]
	local vendor=$1 dir=$2 kdir=${3:-$KDIR}
	shift 3 || shift $#
	rm -rf "$dir" && mkdir -p "$dir"
	cp -r "$ROOT"/module/*.c "$ROOT"/module/*.h "$ROOT"/module/Makefile "$ROOT"/module/include "$dir/"
	make -s -C "$dir" KDIR="$kdir" CC=gcc-12 PHXFS_VENDOR="$vendor" KCFLAGS=-Werror W=1 "$@" >"$dir/build.log" 2>&1 ||
		{ cat "$dir/build.log"; fail "building phxfs.ko (PHXFS_VENDOR=$vendor, $kdir)"; }
	if grep -E "warning:|error:" "$dir/build.log" | grep -v -E "Skipping BTF|modpost: \"pci_(alloc|free)_p2pmem\"|modpost: \"pci_p2pdma_add_resource\"" >/dev/null; then
		cat "$dir/build.log"
		fail "phxfs.ko (PHXFS_VENDOR=$vendor) builds with warnings"
	fi
}
log "building phxfs.ko for $KVER (emu; compile checks: nvidia, CONFIG_PCI_P2PDMA)"
build_module emu "$BUILD/emu"
build_module nvidia "$BUILD/nvidia"
# The P2PDMA branch: the same headers with CONFIG_PCI_P2PDMA switched on,
# compiled only (this kernel does not export the P2PDMA functions).
P2PK=$WORK/headers-p2pdma
rm -rf "$P2PK" && cp -a "$KDIR" "$P2PK"
find "$KDIR" -maxdepth 1 -type l | while read -r l; do # relative links: re-aim them
	ln -sfn "$(readlink -f "$l")" "$P2PK/$(basename "$l")"
done
echo '#define CONFIG_PCI_P2PDMA 1' >>"$P2PK/include/generated/autoconf.h"
sed -i 's/^# CONFIG_PCI_P2PDMA is not set/CONFIG_PCI_P2PDMA=y/' "$P2PK/include/config/auto.conf" "$P2PK/.config"
build_module emu "$BUILD/p2pdma" "$P2PK" KBUILD_MODPOST_WARN=1
checks=3

# for_each_pci_dev() holds a reference on the current device: a loop left
# early (break, goto, return) must drop it with pci_dev_put() first. The
# nvidia backend cannot run here, so this is checked in the source.
pci_loop_leaks() {
	awk '
	{ code = $0; sub(/\/\*.*/, "", code); if (code ~ /^[[:space:]]*\*/) code = "" }
	code ~ /for_each_pci_dev[[:space:]]*\(/ { inloop = 1; depth = 0; opened = 0 }
	inloop {
		if (code ~ /(^|[^A-Za-z0-9_])(break|goto|return)([^A-Za-z0-9_]|$)/ &&
		    prev !~ /pci_dev_put[[:space:]]*\(/ && code !~ /pci_dev_put[[:space:]]*\(/)
			print FILENAME ":" FNR ": leaves for_each_pci_dev without pci_dev_put: " $0
		n = gsub(/\{/, "{", code); c = gsub(/\}/, "}", code)
		depth += n - c
		if (n) opened = 1
		if (opened && depth <= 0) inloop = 0
	}
	code !~ /^[[:space:]]*$/ { prev = code }
	' "$@"
}
leaks=$(pci_loop_leaks "$ROOT"/module/*.c)
[ -z "$leaks" ] || fail "PCI device reference leak: $leaks"
log "check ok: every for_each_pci_dev loop left early drops its reference"
checks=$((checks + 1))

# --- the Go programs (static) ---------------------------------------------
ROOTFS=$WORK/rootfs
rm -rf "$ROOTFS" && mkdir -p "$ROOTFS"/{bin,sbin,proc,sys,dev,tmp,mnt,steps,lib/modules,t}
GOFLAGS_VM=(-trimpath)
export CGO_ENABLED=0
(cd "$ROOT" && go build "${GOFLAGS_VM[@]}" -o "$ROOTFS/bin/vmcheck" ./module/test/vmcheck) ||
	fail "go build ./module/test/vmcheck"
# the application side of step 70-phxmount (ioctls through the mount)
(cd "$ROOT" && go build "${GOFLAGS_VM[@]}" -o "$ROOTFS/bin/vmclient" ./module/test/vmclient) ||
	fail "go build ./module/test/vmclient"
# the NFS step's helper (mount(2) of NFSv4, user.phx.info, the staleness rule)
(cd "$ROOT" && go build "${GOFLAGS_VM[@]}" -o "$ROOTFS/bin/vmnfs" ./module/test/vmnfs) ||
	fail "go build ./module/test/vmnfs"
# phxmount itself, for the steps that mount inside the VM
if [ -d "$ROOT/cmd/phxmount" ]; then
	(cd "$ROOT" && go build "${GOFLAGS_VM[@]}" -o "$ROOTFS/bin/phxmount" ./cmd/phxmount) ||
		fail "go build ./cmd/phxmount"
fi
for pkg in kmod connector/pcibar phxfs; do
	[ -d "$ROOT/$pkg" ] || continue
	ls "$ROOT/$pkg"/*_test.go >/dev/null 2>&1 || continue
	# phxfs's suites run here once they can pick the pcibar connector
	if [ "$pkg" = phxfs ] && ! grep -qs "connector/pcibar" "$ROOT/$pkg"/*_test.go; then
		log "phxfs tests do not use connector/pcibar yet: step 50-phxfs skips"
		continue
	fi
	name=$(echo "$pkg" | tr / _)
	(cd "$ROOT" && go test -c "${GOFLAGS_VM[@]}" -o "$ROOTFS/t/$name.test" "./$pkg") ||
		fail "go test -c ./$pkg"
done

# binaries that load libraries at run time (purego: the nvidia connector)
# are dynamically linked even without cgo: bring their libraries along
for bin in "$ROOTFS"/bin/* "$ROOTFS"/t/*.test; do
	[ -e "$bin" ] || continue
	libs=$(ldd "$bin" 2>/dev/null | grep -o '/[^ ]*' || true)
	for lib in $libs; do
		[ -e "$ROOTFS$lib" ] && continue
		mkdir -p "$ROOTFS$(dirname "$lib")"
		cp -L "$lib" "$ROOTFS$lib"
	done
done

# --- the disk: ext4 with a pattern file (8-byte LE words = their offset) --
DISK=$WORK/disk.img
DISK_VERSION="pattern.bin 64M, ext4 256M, v1"
if [ ! -f "$DISK" ] || [ "$(cat "$DISK.version" 2>/dev/null)" != "$DISK_VERSION" ]; then
	rm -rf "$WORK/diskroot" && mkdir -p "$WORK/diskroot"
	"$ROOTFS/bin/vmcheck" pattern "$WORK/diskroot/pattern.bin" $((64 << 20)) || fail "pattern file"
	mkfs.ext4 -q -F -d "$WORK/diskroot" "$DISK" 256M >/dev/null || fail "mkfs.ext4"
	rm -rf "$WORK/diskroot"
	echo "$DISK_VERSION" >"$DISK.version"
fi

# --- the initramfs ----------------------------------------------------------
cp "$(command -v busybox)" "$ROOTFS/bin/busybox"
cp "$BUILD/emu/phxfs.ko" "$KERNEL/fuse.ko" "$ROOTFS/lib/modules/"
cp -r "$KERNEL/nfs" "$ROOTFS/lib/modules/nfs"
cp "$TEST"/steps/*.sh "$ROOTFS/steps/"
mkdir -p "$ROOTFS/etc/udev/rules.d" # steps/65-owner.sh applies the rule's GROUP and MODE
cp "$ROOT/packaging/udev/70-phxfs.rules" "$ROOTFS/etc/udev/rules.d/"
cp "$TEST/init" "$ROOTFS/init"
chmod +x "$ROOTFS/init" "$ROOTFS"/steps/*.sh
(cd "$ROOTFS" && find . | cpio -o -H newc --quiet) >"$WORK/initramfs.cpio" || fail "cpio"

# --- boot -------------------------------------------------------------------
rm -f "$SHM"
truncate -s "$BAR_SIZE" "$SHM"
CONSOLE=$WORK/console.log
log "booting $KVER (TCG), ivshmem BAR $BAR_SIZE at $SHM"
set +e
timeout --kill-after=10 "$VM_TIMEOUT" qemu-system-x86_64 \
	-accel tcg -cpu max -smp 1 -m 2G -nographic -no-reboot -nic none -vga none \
	-kernel "$KERNEL/vmlinuz" -initrd "$WORK/initramfs.cpio" \
	-append "console=ttyS0 quiet oops=panic panic=-1 memmap=128M\$0x40000000" \
	-drive file="$DISK",if=none,id=nvm,format=raw,cache=none,aio=threads \
	-device nvme,serial=phxfs0,drive=nvm \
	-object memory-backend-file,id=bar,size="$BAR_SIZE",share=on,mem-path="$SHM" \
	-device ivshmem-plain,memdev=bar \
	</dev/null >"$CONSOLE" 2>&1 &
QEMU_PID=$!
wait "$QEMU_PID"
qrc=$?
QEMU_PID=
set -e
tr -d '\r' <"$CONSOLE" >"$CONSOLE.txt"
mv "$CONSOLE.txt" "$CONSOLE"

# --- judge ------------------------------------------------------------------
show_tail() { echo "----- last lines of $CONSOLE -----"; tail -n 60 "$CONSOLE"; echo "-----"; }
[ "$qrc" = 124 ] || [ "$qrc" = 137 ] && { show_tail; fail "VM timed out after $VM_TIMEOUT s"; }
if grep -E "BUG:|WARNING:|Oops:|Call Trace:|Kernel panic" "$CONSOLE" >/dev/null; then
	grep -n -E -A20 "BUG:|WARNING:|Oops:|Call Trace:|Kernel panic" "$CONSOLE" | head -n 80
	fail "the kernel reported a bug or warning (see $CONSOLE)"
fi
if ! grep -q "^PHXFS-VM: PASS" "$CONSOLE"; then
	show_tail
	fail "$(grep "^PHXFS-VM: FAIL" "$CONSOLE" || echo "no result marker from /init (qemu exit $qrc)")"
fi
vm_checks=$(sed -n 's/^PHXFS-VM: PASS \([0-9]*\) checks.*/\1/p' "$CONSOLE")
checks=$((checks + vm_checks))

# the bytes, from the host side: every range the VM says it landed in the BAR
landed=$(grep -c "^PHXFS-LANDED " "$CONSOLE" || true)
[ "$landed" -gt 0 ] || fail "the VM reported no landed range"
grep "^PHXFS-LANDED " "$CONSOLE" | while read -r _ baroff fileoff len; do
	"$ROOTFS/bin/vmcheck" verify "$SHM" "$baroff" "$fileoff" "$len" ||
		fail "host check of BAR $baroff+$len (file offset $fileoff)"
done || exit 1
checks=$((checks + landed))

echo "module-test: PASS ($checks checks, $landed ranges verified from the host in the BAR, kernel $KVER, $(($(date +%s) - START)) s)"

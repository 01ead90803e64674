# phxmount inside the VM (fuse.ko and phxfs.ko loaded): doctor, then
# `phxmount --vendor pcibar` over the NVMe disk's root (which holds
# pattern.bin) and a separate client process (vmclient) that registers a
# BAR range through the mount and lands file bytes in it with READ and
# BATCH_READ ioctls. Its PHXFS-LANDED lines are checked by the host in the
# BAR's backing file. Then SIGTERM: the daemon unmounts and releases all.
set -eu
ok() { echo "check ok: $*"; }
die() {
	echo "70-phxmount: FAIL: $*"
	exit 1
}

[ -x /bin/phxmount ] || die "no /bin/phxmount"
[ -x /bin/vmclient ] || die "no /bin/vmclient"

out=$(/bin/phxmount doctor 2>&1) || die "phxmount doctor exited $?: $out"
echo "$out"
echo "$out" | grep -q '^ok.*/dev/fuse' || die "doctor: /dev/fuse not ok"
ok "phxmount doctor: /dev/fuse ok"
echo "$out" | grep -q '^ok.*phxfs kernel module' || die "doctor: phxfs module not ok"
ok "phxmount doctor: phxfs kernel module ok"
echo "$out" | grep -q '^->.*transport.*kmod (--vendor pcibar)' ||
	die "doctor: no 'kmod (--vendor pcibar)' transport line"
ok "phxmount doctor: --vendor pcibar gets the kmod transport"

sys=/sys/class/phxfs/phxfs_dev0
attrs() { echo "registrations $(cat $sys/registrations), mapped_bytes $(cat $sys/mapped_bytes)"; }
[ "$(attrs)" = "registrations 0, mapped_bytes 0" ] || die "before mounting: $(attrs)"

BACKING=/mnt MNT=/phx LOG=/tmp/phxmount.log
mkdir -p $MNT
mounted() { grep -q " $MNT fuse" /proc/mounts; }
/bin/phxmount --vendor pcibar --log-level info $BACKING $MNT >$LOG 2>&1 &
pid=$!
showlog() { echo "----- phxmount log -----"; cat $LOG; echo "-----"; }
stop() { # on failure: take the daemon down so later steps can run
	if kill -0 $pid 2>/dev/null; then
		kill -TERM $pid 2>/dev/null || true
		wait $pid 2>/dev/null || true
	fi
	umount $MNT 2>/dev/null || true
}
i=0
until mounted; do
	kill -0 $pid 2>/dev/null || { showlog; wait $pid || true; die "phxmount exited before mounting"; }
	i=$((i + 1))
	[ $i -le 300 ] || { showlog; stop; die "$MNT not mounted after 30 s"; }
	sleep 0.1
done
ok "phxmount --vendor pcibar $BACKING $MNT mounted ($(grep " $MNT " /proc/mounts | cut -d' ' -f1,3))"
cmp -s /mnt/pattern.bin $MNT/pattern.bin || { showlog; stop; die "$MNT/pattern.bin differs from the backing file"; }
ok "pattern.bin reads the same through the mount"

if ! /bin/vmclient $MNT $MNT/pattern.bin; then
	showlog
	stop
	die "vmclient failed"
fi
[ "$(attrs)" = "registrations 0, mapped_bytes 0" ] || { showlog; stop; die "after vmclient: $(attrs)"; }
ok "after the client: $(attrs)"

kill -TERM $pid
rc=0
wait $pid || rc=$?
showlog
[ $rc = 0 ] || die "phxmount exited $rc after SIGTERM"
ok "SIGTERM: phxmount exited 0"
if grep -q " fuse" /proc/mounts; then
	grep " fuse" /proc/mounts
	die "a FUSE mount is left"
fi
ok "nothing left mounted"
grep -q 'transport kmod' $LOG || die "the daemon did not log the registration's transport"
ok "the daemon logged the registration with transport kmod"
if grep -E 'level=(error|fatal|panic)' $LOG; then
	die "the daemon logged errors"
fi
[ "$(attrs)" = "registrations 0, mapped_bytes 0" ] || die "after unmount: $(attrs)"
ok "after unmount: $(attrs)"

# phxmount over NFS: the kernel's nfsd exports the NVMe disk (ext4 on
# /mnt, which holds pattern.bin), the VM mounts the export over NFSv4.2 on
# loopback at /nfs, and phxmount --vendor pcibar serves /nfs at /phxnfs.
# Checked there: cache=auto says the backing is a network file system and
# revalidates; unmodified tools (busybox cp, tar, cmp, md5sum, ls, find,
# mv, ln, chmod, rm) through the mount, compared with the server side; the
# ioctl path (REGISTER, READ and BATCH_READ landing file bytes in the BAR,
# checked again by the host); and the staleness rule: a change made on the
# server side shows through the mount within 2 s (README, "Cluster
# deployment"). Then everything is taken down for 90-rmmod.
set -eu
ok() { echo "check ok: $*"; }
die() {
	echo "80-nfs: FAIL: $*"
	[ -f /tmp/phxnfs.log ] && { echo "----- phxmount log -----"; cat /tmp/phxnfs.log; }
	dmesg | tail -n 30
	exit 1
}
EXPORT=/mnt NFS=/nfs MNT=/phxnfs LOG=/tmp/phxnfs.log BOUND_MS=2000

# --- the server: nfsd, NFSv4 only (no rpcbind, lockd or mountd needed) ---
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
hostname phxvm
for m in sunrpc grace lockd nfs_acl auth_rpcgss nfsd netfs fscache nfs dns_resolver nfsv4; do
	insmod /lib/modules/nfs/$m.ko || die "insmod $m.ko"
done
ok "insmod the NFS server and client modules (sunrpc ... nfsd, nfs, nfsv4)"
# No delegations: a server-side write then never waits for a recall.
echo 0 >/proc/sys/fs/leases-enable
mkdir -p /proc/fs/nfsd
mount -t nfsd nfsd /proc/fs/nfsd
echo "-3 +4 +4.1 +4.2" >/proc/fs/nfsd/versions || die "nfsd versions"
# The export table, as rpc.mountd would answer the kernel's upcalls: the
# client 127.0.0.1 is in domain "phxvm"; its NFSv4 root (fsid 0) is /mnt,
# read-write, no root squashing (flags: fsid 0x2000 | no_subtree_check
# 0x400 | insecure 0x2).
never=2147483647
printf 'nfsd 127.0.0.1 %s phxvm\n' $never >/proc/net/rpc/auth.unix.ip/channel || die "auth.unix.ip"
printf 'phxvm %s %s %s 65534 65534 0\n' $EXPORT $never $((0x2402)) >/proc/net/rpc/nfsd.export/channel || die "nfsd.export"
printf 'phxvm 1 \\x00000000 %s %s\n' $never $EXPORT >/proc/net/rpc/nfsd.fh/channel || die "nfsd.fh"
# The grace period (opens wait it out) at its shortest; ended at once
# where the kernel lets us.
echo 10 >/proc/fs/nfsd/nfsv4gracetime || die "nfsv4gracetime"
echo 10 >/proc/fs/nfsd/nfsv4leasetime || die "nfsv4leasetime"
echo "tcp 2049" >/proc/fs/nfsd/portlist || die "nfsd portlist"
echo 2 >/proc/fs/nfsd/threads || die "nfsd threads"
echo Y >/proc/fs/nfsd/v4_end_grace 2>/dev/null || echo "80-nfs: the grace period runs its 10 s"
ok "nfsd serves $EXPORT over NFSv4 on 127.0.0.1:2049 ($(cat /proc/fs/nfsd/threads) threads, versions $(cat /proc/fs/nfsd/versions))"

# --- the client ---------------------------------------------------------
mkdir -p $NFS
/bin/vmnfs mount 127.0.0.1:/ $NFS vers=4.2,addr=127.0.0.1,clientaddr=127.0.0.1 || die "NFS mount"
cmp -s $EXPORT/pattern.bin $NFS/pattern.bin || die "pattern.bin differs over NFS"
ok "pattern.bin reads the same over NFS"

# --- phxmount over NFS ----------------------------------------------------
mkdir -p $MNT
/bin/phxmount --vendor pcibar --log-level info $NFS $MNT >$LOG 2>&1 &
pid=$!
stop() {
	if kill -0 $pid 2>/dev/null; then
		kill -TERM $pid
		wait $pid || true
	fi
	umount $MNT 2>/dev/null || true
}
i=0
until grep -q " $MNT fuse" /proc/mounts; do
	kill -0 $pid 2>/dev/null || die "phxmount exited before mounting"
	i=$((i + 1))
	[ $i -le 300 ] || { stop; die "$MNT not mounted after 30 s"; }
	sleep 0.1
done
ok "phxmount --vendor pcibar $NFS $MNT mounted"
grep -q 'cache=auto on nfs: nfs is shared with other machines' $LOG || { stop; die "the log does not say that the NFS backing is revalidated"; }
ok "the daemon logged: $(grep -o 'cache=auto on nfs: [^"]*' $LOG | head -1)"
info=$(/bin/vmnfs info $MNT/pattern.bin) || { stop; die "user.phx.info"; }
echo "$info" | grep -q '^cache=revalidate$' || { stop; die "user.phx.info on NFS: no cache=revalidate: $info"; }
echo "$info" | grep -q '^cache_network=true$' || { stop; die "user.phx.info on NFS: no cache_network=true"; }
ok "user.phx.info on an NFS file: cache=revalidate, cache_fs=nfs, cache_network=true"

# --- unmodified tools through the mount, compared with the server side ----
T=$MNT/tools S=$EXPORT/tools
rm -rf $S
mkdir -p $T/a/b
dd if=$MNT/pattern.bin of=$T/a/chunk bs=65536 count=64 2>/dev/null
echo "hello over nfs" >$T/a/b/hello
ln -s ../a/b/hello $T/a/link
cp -a $T/a $T/copy
chmod 0750 $T/copy/b
mv $T/copy/chunk $T/copy/moved
ln $T/copy/moved $T/copy/hard
[ "$(readlink $T/a/link)" = ../a/b/hello ] || { stop; die "symlink target through the mount"; }
(cd $MNT && tar -cf /tmp/tools.tar tools) || { stop; die "tar -c through the mount"; }
mkdir -p /tmp/untar && tar -xf /tmp/tools.tar -C /tmp/untar || { stop; die "tar -x"; }
for side in $T $S /tmp/untar/tools; do
	(cd $side && find . | sort | while read -r f; do
		if [ -f "$f" ] && [ ! -L "$f" ]; then echo "$f $(md5sum <"$f" | cut -c1-32)"; else echo "$f"; fi
	done) >/tmp/tree.$(echo $side | tr / _)
done
cmp -s /tmp/tree._phxnfs_tools /tmp/tree._mnt_tools || { stop; diff /tmp/tree._phxnfs_tools /tmp/tree._mnt_tools; die "the tree through the mount differs from the server side"; }
cmp -s /tmp/tree._phxnfs_tools /tmp/tree._tmp_untar_tools || { stop; die "tar round trip differs"; }
ok "mkdir, dd, echo, ln -s, cp -a, chmod, mv, ln, tar -c/-x through the mount: $(wc -l </tmp/tree._mnt_tools) entries, names and bytes as on the server side"
[ "$(stat -c '%i %s %a %h' $T/copy/moved)" = "$(stat -c '%i %s %a %h' $S/copy/moved)" ] || { stop; die "stat through the mount differs from the server side"; }
[ "$(stat -c %h $T/copy/moved)" = 2 ] || { stop; die "hard link count"; }
ok "stat through the mount reports the server's inode number, size, mode and link count"
if ! rm -r $T; then
	ls -laR $S
	ls -l /proc/$pid/fd | grep -v -e socket -e pipe -e anon_inode
	stop
	die "rm -r through the mount"
fi
[ ! -e $S ] || { stop; die "rm -r through the mount left $S on the server"; }
ok "rm -r through the mount"

# --- the ioctl path: READ and BATCH_READ into the BAR ----------------------
/bin/vmclient --nfs $MNT $MNT/pattern.bin || { stop; die "vmclient over NFS failed"; }

# --- the staleness rule ------------------------------------------------------
/bin/vmnfs stale $EXPORT $MNT $BOUND_MS || { stop; die "staleness"; }

# --- down ----------------------------------------------------------------------
kill -TERM $pid
rc=0
wait $pid || rc=$?
[ $rc = 0 ] || die "phxmount exited $rc after SIGTERM"
grep -q " $MNT " /proc/mounts && die "$MNT still mounted"
grep -E 'level=(error|fatal|panic)' $LOG && die "the daemon logged errors"
ok "phxmount over NFS exited 0 on SIGTERM, no errors logged"
umount $NFS || die "umount $NFS"
echo 0 >/proc/fs/nfsd/threads
date +%s >/proc/net/rpc/nfsd.export/flush
date +%s >/proc/net/rpc/nfsd.fh/flush
umount /proc/fs/nfsd
ok "NFS unmounted, nfsd stopped, exports flushed"

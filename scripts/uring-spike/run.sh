#!/bin/bash
# Mounts the loopback twice (B/mdev over /dev/fuse, B/mur over io_uring) next to the native
# B/native, runs "$@", then unmounts (aborting a stuck connection) and sets enable_uring back
# to N whatever happened. enable_uring is Y only while the ring mount sends INIT: a connection
# that negotiated the flag keeps it. Root only. Example, from this directory:
#   go build -o uring-spike . && ./run.sh ./uring-spike bench -dirs native=/tmp/spk/native,dev=/tmp/spk/mdev,uring=/tmp/spk/mur
# DEVFLAGS and URFLAGS add serve flags (-nodp, -idle) to the two daemons.
B=${B:-/tmp/spk}; S=${SPIKE:-$(dirname "$0")/uring-spike}
restore() {
  echo N > /sys/module/fuse/parameters/enable_uring
  for p in $DEVPID $URPID; do kill -TERM "$p" 2>/dev/null; done
  sleep 1
  for m in $B/mdev $B/mur; do
    if grep -q " $m " /proc/mounts; then
      n=$(awk -v m="$m" '$5==m{split($3,a,":");print a[2]}' /proc/self/mountinfo)
      [ -n "$n" ] && echo 1 > "/sys/fs/fuse/connections/$n/abort" 2>/dev/null
      umount -l "$m"; echo "forced unmount $m"
    fi
  done
  echo "enable_uring=$(cat /sys/module/fuse/parameters/enable_uring)"
}
trap restore EXIT
grep -q fusectl /proc/mounts || mount -t fusectl none /sys/fs/fuse/connections
rm -rf "$B/native" "$B/sdev" "$B/sur"; mkdir -p "$B/native" "$B/sdev" "$B/sur" "$B/mdev" "$B/mur"
timeout 3000 "$S" serve $DEVFLAGS -mode dev -src "$B/sdev" -mnt "$B/mdev" > "$B/dev.log" 2>&1 & DEVPID=$!
echo Y > /sys/module/fuse/parameters/enable_uring
timeout 3000 "$S" serve -mode uring -src "$B/sur" -mnt "$B/mur" $URFLAGS > "$B/ur.log" 2>&1 & URPID=$!
for i in $(seq 100); do grep -q ready "$B/ur.log" && break; sleep 0.1; done
echo N > /sys/module/fuse/parameters/enable_uring
cat "$B/ur.log"
for i in $(seq 100); do grep -q ready "$B/dev.log" && break; sleep 0.1; done
cat "$B/dev.log"
"$@"

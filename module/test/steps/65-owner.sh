# The owner rule: the device nodes as the udev rule (packaging/udev/
# 70-phxfs.rules, copied to /etc/udev/rules.d) makes them, group and
# mode taken from the rule; users 1001 and 1002 in that group (gid 900).
# vmcheck owner then checks that one user's registration is refused to
# the other (EACCES, no byte shown), allowed to root (CAP_SYS_RAWIO) and
# the same user's other processes; it lands bytes the host checks.
set -eu
rule=/etc/udev/rules.d/70-phxfs.rules
line=$(grep '^SUBSYSTEM=="phxfs"' $rule) || { echo "no phxfs line in $rule"; exit 1; }
group=$(echo "$line" | sed -n 's/.*GROUP="\([^"]*\)".*/\1/p')
mode=$(echo "$line" | sed -n 's/.*MODE="\([0-7]*\)".*/\1/p')
[ -n "$group" ] && [ -n "$mode" ] || { echo "$rule: no GROUP or MODE: $line"; exit 1; }
echo "$group:x:900:phxa,phxb" >/etc/group
chgrp 900 /dev/phxfs_dev*
chmod "$mode" /dev/phxfs_dev*
echo "check ok: /dev/phxfs_dev* given to the group $group, mode $mode, as $rule says"
/bin/vmcheck owner /mnt/pattern.bin

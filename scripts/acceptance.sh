#!/usr/bin/env bash
# Install and operate phxmount as an operator would (issue 13's
# acceptance), as root on Debian 12, from the checkout it runs in:
#   make install DESTDIR=…; the installed phxmount --version; a mount through
#   `mount -t fuse.phxmount` with fstab-style options and one through an
#   fstab line, each serving a file byte for byte and unmounted with umount;
#   SIGHUP reopens the log and keeps the mount; pip install ./python into a
#   fresh venv; the metrics endpoint (curl) during READ ioctls, whose byte
#   counter moves by exactly the bytes read; plain go build and go vet;
#   doctor refusing --vendor nvidia without a GPU, and doctor --json; the
#   systemd unit (systemd-analyze verify) and the DKMS package (dkms build).
# .ci/run runs it after `make test` (which installs the kernel headers the
# DKMS build uses). It ends with "acceptance: N passed, 0 failed".
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
[ "$(id -u)" = 0 ] || { echo "acceptance: run as root (mount(8), /sbin's mount helper)" >&2; exit 1; }
bash scripts/deps.sh

passed=0
failed=0
ok() { echo "ok   $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*" >&2; failed=$((failed + 1)); }
check() { # check WHAT COMMAND...: one acceptance item
	local what=$1
	shift
	if "$@"; then ok "$what"; else bad "$what"; fi
}

tmp=$(mktemp -d /tmp/phx-accept.XXXXXX)
root=$tmp/root
bin=$root/usr/local/bin/phxmount
helper=/sbin/mount.fuse.phxmount
saved_helper=
backing=$tmp/backing
mnt=$tmp/mnt
log=$tmp/phxmount.log

cleanup() {
	mountpoint -q "$mnt" 2>/dev/null && umount -l "$mnt"
	if [ -n "$saved_helper" ]; then mv -f "$saved_helper" "$helper"; else rm -f "$helper"; fi
	if command -v dkms >/dev/null && [ -d "$tmp/dkms" ]; then rm -rf "$tmp/dkms"; fi
	rm -rf "$tmp"
}
trap cleanup EXIT

# The helper mount(8) runs is the installed one: /sbin is where it looks,
# so the DESTDIR copy is linked there for the test (an installed one is
# put back afterwards).
install_helper() {
	if [ -e "$helper" ] || [ -L "$helper" ]; then
		saved_helper=$tmp/saved-helper
		mv "$helper" "$saved_helper"
	fi
	ln -s "$bin" "$helper"
}

test_install() {
	make --no-print-directory install DESTDIR="$root" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; return 1; }
	local f
	for f in usr/local/bin/phxmount sbin/mount.fuse.phxmount usr/local/lib/systemd/system/phxmount@.service \
		usr/local/lib/udev/rules.d/70-phxfs.rules usr/local/lib/sysusers.d/phxmount.conf \
		usr/local/share/doc/phxmount/install.md usr/src/phxfs-*/dkms.conf usr/src/phxfs-*/phxfs-core.c; do
		compgen -G "$root/$f" >/dev/null || { echo "not installed: $f"; return 1; }
	done
	[ "$(readlink "$root/sbin/mount.fuse.phxmount")" = /usr/local/bin/phxmount ]
}

test_version() {
	local out
	out=$("$bin" --version) || return 1
	echo "$out" | sed 's/^/     /'
	grep -Eq '^phxmount v[0-9]+\.[0-9]+\.[0-9]+' <<<"$out" &&
		grep -Eq '^commit: [0-9a-f]{40}' <<<"$out" && grep -q '^go: go1\.' <<<"$out"
}

# daemon_pid prints the pid of the phxmount serving $mnt.
daemon_pid() {
	local p exe
	for p in /proc/[0-9]*; do
		exe=$(readlink "$p/exe" 2>/dev/null) || continue
		[ "$exe" = "$(readlink -f "$bin")" ] || continue
		if tr '\0' '\n' <"$p/cmdline" 2>/dev/null | grep -qxF "$mnt"; then
			echo "${p#/proc/}"
			return 0
		fi
	done
	return 1
}

# unmount_clean: umount, then the daemon exits and nothing is mounted.
unmount_clean() {
	local pid i
	pid=$(daemon_pid) || { echo "no daemon serves $mnt"; return 1; }
	umount "$mnt" || return 1
	for i in $(seq 100); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then echo "daemon $pid still runs after umount"; return 1; fi
	! mountpoint -q "$mnt"
}

test_mount_command() {
	local port=$1
	mount -t fuse.phxmount "$backing" "$mnt" \
		-o "vendor=emu,ro,nofail,_netdev,user,users,metrics=127.0.0.1:$port,log_file=$log" || return 1
	grep -q " $mnt fuse.phxmount " /proc/mounts && cmp "$backing/data.bin" "$mnt/data.bin"
}

test_sighup() {
	local pid
	pid=$(daemon_pid) || return 1
	mv "$log" "$log.1"
	kill -HUP "$pid"
	for _ in $(seq 50); do [ -s "$log" ] && break; sleep 0.1; done
	kill -0 "$pid" && mountpoint -q "$mnt" && cmp -s "$backing/data.bin" "$mnt/data.bin" &&
		grep -q "SIGHUP" "$log" && grep -q "mounted;" "$log.1"
}

test_fstab() {
	printf '%s %s fuse.phxmount vendor=emu,cache=auto,nofail,_netdev,noauto,users,x-systemd.automount,x-systemd.requires=network-online.target,comment=acceptance,log_file=%s 0 0\n' \
		"$backing" "$mnt" "$log" >"$tmp/fstab"
	mount --fstab "$tmp/fstab" "$mnt" || return 1
	cmp "$backing/data.bin" "$mnt/data.bin" && unmount_clean
}

test_bad_option() {
	local out
	if out=$(mount -t fuse.phxmount "$backing" "$mnt" -o vendor=emu,frobnicate 2>&1); then return 1; fi
	grep -q "unknown mount option -o frobnicate" <<<"$out" && ! mountpoint -q "$mnt"
}

# A fresh venv with pip, no index: pip installs ./python offline.
test_pip() {
	local py=python3
	[ -x /usr/bin/python3 ] && py=/usr/bin/python3
	"$py" -m venv "$tmp/venv" && "$tmp/venv/bin/pip" install -q --no-index --no-cache-dir ./python &&
		(cd "$tmp" && "$tmp/venv/bin/python" -c 'import phxmount; print("     phxmount", phxmount.__version__, phxmount.__file__)')
}

test_metrics() {
	local port=$1
	(cd "$tmp" && "$tmp/venv/bin/python" - "$mnt/data.bin" "http://127.0.0.1:$port/metrics") <<'EOF'
import subprocess, sys
from phxmount import abi
from phxmount.client import EmuBuffer, PhxFile

path, url = sys.argv[1:]
def scrape():
    text = subprocess.run(["curl", "-fsS", url], capture_output=True, text=True, check=True).stdout
    vals = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, v = line.rpartition(" ")
            vals[name] = float(v)
    return vals
size = 3 << 20
buf = EmuBuffer(size)
with PhxFile(path) as f:
    r = f.register(abi.VENDOR_EMU, 0, buf.handle(), buf.size)
    before = scrape()
    got = f.read(r.id, 0, size, 12345) + f.read(r.id, 0, 4096, 77)
    after = scrape()
key = "phxmount_ioctl_bytes_read_total"
moved = after[key] - before[key]
reads = [k for k in after if k.startswith('phxmount_ioctl_duration_seconds_count{command="read"')]
print(f"     READ moved {got} bytes; {key} moved by {moved:.0f}; histogram {reads}")
assert got == size + 4096 and moved == got, (got, moved)
assert reads and after[reads[0]] - before.get(reads[0], 0) == 2
assert any(k.startswith("phxmount_transport_bytes_total") for k in after)
EOF
}

test_go_plain() { go build ./... && go vet ./...; }

test_doctor() {
	local rc=0 want=1
	# A machine with an NVIDIA GPU and driver passes --vendor nvidia.
	if [ -e /dev/nvidiactl ] && ldconfig -p | grep -q 'libcuda\.so\.1'; then want=0; fi
	"$bin" doctor --vendor nvidia >"$tmp/doctor.txt" 2>&1 || rc=$?
	sed 's/^/     /' "$tmp/doctor.txt"
	[ "$rc" = "$want" ] || { echo "doctor --vendor nvidia: exit $rc, want $want"; return 1; }
	"$bin" doctor --vendor emu --json >"$tmp/doctor.json" && python3 -m json.tool "$tmp/doctor.json" >/dev/null
}

# The unit template, instantiated, and the .mount example verify with no
# complaint (ExecStart aimed at the DESTDIR binary, which verify checks).
test_unit() {
	local out
	sed "s|^ExecStart=/usr/local/bin/phxmount|ExecStart=$bin|" "$root/usr/local/lib/systemd/system/phxmount@.service" \
		>"$tmp/phxmount@accept.service"
	cp "$root/usr/local/share/doc/phxmount/examples/models.mount.example" "$tmp/models.mount"
	grep -q '^Type=notify$' "$tmp/phxmount@accept.service" || return 1
	out=$(systemd-analyze verify --man=no "$tmp/phxmount@accept.service" "$tmp/models.mount" 2>&1) || { echo "$out"; return 1; }
	[ -z "$out" ] || { echo "$out"; return 1; }
}

# The DKMS package builds against the kernel headers installed here (make
# test's module VM installs them), in a DKMS tree of its own.
test_dkms() {
	local headers kver src
	headers=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | head -n1)
	if [ -z "$headers" ]; then
		apt-get install -y -qq --no-install-recommends linux-headers-cloud-amd64 >/dev/null || return 1
		headers=$(ls -d /usr/src/linux-headers-*-amd64 | head -n1)
	fi
	kver=${headers#/usr/src/linux-headers-}
	src=$(ls -d "$root"/usr/src/phxfs-* | head -n1)
	mkdir -p "$tmp/dkms"
	dkms add -m phxfs -v "${src##*-}" --sourcetree "$root/usr/src" --dkmstree "$tmp/dkms" >/dev/null &&
		dkms build -m phxfs -v "${src##*-}" -k "$kver" --kernelsourcedir "$headers" \
			--sourcetree "$root/usr/src" --dkmstree "$tmp/dkms" >"$tmp/dkms.log" 2>&1 &&
		compgen -G "$tmp/dkms/phxfs/*/$kver/*/module/phxfs.ko*" >/dev/null || { tail -20 "$tmp/dkms.log"; return 1; }
}

main() {
	local port
	mkdir -p "$backing" "$mnt"
	head -c $((8 << 20)) /dev/urandom >"$backing/data.bin"
	port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	check "make install DESTDIR=… installs" test_install
	check "the installed phxmount --version" test_version
	install_helper
	check "mount -t fuse.phxmount with fstab-style options serves the file byte for byte" test_mount_command "$port"
	check "pip install ./python into a fresh venv, import phxmount" test_pip
	check "metrics: the byte counter moves by exactly the bytes READ" test_metrics "$port"
	check "SIGHUP reopens the log and keeps the mount" test_sighup
	check "umount unmounts cleanly and the daemon exits" unmount_clean
	check "an /etc/fstab line mounts, serves and unmounts" test_fstab
	check "a bad option through mount(8) is refused with its name" test_bad_option
	check "go build ./... && go vet ./... with no flags" test_go_plain
	check "doctor --vendor nvidia fails without a GPU; doctor --json" test_doctor
	check "systemd-analyze verify phxmount@.service" test_unit
	check "dkms build of the installed module source" test_dkms
	echo "acceptance: $passed passed, $failed failed"
	[ "$failed" = 0 ]
}

main

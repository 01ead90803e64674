#!/usr/bin/env bash
# Installs the Debian packages that the demo, the tests and the benchmarks
# use, where they are missing (root; Debian 12). Idempotent: when everything
# is there it installs nothing and takes a fraction of a second. `make test`
# and `make demo` run it; the kernel-module VM test installs its own
# (module/test/run-vm.sh).
set -euo pipefail
need=()
have() { command -v "$1" >/dev/null; }
have getfattr && have setfattr || need+=(attr) # user.phx.* and user.* xattrs from the shell
have flock && have mountpoint || need+=(util-linux)
have python3 || need+=(python3) # POSIX lock checks, the Python client's tests
# The Python client's planner tests compare with numpy slicing. A python3
# that is not Debian's (pyenv) finds Debian's numpy through the tests.
python3 -c 'import numpy' 2>/dev/null || [ -d /usr/lib/python3/dist-packages/numpy ] || need+=(python3-numpy)
# The deferred tensors (phxmount.deferred, the hook's deferral) are torch
# tensors: their tests run on the CPU with Debian's torch.
python3 -c 'import torch' 2>/dev/null || [ -d /usr/lib/python3/dist-packages/torch ] || need+=(python3-torch)
# Installing and operating (scripts/acceptance.sh, the non-root tests):
# curl for the metrics endpoint, fusermount3 for mounts by ordinary users,
# venv with pip for `pip install ./python`, systemd-analyze for the unit,
# dkms for the module's DKMS package.
have curl || need+=(curl)
have fusermount3 || need+=(fuse3)
dpkg -s python3-venv >/dev/null 2>&1 || need+=(python3-venv)
have systemd-analyze || need+=(systemd)
have dkms || need+=(dkms kmod)
# The race detector (make unit) needs cgo: a C compiler that builds and
# links a program against libc, not just a gcc on the PATH.
cc_works() {
	have gcc || return 1
	local dir rc=0
	dir=$(mktemp -d)
	printf '#include <stdio.h>\nint main(void) { return puts("") < 0; }\n' >"$dir/t.c"
	gcc -o "$dir/t" "$dir/t.c" >/dev/null 2>&1 || rc=1
	rm -rf "$dir"
	return $rc
}
cc_works || need+=(gcc libc6-dev)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
	echo "deps: missing ${need[*]}; run as root or install them" >&2
	exit 1
fi
echo "deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

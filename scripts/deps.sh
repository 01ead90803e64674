#!/usr/bin/env bash
# Installs the Debian packages that the demo, the tests and the benchmarks
# use, where they are missing (root; Debian 12). The kernel-module VM test
# installs its own (module/test/run-vm.sh).
set -euo pipefail
need=()
command -v getfattr >/dev/null || need+=(attr)       # user.phx.* and user.* xattrs from the shell
command -v flock >/dev/null || need+=(util-linux)
command -v python3 >/dev/null || need+=(python3)     # POSIX lock checks, the Python client's unit tests
command -v gcc >/dev/null || need+=(gcc libc6-dev)   # the race detector needs cgo
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
	echo "deps: missing ${need[*]}; run as root or install them" >&2
	exit 1
fi
echo "deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

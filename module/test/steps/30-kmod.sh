# The kmod package's tests against the real module.
[ -x /t/kmod.test ] || { echo "no kmod.test"; exit 1; }
cd /tmp && PHX_VM_PATTERN=/mnt/pattern.bin /t/kmod.test -test.v -test.count=1 -test.timeout=120s

# The pcibar connector's tests (unit tests on a fake sysfs, then the real BAR).
[ -x /t/connector_pcibar.test ] || { echo "no connector_pcibar.test"; exit 1; }
cd /tmp && /t/connector_pcibar.test -test.v -test.count=1 -test.timeout=120s

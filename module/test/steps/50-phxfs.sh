# The phxfs library's suites on the real module: the direct transport.
if [ ! -x /t/phxfs.test ]; then
	echo "no phxfs tests yet"
	exit 0
fi
# TestStagedDirectIOPolicy drives the staged transport's O_DIRECT policy; on
# pcibar the library takes the direct transport, so its counters stay put.
# Skipped here, loudly, until the suite skips it for pcibar itself.
skip='^TestStagedDirectIOPolicy$'
echo "NOTE: skipping $skip (staged-only test; pcibar runs the direct transport)"
cd /tmp && PHX_TEST_CONNECTOR=pcibar /t/phxfs.test -test.v -test.short -test.count=1 \
	-test.timeout=240s -test.skip "$skip"

# The phxfs library's suites on the real module: the kmod transport.
# (Staged-only tests, such as TestStagedDirectIOPolicy, skip themselves
# with a message: pcibar runs the kmod transport only.)
if [ ! -x /t/phxfs.test ]; then
	echo "no phxfs tests yet"
	exit 0
fi
cd /tmp && PHX_TEST_CONNECTOR=pcibar /t/phxfs.test -test.v -test.short -test.count=1 -test.timeout=240s

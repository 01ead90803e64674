package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func shippedRules(t *testing.T) []rule {
	t.Helper()
	rules, err := parseRules(allowedSkipsName, allowedSkips)
	if err != nil {
		t.Fatalf("%s: %v", allowedSkipsName, err)
	}
	return rules
}

// openTestdata opens testdata/name for the length of the test.
func openTestdata(t *testing.T, name string) *os.File {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestGoSkipsAndRule: a `go test -json` stream with one skip that CI
// expects (no GPU) and one that it must refuse (not root): the run is
// summarised like `go test` without -v, both skips are recorded with their
// reasons, and `check -strict` fails naming only the unexpected one.
func TestGoSkipsAndRule(t *testing.T) {
	var progress bytes.Buffer
	skips, failed, err := summarizeGo(openTestdata(t, "unit-skips.jsonl"), &progress, "unit")
	if err != nil || failed {
		t.Fatalf("summarizeGo: failed %v, %v", failed, err)
	}
	want := []Skip{
		{"unit", "phxmount/connector/nvidia", "TestGPUDevices", "no libcuda.so.1: libcuda.so.1 not found: no NVIDIA driver on this machine (libcuda.so.1: cannot open shared object file: No such file or directory): no such device"},
		{"unit", "phxmount/integration", "TestXattrs", "integration: skipped: needs root to mount FUSE (run as root, e.g. make integration as root)"},
	}
	if len(skips) != len(want) {
		t.Fatalf("skips = %+v", skips)
	}
	for i := range want {
		if skips[i] != want[i] {
			t.Errorf("skip %d = %+v, want %+v", i, skips[i], want[i])
		}
	}
	p := progress.String()
	for _, w := range []string{"?   \tphxmount/cmd/phxdemo\t[no test files]\n", "ok  \tphxmount/connector/nvidia\t0.048s\n", "ok  \tphxmount/integration\t0.102s\n"} {
		if !strings.Contains(p, w) {
			t.Errorf("progress lacks %q:\n%s", w, p)
		}
	}
	if strings.Contains(p, "=== RUN") || strings.Contains(p, "--- PASS") || strings.Contains(p, "gpu_test.go") {
		t.Errorf("progress shows what go test without -v hides:\n%s", p)
	}

	// The records, through the command line: tier run, then check.
	dir := t.TempDir()
	rec := filepath.Join(dir, "unit.jsonl")
	stream, _ := os.ReadFile("testdata/unit-skips.jsonl")
	var out, errb bytes.Buffer
	if rc := run([]string{"go", "-tier", "unit", "-out", rec}, bytes.NewReader(stream), &out, &errb); rc != 0 {
		t.Fatalf("go: exit %d: %s%s", rc, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "unit: 2 skipped:\n  SKIP phxmount/connector/nvidia.TestGPUDevices: no libcuda.so.1") {
		t.Errorf("the tier's skip summary:\n%s", out.String())
	}
	out.Reset()
	if rc := run([]string{"check", "-strict", rec}, nil, &out, &errb); rc != 1 {
		t.Fatalf("check -strict with an unexpected skip: exit %d, want 1:\n%s", rc, out.String())
	}
	o := out.String()
	if !strings.Contains(o, "  expected   unit        phxmount/connector/nvidia.TestGPUDevices: no libcuda") ||
		!strings.Contains(o, "  UNEXPECTED unit        phxmount/integration.TestXattrs: integration: skipped: needs root") ||
		!strings.Contains(o, "== 2 skipped: 1 expected, 1 unexpected") {
		t.Errorf("check output:\n%s", o)
	}
	_, list, _ := strings.Cut(o, "== FAIL: these must not skip here")
	if !strings.Contains(list, "unit phxmount/integration.TestXattrs") || strings.Contains(list, "TestGPUDevices") {
		t.Errorf("the failure list must name exactly the unexpected skip:\n%s", list)
	}
	// Without -strict (make test on a workstation) it reports and passes.
	out.Reset()
	if rc := run([]string{"check", rec}, nil, &out, &errb); rc != 0 || !strings.Contains(out.String(), "would fail") {
		t.Errorf("check without -strict: exit %d:\n%s", rc, out.String())
	}
	// Only the expected skip: passes.
	if err := writeRecords(rec, skips[:1]); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if rc := run([]string{"check", "-strict", rec}, nil, &out, &errb); rc != 0 {
		t.Errorf("check -strict with only expected skips: exit %d:\n%s", rc, out.String())
	}
	// A tier that left no records (did not run) fails the strict check.
	out.Reset()
	if rc := run([]string{"check", "-strict", rec, filepath.Join(dir, "module.jsonl")}, nil, &out, &errb); rc != 1 || !strings.Contains(out.String(), "MISSING") {
		t.Errorf("check -strict with a missing records file: exit %d:\n%s", rc, out.String())
	}
}

// TestGoFailures: failing tests print their output, a failing package
// prints what its unfinished tests printed (a timeout), build errors and
// lines that are not JSON pass through, and the run counts as failed.
func TestGoFailures(t *testing.T) {
	var w bytes.Buffer
	skips, failed, err := summarizeGo(openTestdata(t, "fail.jsonl"), &w, "unit")
	if err != nil || !failed || len(skips) != 0 {
		t.Fatalf("failed %v, skips %v, %v", failed, skips, err)
	}
	o := w.String()
	for _, s := range []string{"go: downloading example.com/x v1.0.0\n", "a_test.go:9: got 1, want 2", "--- FAIL: TestBad", "FAIL\tp/a\t0.010s",
		"b_test.go:5: waiting for the daemon", "panic: test timed out after 1s", "syntax error: non-declaration"} {
		if !strings.Contains(o, s) {
			t.Errorf("output lacks %q:\n%s", s, o)
		}
	}
	if strings.Contains(o, "TestGood") {
		t.Errorf("a passing test's output is shown:\n%s", o)
	}
	var out bytes.Buffer
	if rc := run([]string{"go", "-tier", "unit"}, strings.NewReader(o), &out, &out); rc != 0 {
		t.Errorf("plain text only (no events): exit %d", rc)
	}
	f, _ := os.ReadFile("testdata/fail.jsonl")
	out.Reset()
	if rc := run([]string{"go", "-tier", "unit", "-q"}, bytes.NewReader(f), &out, &out); rc != 1 || strings.Contains(out.String(), "got 1") {
		t.Errorf("-q: exit %d, want 1 and only the summary:\n%s", rc, out.String())
	}
}

// TestPythonSkips: unittest -v's skip lines, with the verdict on the test's
// line or on its docstring's line, with either quote.
func TestPythonSkips(t *testing.T) {
	in, err := os.ReadFile("testdata/python-v.txt")
	if err != nil {
		t.Fatal(err)
	}
	var w bytes.Buffer
	skips, failed, err := summarizePython(bytes.NewReader(in), &w, "python")
	if err != nil || failed {
		t.Fatalf("failed %v, %v", failed, err)
	}
	if w.String() != string(in) {
		t.Errorf("the run is not passed through unchanged")
	}
	want := []Skip{
		{"python", "test_abi.GoldenFreshTest", "test_golden_file_matches_the_go_encoder", "SKIP: no Go toolchain here; checked against the committed golden_abi.json only"},
		{"python", "test_mount_emu.EmuMountTest", "test_load_one_batch", "SKIP: needs root (mounting FUSE)"},
		{"python", "test_torch.TorchTest", "test_load_on_gpu", "no CUDA device: torch.cuda.is_available() is False"},
	}
	if len(skips) != len(want) {
		t.Fatalf("skips = %+v", skips)
	}
	rules := shippedRules(t)
	for i := range want {
		if skips[i] != want[i] {
			t.Errorf("skip %d = %+v, want %+v", i, skips[i], want[i])
		}
		// Only the GPU one is expected.
		if got := expectedBy(rules, skips[i]) != nil; got != (i == 2) {
			t.Errorf("%s expected = %v", skips[i].name(), got)
		}
	}
	// unittest counts a skip that was not parsed: an unnamed, unexpected skip.
	more := strings.Replace(string(in), "skipped=3", "skipped=4", 1)
	skips, _, _ = summarizePython(strings.NewReader(more), &w, "python")
	if len(skips) != 4 || skips[3].Test != "(unparsed)" || expectedBy(rules, skips[3]) != nil {
		t.Errorf("a skip unittest counted but the parser missed: %+v", skips)
	}
	// FAILED, or no result line at all (a crash), is a failure.
	for _, s := range []string{strings.Replace(string(in), "OK (skipped=3)", "FAILED (failures=1, skipped=3)", 1), "test_x (m.C.test_x) ... ok\n"} {
		if _, failed, _ := summarizePython(strings.NewReader(s), &w, "python"); !failed {
			t.Errorf("not a failure:\n%s", s)
		}
	}
}

// TestShippedRules: the allow-list admits tier 4's "no GPU" skips and the
// structural ones, and never the skips of a CI machine that lacks what CI
// must have (root, /dev/fuse, a tool, the kernel module in the VM).
func TestShippedRules(t *testing.T) {
	rules := shippedRules(t)
	for _, c := range []struct {
		s    Skip
		want bool
	}{
		{Skip{"unit", "phxmount/connector/nvidia", "TestGPUIPC", "no libcuda.so.1: libcuda.so.1 not found: no NVIDIA driver on this machine"}, true},
		{Skip{"unit", "phxmount/connector/nvidia", "TestGPURoundTrip", "no usable NVIDIA GPU: cuInit: CUDA_ERROR_NO_DEVICE"}, true},
		{Skip{"unit", "phxmount/connector/nvidia", "TestGPUIPCChild", "child of TestGPUIPC only"}, true},
		{Skip{"unit", "phxmount/fusefs", "TestHelperExporter", "helper process for TestControlOwnerDeath (runs only when re-executed)"}, true},
		{Skip{"integration", "phxmount/integration", "TestIoctlHelperChild", "helper process for the ioctl/fault tests (runs only when re-executed)"}, true},
		{Skip{"unit", "phxmount/kmod", "TestModuleErrors", "phxfs module not loaded (runs in the module-test VM)"}, true},
		{Skip{"module", "module-vm", "TestRegMemRules/io_uring/kmod", "needs 2 pcibar devices, this machine has 1"}, true},
		{Skip{"module", "module-vm", "TestStagedBuffers", "PHX_TEST_CONNECTOR=pcibar runs no staged transport"}, true},
		{Skip{"module", "module-vm", "TestShrunkImportFailsWithEFAULT", "needs the emu connector"}, true},
		{Skip{"unit", "phxmount/phxfs", "TestShrunkImportFailsWithEFAULT", "needs the emu connector"}, false},

		{Skip{"module", "module-vm", "TestModuleErrors", "phxfs module not loaded (runs in the module-test VM)"}, false},
		{Skip{"module", "module-vm", "TestRealBAR", "phxfs module not loaded (runs in the module-test VM)"}, false},
		{Skip{"integration", "phxmount/integration", "TestXattrs", "integration: skipped: needs root to mount FUSE (run as root, e.g. make integration as root)"}, false},
		{Skip{"integration", "phxmount/integration", "TestLocks", "integration: skipped: no /dev/fuse (stat /dev/fuse: no such file or directory)"}, false},
		{Skip{"integration", "phxmount/integration", "TestXattrs", "skipped: setfattr not installed (Debian package attr)"}, false},
		{Skip{"integration", "phxmount/integration", "TestPermissionsAllowOther", "setfattr not installed (Debian package attr; scripts/deps.sh installs it)"}, false},
		{Skip{"unit", "phxmount/fusefs", "TestOverlay", "skipped: mounting needs root"}, false},
		{Skip{"unit", "phxmount/ioengine", "TestRing", "io_uring unavailable here: operation not permitted"}, false},
		{Skip{"python", "test_mount_emu.EmuMountTest", "test_load_one_batch", "SKIP: no /dev/fuse"}, false},
		{Skip{"python", "test_abi.GoldenFreshTest", "test_golden_file_matches_the_go_encoder", "SKIP: set PHX_GOLDEN_GO=1 to regenerate with Go; go test ./python/tests/goldengen checks it"}, false},
		{Skip{"module", "module-vm", "TestRegMemRules/io_uring/kmod", "needs 2 pcibar devices, this machine has 0"}, false},
	} {
		if got := expectedBy(rules, c.s) != nil; got != c.want {
			t.Errorf("%s %s %q: expected = %v, want %v", c.s.Tier, c.s.name(), c.s.Reason, got, c.want)
		}
	}
}

func TestParseRulesErrors(t *testing.T) {
	for _, bad := range []string{"unit TestX", "gpu TestX reason", "unit Test( reason", "unit TestX reason(", "* .* "} {
		if _, err := parseRules("r", []byte("# c\n\n"+bad+"\n")); err == nil || !strings.HasPrefix(err.Error(), "r:3: ") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	r, err := parseRules("r", []byte("  integration   Test.*   ^a b  c$  \n"))
	if err != nil || len(r) != 1 || r[0].tier != "integration" || r[0].reason.String() != "^a b  c$" || r[0].test.MatchString("XTestA") || !r[0].test.MatchString("TestA") {
		t.Errorf("%+v %v", r, err)
	}
}

package integration

// What the daemon falls back to, it says: in its log, INFO and
// user.phx.info.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"phxmount/client"
)

// TestEngineFallbackIsReported: with io_uring disabled by the kernel
// (kernel.io_uring_disabled=2) while the daemon starts, its workers run
// the sync engine, and the log, INFO and user.phx.info say so and why.
func TestEngineFallbackIsReported(t *testing.T) {
	requireMountEnv(t)
	const knob = "/proc/sys/kernel/io_uring_disabled"
	old, err := os.ReadFile(knob)
	if err != nil {
		t.Fatalf("%s: %v (Linux >= 6.6 has it)", knob, err)
	}
	if err := os.WriteFile(knob, []byte("2"), 0); err != nil {
		t.Fatalf("disable io_uring: %v", err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := os.WriteFile(knob, old, 0); err != nil {
				t.Errorf("restore %s: %v", knob, err)
			}
		}
	}
	defer restore()
	d := startDaemon(t, withArgs("--vendor", "emu"))
	restore() // the rings were made (or not) at start
	if !strings.Contains(d.Stderr(), "io_uring could not be set up") {
		t.Errorf("no log line about the engine fallback:\n%s", d.Stderr())
	}
	writePattern(t, filepath.Join(d.Backing, "f"), 4096, 0644)
	f := openClient(t, filepath.Join(d.Mnt, "f"), unix.O_RDONLY)
	in, err := f.Info()
	if err != nil {
		t.Fatal(err)
	}
	if in.Flags&client.InfoEngineFallback == 0 || in.Engine != "sync" {
		t.Errorf("INFO: engine %q, flags %#x: want sync and the fallback flag", in.Engine, in.Flags)
	}
	info := phxInfo(t, filepath.Join(d.Mnt, "f"))
	if !strings.Contains(info["engine_why"], "io_uring") {
		t.Errorf("user.phx.info engine_why = %q", info["engine_why"])
	}
}

// TestStagedReadPolicyIsReported: the staged transport's read policy and
// its counters are in INFO and user.phx.info: a cold read goes O_DIRECT, a
// cached one through the page cache.
func TestStagedReadPolicyIsReported(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu", "--emu-staged"))
	want := writePattern(t, filepath.Join(d.Backing, "f"), 4<<20, 0644)
	path := filepath.Join(d.Mnt, "f")
	f := openClient(t, path, unix.O_RDONLY)
	in, err := f.Info()
	if err != nil {
		t.Fatal(err)
	}
	if in.Transport != client.TransportStaged || in.Flags&client.InfoCachestat == 0 {
		t.Fatalf("INFO: transport %v, flags %#x: want staged with cachestat", in.Transport, in.Flags)
	}
	info := phxInfo(t, path)
	if info["read_policy"] != "auto" || info["cachestat"] != "true" {
		t.Errorf("user.phx.info read_policy=%q cachestat=%q", info["read_policy"], info["cachestat"])
	}
	m := emuBuffer(t, 0, 4<<20)
	b := register(t, f, m)
	dropCaches(t)
	if n, err := f.Read(b, 0, 4<<20, 0); err != nil || n != 4<<20 {
		t.Fatalf("cold READ = %d, %v", n, err)
	}
	cold := infoCounter(t, path, "staged_direct_bytes")
	if _, err := os.ReadFile(filepath.Join(d.Backing, "f")); err != nil { // now cached
		t.Fatal(err)
	}
	if n, err := f.Read(b, 0, 4<<20, 0); err != nil || n != 4<<20 {
		t.Fatalf("hot READ = %d, %v", n, err)
	}
	if string(m.Bytes()) != string(want) {
		t.Fatalf("the buffer does not hold the file")
	}
	if cold != 4<<20 || infoCounter(t, path, "staged_buffered_bytes") != 4<<20 {
		t.Errorf("staged_direct_bytes %d after the cold read, staged_buffered_bytes %d after the hot one; want 4 MiB each",
			cold, infoCounter(t, path, "staged_buffered_bytes"))
	}
}

// dropCaches empties the page cache.
func dropCaches(t *testing.T) {
	t.Helper()
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		t.Fatalf("drop caches: %v", err)
	}
}

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector/emu"
)

// evictedFile is a file of size bytes on a disk file system (not tmpfs,
// whose pages cannot leave memory), written back and dropped from the page
// cache: cold, without dropping the whole machine's caches.
func evictedFile(t *testing.T, size int) int {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "phxbench-gpu-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	name := filepath.Join(dir, "data")
	if err := os.WriteFile(name, make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Fsync(fd); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	return fd
}

// TestColdnessSeesResidentPages: a cold row's check finds no page of an
// evicted file resident, and finds the pages a read brought back, also
// when the range starts and ends off a page boundary (issue 18, item 10).
func TestColdnessSeesResidentPages(t *testing.T) {
	const size = 1 << 20
	fd := evictedFile(t, size)
	if got, err := residentBytes(fd, 0, size); err != nil || got != 0 {
		t.Fatalf("evicted file: %d bytes resident, %v", got, err)
	}
	if why := coldness(fd, 100, size-200); why != "" {
		t.Fatalf("evicted file is not cold: %s", why)
	}
	if _, err := unix.Pread(fd, make([]byte, 4096), 512<<10); err != nil {
		t.Fatal(err)
	}
	got, err := residentBytes(fd, 100, size-200)
	if err != nil || got < 4096 {
		t.Fatalf("after reading 4 KiB: %d bytes resident, %v", got, err)
	}
	if why := coldness(fd, 100, size-200); !strings.Contains(why, "still in the page cache") {
		t.Fatalf("a file with resident pages passes as cold: %q", why)
	}
	// The range's own pages only: the read page is outside this one.
	if got, err := residentBytes(fd, 0, 256<<10); err != nil || got != 0 {
		t.Fatalf("first 256 KiB: %d bytes resident, %v", got, err)
	}
}

// TestNotRunRowHasNoNumber: a row that was not measured carries its reason
// and neither seconds nor a rate, so the report cannot print a figure for it.
func TestNotRunRowHasNoNumber(t *testing.T) {
	r := &report{}
	r.notRun("ceiling cold O_DIRECT read 16x4MiB", "caches not dropped: permission denied")
	b, err := json.Marshal(r.Results[0])
	if err != nil {
		t.Fatal(err)
	}
	var row map[string]any
	if err := json.Unmarshal(b, &row); err != nil {
		t.Fatal(err)
	}
	if _, ok := row["gbps"]; ok {
		t.Errorf("a not-run row has a rate: %s", b)
	}
	if _, ok := row["seconds"]; ok {
		t.Errorf("a not-run row has a time: %s", b)
	}
	if row["error"] != "caches not dropped: permission denied" {
		t.Errorf("a not-run row does not say why: %s", b)
	}
}

// TestAlignedReadAndShort: stripedRead widens a read to 4096-byte
// boundaries for O_DIRECT, and the bytes before the range it then reads
// do not count towards the range (issue 18, item 10).
func TestAlignedReadAndShort(t *testing.T) {
	for _, c := range []struct{ pos, l, at, head, ln int64 }{
		{0, 4 << 20, 0, 0, 4 << 20},
		{8192 + 100, 1000, 8192, 100, 4096},
		{8192 + 4000, 1000, 8192, 4000, 8192},
		{4096, 1, 4096, 0, 4096},
	} {
		at, head, ln := alignedRead(c.pos, c.l)
		if at != c.at || head != c.head || ln != c.ln {
			t.Errorf("alignedRead(%d, %d) = %d, %d, %d; want %d, %d, %d", c.pos, c.l, at, head, ln, c.at, c.head, c.ln)
		}
	}
	// 1050 bytes from 8192: 100 of head, then 950 of the 1000 wanted.
	if !short(1050, 100, 1000) {
		t.Error("a read that ends 50 bytes before the range does passes")
	}
	if short(1100, 100, 1000) || short(4096, 100, 1000) {
		t.Error("a read that holds the range is short")
	}
}

// TestPinnedStreamsFailsOnACopyError: a copy that fails fails the ceiling,
// which would otherwise count bytes that never moved (issue 18, item 10);
// copying a memory whose size is not a multiple of 4 MiB is no failure.
func TestPinnedStreamsFailsOnACopyError(t *testing.T) {
	conn, err := emu.New(emu.Config{Staged: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const size = 14*mib + 64<<10 // not a multiple of the 4 MiB copies
	mem, err := conn.Alloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	h, err := conn.AllocHost(8 * mib)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	rep := &report{}
	if err := pinnedStreams(rep, conn, mem, h, 8*mib, size, 2); err != nil {
		t.Fatalf("copies of the whole memory: %v", err)
	}
	if err := pinnedStreams(rep, conn, mem, h, 8*mib, size+8*mib, 2); err == nil {
		t.Fatal("copies past the device memory pass")
	}
	if len(rep.Results) != 1 {
		t.Fatalf("%d rows, want the good run's only", len(rep.Results))
	}
}

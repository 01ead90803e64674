package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A file just written is resident; after fsync and FADV_DONTNEED it is not,
// by cachestat and by the mincore fallback alike.
func TestResidentCountsCachedPages(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, make([]byte, 256<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := resident(p); err != nil || n == 0 {
		t.Fatalf("just written: %d pages resident, %v; want > 0", n, err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n, err := mincoreResident(f); err != nil || n == 0 {
		t.Fatalf("mincore, just written: %d pages, %v; want > 0", n, err)
	}
	f.Sync()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	n, err := resident(p)
	if err != nil {
		t.Fatal(err)
	}
	var fs unix.Statfs_t
	if unix.Statfs(p, &fs) == nil && fs.Type == unix.TMPFS_MAGIC && n > 0 {
		t.Skip("tmpfs keeps its pages: the dropped case needs a disk-backed TMPDIR")
	}
	if m, err := mincoreResident(f); n != 0 || m != 0 || err != nil {
		t.Fatalf("after DONTNEED: cachestat %d, mincore %d pages (%v); want 0", n, m, err)
	}
}

func TestResidentAllSumsOrUnknown(t *testing.T) {
	count := func(p string) (int64, error) {
		if p == "bad" {
			return 0, errors.New("no")
		}
		return int64(len(p)), nil
	}
	if n := residentAll([]string{"ab", "cde"}, count); n != 5 {
		t.Fatalf("sum %d, want 5", n)
	}
	if n := residentAll([]string{"ab", "bad"}, count); n != unknownResidency {
		t.Fatalf("with an unchecked path: %d, want %d", n, unknownResidency)
	}
}

func coldRow(backing, mount []int64) *row {
	r := &row{Name: "cold", Unit: "MB/s", Target: 0.97, Higher: true, Cold: true,
		Samples: map[string][]float64{}, Resident: map[string][]int64{"backing": backing, "mount": mount}}
	for s, res := range r.Resident {
		for range res {
			r.Samples[s] = append(r.Samples[s], 1000)
		}
	}
	return r
}

// The ratio of a cold row prints only when every sample on both sides
// started with nothing resident.
func TestColdVerdictRefusesCachedSamples(t *testing.T) {
	for _, c := range []struct {
		backing, mount []int64
		want           string
	}{
		{[]int64{0, 0, 0}, []int64{0, 0, 0}, ""},
		{[]int64{0, 0, 0}, []int64{0, 5, 0}, "not cold: 5 pages resident (mount)"},
		{[]int64{7, 0, 0}, []int64{0, 2, 0}, "not cold: 7 pages resident (backing)"},
		{[]int64{0, unknownResidency}, []int64{0, 0}, "not cold: residency unknown (backing)"},
	} {
		r := coldRow(c.backing, c.mount)
		cold, why := r.coldVerdict()
		if cold != (c.want == "") || why != c.want {
			t.Errorf("%v/%v: cold %v %q, want %q", c.backing, c.mount, cold, why, c.want)
		}
		line := formatRow(r)
		if c.want != "" && (!strings.Contains(line, c.want) || strings.Contains(line, "x ")) {
			t.Errorf("row %q: want %q and no ratio", line, c.want)
		}
		if c.want == "" && !strings.Contains(line, "1.000x") {
			t.Errorf("row %q: want the ratio", line)
		}
	}
	r := coldRow([]int64{0}, []int64{0})
	r.Resident["mount"] = nil // a sample taken without a check
	if cold, _ := r.coldVerdict(); cold {
		t.Error("a sample without a residency check counted as cold")
	}
}

func TestHostCacheNote(t *testing.T) {
	if !underVM("processor\t: 0\nflags\t\t: fpu vme hypervisor lahf_lm\n") || underVM("flags\t\t: fpu vme lahf_lm\n") {
		t.Fatal("underVM misreads the hypervisor flag")
	}
	if vm := hostCacheNote(true); !strings.Contains(vm, "host may cache the virtual disk") || !strings.Contains(coldName(true), "host-warm") {
		t.Errorf("VM note %q / row %q do not say the host's cache is warm", vm, coldName(true))
	}
	if bare := hostCacheNote(false); strings.Contains(bare, "host") {
		t.Errorf("bare-metal note %q mentions a host", bare)
	}
}

// primeHost reads the whole file with O_DIRECT and leaves no page of it in
// the guest's cache.
func TestPrimeHostLeavesNoGuestCache(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, make([]byte, 3<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	f.Sync()
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	f.Close()
	if n, _ := resident(p); n != 0 {
		t.Skipf("%d pages stay resident after DONTNEED (tmpfs?)", n)
	}
	if err := primeHost(p); err != nil {
		if errors.Is(err, unix.EINVAL) {
			t.Skip("no O_DIRECT on this filesystem")
		}
		t.Fatal(err)
	}
	if n, err := resident(p); n != 0 || err != nil {
		t.Fatalf("after primeHost: %d pages resident (%v), want 0", n, err)
	}
}

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector/emu"
	"github.com/phxmount/phxmount/phxfs"
)

const (
	testBlock  = 4096
	testBlocks = 64
	testBatch  = 16
)

// fixture is a library on the emulated device (host transport, as the
// benchmark's host rows), a registered buffer of testBatch slots and a file
// whose block b is filled with byte b.
type fixture struct {
	lib  *phxfs.Lib
	mem  *emu.Memory
	fds  []int
	file []byte
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{file: make([]byte, testBlock*testBlocks)}
	for b := range testBlocks {
		copy(f.file[b*testBlock:], bytes.Repeat([]byte{byte(b)}, testBlock))
	}
	path := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(path, f.file, 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(path, unix.O_RDONLY, 0) // buffered: tmpfs may refuse O_DIRECT
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if f.fds, err = dupFds(fd, testBatch); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeFds(f.fds) })
	conn, err := emu.New(emu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// SplitSize -1 as in the benchmark: the library would merge a whole batch.
	f.lib, err = phxfs.New(phxfs.Config{Connector: conn, Engine: "sync", Workers: 1, QueueDepth: 4, SplitSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.lib.Close() })
	if err := f.lib.OpenDevice(0); err != nil {
		t.Fatal(err)
	}
	m, err := conn.Alloc(0, emu.PageSize)
	if err != nil {
		t.Fatal(err)
	}
	f.mem = m.(*emu.Memory)
	t.Cleanup(func() { f.mem.Close() })
	if _, err := f.lib.RegMem(0, f.mem.Addr(), f.mem.Size()); err != nil {
		t.Fatal(err)
	}
	return f
}

// run builds one batch with the plan, reads it and checks every request's
// slot holds its block.
func (f *fixture) run(t *testing.T, pattern string) ([]phxfs.Request, phxfs.Stats) {
	t.Helper()
	pl, err := newPlanner(pattern, testBlock, testBlocks, f.fds, f.mem.Addr())
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]phxfs.Request, testBatch)
	pl.fill(reqs)
	planned := slices.Clone(reqs)
	if err := readBatch(f.lib, reqs); err != nil {
		t.Fatal(err)
	}
	for _, r := range planned {
		got := f.mem.Bytes()[r.BufOffset : r.BufOffset+r.Len]
		if want := f.file[r.FileOffset : r.FileOffset+r.Len]; !bytes.Equal(got, want) {
			t.Fatalf("slot at %d does not hold file offset %d", r.BufOffset, r.FileOffset)
		}
	}
	return planned, f.lib.Stats()
}

// The sequential plan compared with fio must reach the engine as one op
// per request, as fio's 1 MiB reads do.
func TestSeqPlanDoesNotCoalesce(t *testing.T) {
	f := newFixture(t)
	reqs, st := f.run(t, planSeq)
	for i, r := range reqs {
		if r.FileOffset != int64(i)*testBlock {
			t.Fatalf("request %d at file offset %d, want consecutive blocks", i, r.FileOffset)
		}
	}
	if st.Coalesced != 0 || st.Ops != testBatch || st.Requests != testBatch {
		t.Fatalf("stats %+v: want %d requests as %d ops, none coalesced", st, testBatch, testBatch)
	}
	if err := checkShape(planSeq, st); err != nil {
		t.Fatal(err)
	}
}

// The coalescing row's plan is merged by the library into one op.
func TestContigPlanCoalesces(t *testing.T) {
	f := newFixture(t)
	_, st := f.run(t, planCoalesce)
	if st.Coalesced != testBatch-1 || st.Ops != 1 {
		t.Fatalf("stats %+v: want %d requests merged into 1 op", st, testBatch)
	}
	if checkShape(planSeq, st) == nil {
		t.Fatal("checkShape accepts a coalesced run as the seq plan")
	}
	if err := checkShape(planCoalesce, st); err != nil {
		t.Fatal(err)
	}
}

// prepareOrder is the order phxfs's prepare puts a batch in (phxfs/io.go:
// a stable sort by fd, then file offset).
func prepareOrder(reqs []phxfs.Request) []int {
	idx := make([]int, len(reqs))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		ra, rb := reqs[idx[a]], reqs[idx[b]]
		if ra.Fd != rb.Fd {
			return ra.Fd < rb.Fd
		}
		return ra.FileOffset < rb.FileOffset
	})
	return idx
}

// The random plan reaches the engine unsorted, as fio's randread does: the
// library's sort must leave its submission order alone, while the same
// offsets on one fd would have been sorted.
func TestRandPlanKeepsSubmissionOrder(t *testing.T) {
	f := newFixture(t)
	reqs, st := f.run(t, planRand)
	offs := make([]int64, len(reqs))
	for i, r := range reqs {
		offs[i] = r.FileOffset
	}
	if slices.IsSorted(offs) {
		t.Fatalf("random offsets %v came out sorted", offs)
	}
	order := prepareOrder(reqs)
	for i, j := range order {
		if i != j {
			t.Fatalf("prepare would run request %d in place %d: submission order lost", j, i)
		}
	}
	oneFd := slices.Clone(reqs)
	for i := range oneFd {
		oneFd[i].Fd = reqs[0].Fd
	}
	if slices.IsSorted(prepareOrder(oneFd)) {
		t.Fatal("on one fd the library would not reorder these offsets: the test proves nothing")
	}
	if st.Coalesced != 0 || st.Ops != testBatch {
		t.Fatalf("stats %+v: want %d ops, none coalesced", st, testBatch)
	}
}

// No two requests of a compared plan have buffers that follow on, so even
// a library that merged across dup'd fds could not coalesce them.
func TestComparedPlansBuffersDoNotFollowOn(t *testing.T) {
	for _, pattern := range []string{planRand, planSeq} {
		pl, err := newPlanner(pattern, testBlock, testBlocks, []int{3, 4, 5, 6}, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		reqs := make([]phxfs.Request, 4)
		pl.fill(reqs)
		for i := 1; i < len(reqs); i++ {
			if reqs[i-1].BufOffset+reqs[i-1].Len == reqs[i].BufOffset {
				t.Fatalf("%s: request %d's buffer follows on from request %d's", pattern, i, i-1)
			}
		}
	}
}

func TestDupFdsAscending(t *testing.T) {
	fds, err := dupFds(0, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFds(fds)
	if len(fds) != 8 || !slices.IsSorted(fds) || len(slices.Compact(slices.Clone(fds))) != 8 {
		t.Fatalf("fds %v: want 8 distinct ascending", fds)
	}
	if _, err := newPlanner(planSeq, testBlock, testBlocks, []int{5, 4}, 0); err == nil {
		t.Fatal("newPlanner accepted descending fds")
	}
}

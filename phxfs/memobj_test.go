package phxfs

import (
	"os"
	"testing"

	"github.com/phxmount/phxmount/connector"
)

// TestNoCopySpansTwoRegistrations: requests that follow on in the file and
// in device addresses but land in two registrations (a caching allocator's
// adjacent segments, each imported on its own, as a MoE checkpoint's small
// tensors are) are two staged xfers and two copies, never one: CUDA refuses
// a copy past the end of the allocation it starts in (run 34:
// CUDA_ERROR_INVALID_VALUE, "copy is larger than memobj size", for every
// file of a 1,611-tensor checkpoint). Requests in one registration still
// join.
func TestNoCopySpansTwoRegistrations(t *testing.T) {
	c := emuStaged(t, 1)
	l := newLibOn(t, c, setup{"sync", Staged}, 1)
	const half = 128 << 10
	m := alloc(t, c, 0, 2*half)
	for _, off := range []uint64{0, half} {
		if _, err := l.RegMem(0, m.Addr()+off, half); err != nil {
			t.Fatal(err)
		}
	}
	name := patternFile(t, 1*mib)
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	across := []Request{
		{Fd: fd, Device: 0, DevAddr: m.Addr(), BufOffset: half - 64<<10, Len: 64 << 10, FileOffset: 0},
		{Fd: fd, Device: 0, DevAddr: m.Addr() + half, Len: 64 << 10, FileOffset: 64 << 10},
	}
	within := []Request{
		{Fd: fd, Device: 0, DevAddr: m.Addr(), Len: 32 << 10, FileOffset: 0},
		{Fd: fd, Device: 0, DevAddr: m.Addr(), BufOffset: 32 << 10, Len: 32 << 10, FileOffset: 32 << 10},
	}
	for _, tc := range []struct {
		what  string
		reqs  []Request
		xfers int
	}{{"across two registrations", across, 2}, {"within one", within, 1}} {
		p, err := l.prepare(false, tc.reqs)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.xfers) != tc.xfers {
			t.Errorf("%s: %d xfers, want %d", tc.what, len(p.xfers), tc.xfers)
		}
		for _, x := range p.xfers {
			if x.devAddr < x.reg.addr || x.devAddr+uint64(x.len) > x.reg.end() {
				t.Errorf("%s: xfer [%#x, +%d) outside its registration", tc.what, x.devAddr, x.len)
			}
		}
		l.finish(p)
	}
	if failed, err := l.ReadBatch(across); failed != 0 || err != nil {
		t.Fatalf("read across: %d failed, %v", failed, err)
	}
	checkPattern(t, deviceBytes(t, c, m, half-64<<10, 128<<10), 0)
}

// TestMergePiecesKeepsRegistrationsApart: pieces that follow on in the
// slot and the device join only within one registration.
func TestMergePiecesKeepsRegistrationsApart(t *testing.T) {
	a, b := &region{}, &region{}
	xs := []xfer{{reg: a}, {reg: a}, {reg: b}}
	ps := []connector.Piece{{Off: 0, Dev: 100, Len: 10}, {Off: 10, Dev: 110, Len: 10}, {Off: 20, Dev: 120, Len: 10}}
	got := mergePieces(nil, ps, []int{0, 1, 2}, xs)
	want := []connector.Piece{{Off: 0, Dev: 100, Len: 20}, {Off: 20, Dev: 120, Len: 10}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("merged %v, want %v", got, want)
	}
}

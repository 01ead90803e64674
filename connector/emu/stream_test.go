package emu

import (
	"bytes"
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
)

// TestScatterGatherAndFences: pieces land at scattered addresses and come
// back; a fault in one fence's copies is reported by that fence only; a
// bad piece fails the call with nothing queued.
func TestScatterGatherAndFences(t *testing.T) {
	m, im, daemon := exported(t, Config{Staged: true}, 4*PageSize)
	s, err := daemon.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src := bytes.Repeat([]byte("0123456789abcdef"), 64) // 1 KiB
	ps := []connector.Piece{
		{Off: 0, Len: 100, Dev: im.Addr() + 3*PageSize},
		{Off: 100, Len: 28, Dev: im.Addr() + 5},
		{Off: 512, Len: 512, Dev: im.Addr() + PageSize},
	}
	if err := s.ScatterToDevice(src, ps); err != nil {
		t.Fatal(err)
	}
	mustWait(t, s, nil)
	back := make([]byte, len(src))
	if err := s.GatherFromDevice(back, ps); err != nil {
		t.Fatal(err)
	}
	mustWait(t, s, nil)
	for i, p := range ps {
		if !bytes.Equal(back[p.Off:p.Off+p.Len], src[p.Off:p.Off+p.Len]) {
			t.Errorf("piece %d differs after the round trip", i)
		}
	}

	bad := []connector.Piece{{Off: 1000, Len: 100, Dev: im.Addr()}}
	if err := s.ScatterToDevice(src, bad); !errors.Is(err, unix.EINVAL) {
		t.Errorf("piece past the host buffer: %v, want EINVAL", err)
	}
	// Shrink the buffer to one page: a fence over a copy past it fails, the
	// next fence (a copy inside it) does not.
	if err := unix.Ftruncate(m.(*Memory).fd, PageSize); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyToDevice(im.Addr()+2*PageSize, src); err != nil {
		t.Fatal(err)
	}
	failed, _ := s.Fence()
	if err := s.CopyToDevice(im.Addr(), src); err != nil {
		t.Fatal(err)
	}
	mustWait(t, s, nil)
	if err := failed.Wait(); !errors.Is(err, unix.EFAULT) {
		t.Errorf("the fence over the faulting copy: %v, want EFAULT", err)
	}
	if err := s.Synchronize(); err != nil {
		t.Errorf("Synchronize after the fences reported everything: %v", err)
	}
}

// mustWait fences the copies queued so far and checks what the fence says.
func mustWait(t *testing.T, s connector.Stream, want error) {
	t.Helper()
	f, err := s.Fence()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Wait(); !errors.Is(err, want) {
		t.Fatalf("fence: %v, want %v", err, want)
	}
	if err := f.Wait(); !errors.Is(err, unix.EINVAL) {
		t.Errorf("second Wait: %v, want EINVAL", err)
	}
}

package emu

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
)

// TestStagedCopyIntoShrunkBufferFails: a client that registers its memfd
// and then shrinks it must get EFAULT from the copies that touch the pages
// now past its end, and the daemon (this process) must live on: the copy
// engine's MAP_SHARED alias raises SIGBUS there.
func TestStagedCopyIntoShrunkBufferFails(t *testing.T) {
	for _, keep := range []int64{0, 2 * PageSize} {
		m, im, daemon := exported(t, Config{Staged: true}, 4*PageSize)
		s, err := daemon.NewStream(0)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := unix.Ftruncate(m.(*Memory).fd, keep); err != nil {
			t.Fatal(err)
		}

		src := bytes.Repeat([]byte{0x5a}, PageSize)
		gone := im.Addr() + uint64(keep) + 100
		if err := s.CopyToDevice(gone, src); err != nil {
			t.Fatalf("enqueue a copy to the shrunk range: %v", err)
		}
		if err := s.Synchronize(); !errors.Is(err, unix.EFAULT) {
			t.Fatalf("keep %d: copy to the shrunk range: %v, want EFAULT", keep, err)
		}
		dst := make([]byte, PageSize)
		if err := s.CopyFromDevice(dst, gone); err != nil {
			t.Fatalf("enqueue a copy from the shrunk range: %v", err)
		}
		if err := s.Synchronize(); !errors.Is(err, unix.EFAULT) {
			t.Fatalf("keep %d: copy from the shrunk range: %v, want EFAULT", keep, err)
		}
		// The stream lives on, and what is left of the buffer still works.
		if keep > 0 {
			if err := roundTrip(s, im.Addr(), src); err != nil {
				t.Fatalf("keep %d: copies inside what is left: %v", keep, err)
			}
		}
	}
}

// exported allocates size bytes through a client connector and imports
// them through a daemon connector (this process plays both), as the daemon
// sees a registered buffer. Both mappings are freed when the test ends.
func exported(t *testing.T, cfg Config, size int64) (m, im connector.Memory, daemon *Connector) {
	t.Helper()
	m, err := newConn(t, cfg).Alloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	h, err := m.Export()
	if err != nil {
		t.Fatal(err)
	}
	daemon = newConn(t, cfg)
	if im, err = daemon.Import(0, h, size, os.Getpid()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { im.Close() })
	return m, im, daemon
}

// TestMapShrunkMemfd: the memfd may shrink between Import's size check and
// its mmap (MAP_POPULATE); mapping must not fault, and the copies must.
func TestMapShrunkMemfd(t *testing.T) {
	for _, staged := range []bool{false, true} {
		c := newConn(t, Config{Staged: staged})
		fd, err := unix.MemfdCreate(memfdPrefix+"-shrunk", unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		m, err := c.mapFd(0, fd, 2*PageSize, access{populate: true}) // the file has 0 bytes
		if err != nil {
			unix.Close(fd)
			t.Fatal(err)
		}
		s, err := c.NewStream(0)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.CopyToDevice(m.Addr(), make([]byte, 10)); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(); !errors.Is(err, unix.EFAULT) {
			t.Errorf("staged %v: copy into an empty memfd: %v, want EFAULT", staged, err)
		}
		s.Close()
		m.Close()
	}
}

// TestHostModeShrunkBufferFailsInKernel: in host mode the daemon touches an
// imported buffer only through kernel I/O, which returns EFAULT on pages
// past the end of a shrunk memfd.
func TestHostModeShrunkBufferFailsInKernel(t *testing.T) {
	m, im, daemon := exported(t, Config{}, 2*PageSize)
	if err := unix.Ftruncate(m.(*Memory).fd, 0); err != nil {
		t.Fatal(err)
	}
	host, err := daemon.Resolve(0, im.Addr(), PageSize)
	if err != nil || host == 0 {
		t.Fatalf("resolve: %#x, %v", host, err)
	}
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := unix.Pread(int(f.Fd()), im.(*Memory).view[:4096], 0); !errors.Is(err, unix.EFAULT) {
		t.Fatalf("read into a shrunk buffer: %v, want EFAULT", err)
	}
}

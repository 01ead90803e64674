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

// TestImportNeverFillsHoles: pages the exporter frees after the import
// (a punched hole) are never allocated again by the importer's accesses,
// which would charge them to the importer (the daemon's memory cgroup)
// while the exporter's memfd keeps them: a read(2) into the hole fails
// with EFAULT, a staged copy into or out of it too, and the memfd holds
// no more pages than the exporter left it. The pages left, and a page the
// exporter writes again, work as before.
func TestImportNeverFillsHoles(t *testing.T) {
	if ok, why := (&Connector{}).GuardReport(); !ok {
		t.Fatalf("no guard against filling holes: %s", why)
	}
	src, err := os.CreateTemp(t.TempDir(), "src")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if _, err := src.Write(bytes.Repeat([]byte{0x5a}, PageSize)); err != nil {
		t.Fatal(err)
	}
	for _, staged := range []bool{false, true} {
		m, im, daemon := exported(t, Config{Staged: staged}, 4*PageSize)
		fd := m.(*Memory).fd
		if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, PageSize, PageSize); err != nil {
			t.Fatal(err)
		}
		blocks := func() int64 {
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				t.Fatal(err)
			}
			return st.Blocks * 512
		}
		held := blocks()
		hole := im.Addr() + PageSize
		if staged {
			s, err := daemon.NewStream(0)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			s.CopyToDevice(hole, make([]byte, 100))
			if err := s.Synchronize(); !errors.Is(err, unix.EFAULT) {
				t.Errorf("staged copy into the hole: %v, want EFAULT", err)
			}
			s.CopyFromDevice(make([]byte, 100), hole)
			if err := s.Synchronize(); !errors.Is(err, unix.EFAULT) {
				t.Errorf("staged copy out of the hole: %v, want EFAULT", err)
			}
			if err := roundTrip(s, im.Addr(), bytes.Repeat([]byte{7}, 100)); err != nil {
				t.Errorf("staged copies into the page left: %v", err)
			}
		} else {
			view := im.(*Memory).view
			if n, err := unix.Pread(int(src.Fd()), view[PageSize:2*PageSize], 0); err != unix.EFAULT {
				t.Errorf("read(2) into the hole: %d, %v; want EFAULT", n, err)
			}
			if n, err := unix.Pwrite(int(src.Fd()), view[PageSize:PageSize+100], 0); err != unix.EFAULT {
				t.Errorf("write(2) out of the hole: %d, %v; want EFAULT", n, err)
			}
			if n, err := unix.Pread(int(src.Fd()), view[:PageSize], 0); err != nil || n != PageSize {
				t.Errorf("read(2) into the page left: %d, %v", n, err)
			}
		}
		if now := blocks(); now != held {
			t.Errorf("staged %v: the memfd held %d bytes after the hole, %d after the importer's accesses", staged, held, now)
		}
		fill := m.(*Memory).Bytes()[PageSize : 2*PageSize] // the exporter's own pages again
		for i := range fill {
			fill[i] = 1
		}
		if staged {
			continue
		}
		if n, err := unix.Pread(int(src.Fd()), im.(*Memory).view[PageSize:2*PageSize], 0); err != nil || n != PageSize {
			t.Errorf("read(2) into the page the exporter wrote again: %d, %v", n, err)
		}
	}
}

// TestReadOnlyImportNeverFillsHoles: memory shared read-only (a read-only
// descriptor, a write-sealed memfd) is guarded too: reading a hole the
// exporter made (shrinking and growing its memfd), the source of a write to a file, fails with EFAULT and
// allocates nothing.
func TestReadOnlyImportNeverFillsHoles(t *testing.T) {
	const size = 2 * PageSize
	src, err := os.CreateTemp(t.TempDir(), "dst")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for _, sealed := range []bool{false, true} {
		for _, staged := range []bool{false, true} {
			fd := memfd(t, size, size, unix.MFD_ALLOW_SEALING)
			share := reopen(t, fd, unix.O_RDONLY)
			if sealed {
				share = fd
				if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE); err != nil {
					t.Fatal(err)
				}
			}
			c := newConn(t, Config{Staged: staged})
			m, err := c.Import(0, handleOf(t, share, size), size, os.Getpid())
			if err != nil {
				t.Fatalf("sealed %v staged %v: %v", sealed, staged, err)
			}
			defer m.Close()
			// A hole by shrinking and growing again (a write seal forbids
			// punching one, not this).
			if err := unix.Ftruncate(fd, PageSize); err != nil {
				t.Fatal(err)
			}
			if err := unix.Ftruncate(fd, size); err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			unix.Fstat(fd, &st)
			held := st.Blocks
			if staged {
				s, err := c.NewStream(0)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				s.CopyFromDevice(make([]byte, 100), m.Addr()+PageSize)
				if err := s.Synchronize(); !errors.Is(err, unix.EFAULT) {
					t.Errorf("sealed %v: staged copy out of the hole: %v, want EFAULT", sealed, err)
				}
			} else if n, err := unix.Pwrite(int(src.Fd()), m.(*Memory).view[PageSize:PageSize+100], 0); err != unix.EFAULT {
				t.Errorf("sealed %v: write(2) out of the hole: %d, %v; want EFAULT", sealed, n, err)
			}
			unix.Fstat(fd, &st)
			if st.Blocks != held {
				t.Errorf("sealed %v staged %v: the memfd held %d blocks after the hole, %d after the importer's read", sealed, staged, held, st.Blocks)
			}
		}
	}
}

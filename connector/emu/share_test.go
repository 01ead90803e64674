package emu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
)

// What an import maps is what the exporter shares: memory it holds, never
// holes the daemon would fill (so the import populates nothing), and no
// more access than its descriptor gives.

// memfd makes an emu memfd of size bytes, alloc of them allocated (written
// by fallocate), and returns it with a handle that names descriptor fd of
// it (itself, or another descriptor the test opened).
func memfd(t *testing.T, size, alloc int64, flags int) int {
	t.Helper()
	fd, err := unix.MemfdCreate(memfdPrefix+"-share", unix.MFD_CLOEXEC|flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	if alloc > 0 {
		if err := unix.Fallocate(fd, 0, 0, alloc); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

// handleOf is the handle naming descriptor fd of this process, of size
// bytes, on device 0.
func handleOf(t *testing.T, fd int, size int64) connector.Handle {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	var h connector.Handle
	copy(h[0:8], handleMagic[:])
	binary.LittleEndian.PutUint32(h[8:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(h[12:], uint32(fd))
	binary.LittleEndian.PutUint64(h[16:], uint64(size))
	binary.LittleEndian.PutUint64(h[24:], st.Ino)
	return h
}

// reopen opens descriptor fd again through /proc with flags.
func reopen(t *testing.T, fd, flags int) int {
	t.Helper()
	n, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), flags|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(n) })
	return n
}

// rssShmem is this process's resident shared memory, in bytes.
func rssShmem(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "RssShmem:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no RssShmem in /proc/self/status")
	return 0
}

// TestImportSparseMemfd: a memfd ftruncated to 2 GiB and never written is
// no memory of its exporter's: importing it is EFAULT, and allocates
// nothing (its st_blocks stay 0). Registering the part that is allocated
// works.
func TestImportSparseMemfd(t *testing.T) {
	for _, staged := range []bool{false, true} {
		c := newConn(t, Config{Staged: staged})
		fd := memfd(t, 2<<30, 0, 0)
		if _, err := c.Import(0, handleOf(t, fd, 2<<30), 2<<30, os.Getpid()); !errors.Is(err, unix.EFAULT) {
			t.Fatalf("staged %v: import of a sparse 2 GiB memfd: %v, want EFAULT", staged, err)
		}
		var st unix.Stat_t
		unix.Fstat(fd, &st)
		if st.Blocks != 0 {
			t.Fatalf("staged %v: the refused import allocated %d bytes of the memfd", staged, st.Blocks*512)
		}
		// 1 MiB allocated: 1 MiB registers, 1 MiB + a page does not.
		if err := unix.Fallocate(fd, 0, 0, 1<<20); err != nil {
			t.Fatal(err)
		}
		m, err := c.Import(0, handleOf(t, fd, 2<<30), 1<<20, os.Getpid())
		if err != nil {
			t.Fatalf("staged %v: import of the allocated 1 MiB: %v", staged, err)
		}
		m.Close()
		if _, err := c.Import(0, handleOf(t, fd, 2<<30), 1<<20+PageSize, os.Getpid()); !errors.Is(err, unix.EFAULT) {
			t.Fatalf("staged %v: import past the allocated bytes: %v, want EFAULT", staged, err)
		}
	}
}

// TestImportPopulatesNothing: the import maps the exporter's pages without
// faulting them into the daemon: its resident shared memory does not grow
// by the buffer (it did by all of it with MAP_POPULATE), and the pages
// reach it as I/O touches them.
func TestImportPopulatesNothing(t *testing.T) {
	for _, staged := range []bool{false, true} {
		const size = 64 << 20
		c := newConn(t, Config{Staged: staged})
		fd := memfd(t, size, size, 0)
		before := rssShmem(t)
		m, err := c.Import(0, handleOf(t, fd, size), size, os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		grew := rssShmem(t) - before
		m.Close()
		if grew > size/8 {
			t.Errorf("staged %v: importing %d bytes made %d bytes resident in the importer", staged, size, grew)
		}
	}
}

// TestImportReadOnlyShare: a memfd shared through a read-only descriptor,
// or sealed against writes, is imported read-only: its bytes can be read
// (the source of a write to a file), and anything that would write them
// fails with EFAULT (the copy engine in staged mode, kernel I/O in host
// mode) and leaves them as they were. A write-only descriptor cannot be
// imported at all (EACCES).
func TestImportReadOnlyShare(t *testing.T) {
	const size = 2 * PageSize
	want := bytes.Repeat([]byte("phx!"), size/4)
	ro := func(t *testing.T) int {
		fd := memfd(t, size, size, 0)
		unix.Pwrite(fd, want, 0)
		return reopen(t, fd, unix.O_RDONLY)
	}
	sealed := func(t *testing.T) int {
		fd := memfd(t, size, size, unix.MFD_ALLOW_SEALING)
		unix.Pwrite(fd, want, 0)
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	for _, share := range []struct {
		name string
		fd   func(*testing.T) int
	}{{"O_RDONLY descriptor", ro}, {"F_SEAL_FUTURE_WRITE", sealed}} {
		for _, staged := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/staged=%v", share.name, staged), func(t *testing.T) {
				c := newConn(t, Config{Staged: staged})
				fd := share.fd(t)
				m, err := c.Import(0, handleOf(t, fd, size), size, os.Getpid())
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if !m.(*Memory).ReadOnly() {
					t.Errorf("imported read-write")
				}
				if staged {
					s, err := c.NewStream(0)
					if err != nil {
						t.Fatal(err)
					}
					defer s.Close()
					got := make([]byte, size)
					s.CopyFromDevice(got, m.Addr())
					if err := s.Synchronize(); err != nil || !bytes.Equal(got, want) {
						t.Fatalf("copy from the memory: %v", err)
					}
					s.CopyToDevice(m.Addr(), make([]byte, 100))
					if err := s.Synchronize(); !errors.Is(err, unix.EFAULT) {
						t.Fatalf("copy into read-only memory: %v, want EFAULT", err)
					}
				} else {
					f, err := os.Open("/proc/self/exe")
					if err != nil {
						t.Fatal(err)
					}
					defer f.Close()
					if _, err := unix.Pread(int(f.Fd()), m.(*Memory).view[:4096], 0); !errors.Is(err, unix.EFAULT) {
						t.Fatalf("read into read-only memory: %v, want EFAULT", err)
					}
				}
				got := make([]byte, size)
				unix.Pread(fd, got, 0)
				if !bytes.Equal(got, want) {
					t.Fatalf("the shared bytes changed")
				}
			})
		}
	}
	c := newConn(t, Config{})
	fd := memfd(t, size, size, 0)
	wo := reopen(t, fd, unix.O_WRONLY)
	if _, err := c.Import(0, handleOf(t, wo, size), size, os.Getpid()); !errors.Is(err, unix.EACCES) {
		t.Fatalf("import through a write-only descriptor: %v, want EACCES", err)
	}
	m, err := c.Import(0, handleOf(t, fd, size), size, os.Getpid())
	if err != nil || m.(*Memory).ReadOnly() {
		t.Fatalf("import through the read-write descriptor: %v, read-only %v", err, err == nil && m.(*Memory).ReadOnly())
	}
	m.Close()
}

package ioengine

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The test files hold their own offsets: every 8-byte little-endian word
// is the byte offset it starts at, so any misplaced byte is detectable.

// patternByte is the byte at file offset p.
func patternByte(p int64) byte {
	return byte(uint64(p&^7) >> (8 * uint(p&7)))
}

// fillPattern writes into b the pattern bytes of file offsets off...
func fillPattern(b []byte, off int64) {
	i := 0
	for ; i < len(b) && (off+int64(i))&7 != 0; i++ {
		b[i] = patternByte(off + int64(i))
	}
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(off+int64(i)))
	}
	for ; i < len(b); i++ {
		b[i] = patternByte(off + int64(i))
	}
}

// checkPattern reports the first byte of b that is not the pattern at off.
func checkPattern(t testing.TB, what string, b []byte, off int64) bool {
	t.Helper()
	for i := range b {
		if want := patternByte(off + int64(i)); b[i] != want {
			t.Errorf("%s: byte %d (file offset %d) = %#x, want %#x", what, i, off+int64(i), b[i], want)
			return false
		}
	}
	return true
}

// testDir is a directory on a real filesystem (tmpfs refuses O_DIRECT).
func testDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("/var/tmp", "phx-ioengine-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// skipIfNoDirect skips when dir's filesystem cannot do O_DIRECT.
func skipIfNoDirect(t testing.TB, dir string) {
	t.Helper()
	p := filepath.Join(dir, ".direct-probe")
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_RDWR|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Skipf("O_DIRECT is not supported under %s: %v", dir, err)
	}
	unix.Close(fd)
	os.Remove(p)
}

// patternFile creates a file of size bytes holding the pattern.
func patternFile(t testing.TB, dir string, size int64) string {
	t.Helper()
	b := make([]byte, size)
	fillPattern(b, 0)
	f, err := os.CreateTemp(dir, "pattern-")
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write(b)
	if err := errors.Join(err, f.Close()); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

func openFd(t testing.TB, path string, flags int) int {
	t.Helper()
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// mmapAnon returns page-aligned memory outside the Go heap, like the
// device mappings the engines serve.
func mmapAnon(t testing.TB, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// runner is one way of running ops: an engine directly, or a pool.
type runner struct {
	name string
	kind string
	run  func([]Op) error
}

// forEachRunner runs f on both engines, alone (default and tiny queue
// depth, so the window slides) and in a pool.
func forEachRunner(t *testing.T, f func(t *testing.T, r runner)) {
	t.Helper()
	type mk func(t *testing.T) (func([]Op) error, error)
	engine := func(kind string, qd int) mk {
		return func(t *testing.T) (func([]Op) error, error) {
			e, err := New(kind, qd)
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { e.Close() })
			if e.Name() != kind {
				t.Fatalf("New(%q).Name() = %q", kind, e.Name())
			}
			return e.Run, nil
		}
	}
	pool := func(kind string) mk {
		return func(t *testing.T) (func([]Op) error, error) {
			p, err := NewPool(PoolConfig{Kind: kind, Workers: 3, QueueDepth: 16})
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { p.Close() })
			if p.Name() != kind || p.Kind() != kind {
				t.Fatalf("pool of %q: Name %q Kind %q", kind, p.Name(), p.Kind())
			}
			return p.Run, nil
		}
	}
	for _, c := range []struct {
		name, kind string
		mk         mk
	}{
		{"io_uring", KindIOUring, engine(KindIOUring, 0)},
		{"io_uring-qd8", KindIOUring, engine(KindIOUring, 8)},
		{"sync", KindSync, engine(KindSync, 0)},
		{"pool-io_uring", KindIOUring, pool(KindIOUring)},
		{"pool-sync", KindSync, pool(KindSync)},
	} {
		t.Run(c.name, func(t *testing.T) {
			run, err := c.mk(t)
			if err != nil {
				t.Skipf("cannot create %s: %v", c.name, err)
			}
			f(t, runner{c.name, c.kind, run})
		})
	}
}

func errno(res int64) error {
	if res >= 0 {
		return nil
	}
	return unix.Errno(-res)
}

func isErrno(err error, e unix.Errno) bool { return errors.Is(err, e) }

// requireUring skips t, saying why, where no ring can be created (a
// seccomp profile or kernel.io_uring_disabled).
func requireUring(t testing.TB) {
	t.Helper()
	e, err := newUring(8)
	if err != nil {
		t.Skipf("io_uring unavailable here: %v", err)
	}
	e.Close()
}

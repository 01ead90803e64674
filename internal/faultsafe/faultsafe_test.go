package faultsafe

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCopyOfPagesThatAreGone: a shared mapping of a file truncated under
// it faults (SIGBUS); Copy returns EFAULT and the process lives on.
func TestCopyOfPagesThatAreGone(t *testing.T) {
	fd, err := unix.MemfdCreate("faultsafe", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	const size = 4 * 4096
	unix.Ftruncate(fd, size)
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	buf := make([]byte, size)
	if err := Copy("test memory", mem, mem, buf); err != nil {
		t.Fatalf("copy into live pages: %v", err)
	}
	unix.Ftruncate(fd, 4096)
	if err := Copy("test memory", mem, mem, buf); !errors.Is(err, unix.EFAULT) {
		t.Fatalf("copy into truncated pages: %v, want EFAULT", err)
	}
	if err := Copy("test memory", mem, buf, mem); !errors.Is(err, unix.EFAULT) {
		t.Fatalf("copy out of truncated pages: %v, want EFAULT", err)
	}
	if err := Copy("test memory", mem, mem[:4096], buf[:4096]); err != nil {
		t.Fatalf("copy into the page that is left: %v", err)
	}
}

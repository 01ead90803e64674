package main

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A cold row is timed only when the file is known to be cold: the caches
// were dropped and none of the data section is resident. Otherwise the row
// is "not run", with the reason, and carries no number: a cold figure
// measured on a warm cache is the page-cache rate under the wrong name.

// dropCaches writes back dirty pages and drops the page cache (root).
func dropCaches() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
}

// makeCold drops the caches and checks that none of [off, off+n) of fd is
// resident. It returns why the file is not cold, "" when it is.
func makeCold(fd int, off, n int64) string {
	if err := dropCaches(); err != nil {
		return fmt.Sprintf("caches not dropped: %v", err)
	}
	return coldness(fd, off, n)
}

// coldness is why [off, off+n) of fd is not cold, "" when none of it is in
// the page cache.
func coldness(fd int, off, n int64) string {
	cached, err := residentBytes(fd, off, n)
	if err != nil {
		return fmt.Sprintf("residency unknown: %v", err)
	}
	if cached > 0 {
		return fmt.Sprintf("%d of %d bytes still in the page cache after dropping it", cached, n)
	}
	return ""
}

// residentBytes is how many bytes of the pages of [off, off+n) of fd the
// page cache holds (mincore(2) on a mapping of the range, which reads
// nothing).
func residentBytes(fd int, off, n int64) (int64, error) {
	if n <= 0 {
		return 0, nil
	}
	page := int64(os.Getpagesize())
	at := off / page * page
	size := off + n - at
	m, err := unix.Mmap(fd, at, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("mmap %d bytes at %d: %w", size, at, err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (size+page-1)/page)
	_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(size), uintptr(unsafe.Pointer(&vec[0])))
	if e != 0 {
		return 0, fmt.Errorf("mincore: %w", e)
	}
	var pages int64
	for _, v := range vec {
		pages += int64(v & 1)
	}
	return pages * page, nil
}

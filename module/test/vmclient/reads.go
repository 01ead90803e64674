// The reads that land file bytes in the registered range: READ with
// O_DIRECT, BATCH_READ, and READ on a buffered open.
package main

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
)

// readOne: one READ ioctl, O_DIRECT, 2 MiB.
func readOne(v *vm, f *client.File, buf client.Buffer) error {
	const bufOff, fileOff, n = 0, 4 * mib, 2 * mib
	got, err := f.Read(buf, bufOff, n, fileOff)
	if err != nil || got != n {
		return fmt.Errorf("READ %d bytes at file offset %#x: %d, %v", n, fileOff, got, err)
	}
	v.expect(bufOff, fileOff, n)
	if err := v.verify("READ"); err != nil {
		return err
	}
	ok("READ ioctl landed %d MiB of the file in the BAR (O_DIRECT)", n/mib)
	return nil
}

// readBatch: one BATCH_READ with extents that land, merge, stop at end of
// file, and fail one by one without moving a byte.
func readBatch(v *vm, f *client.File, buf client.Buffer) error {
	type want struct {
		result int64 // bytes, or -errno
		landed int64 // bytes that land (a short read lands result bytes)
		what   string
	}
	ext := []client.Extent{
		{Buffer: buf.ID, BufOffset: 5 * mib, Len: 512 * kib, FileOffset: 40 * mib},
		{Buffer: buf.ID, BufOffset: 2 * mib, Len: 1 * mib, FileOffset: 16 * mib},
		{Buffer: buf.ID, BufOffset: 3 * mib, Len: 1 * mib, FileOffset: 17 * mib}, // follows on: merged
		// not aligned for O_DIRECT: the storage read fails, nothing lands
		{Buffer: buf.ID, BufOffset: 6 * mib, Len: 4096, FileOffset: 1000},
		// runs past the registration into the guard: refused before I/O
		{Buffer: buf.ID, BufOffset: bufSize - 64*kib, Len: 128 * kib, FileOffset: 20 * mib},
		// no such buffer
		{Buffer: buf.ID + 1000, BufOffset: 0, Len: 64 * kib, FileOffset: 0},
		// crosses the end of the file: short
		{Buffer: buf.ID, BufOffset: 7 * mib, Len: 128 * kib, FileOffset: fileLen - 64*kib},
		{Buffer: buf.ID, BufOffset: 4 * mib, Len: 256 * kib, FileOffset: 60 * mib},
	}
	wants := []want{
		{512 * kib, 512 * kib, "aligned extent"},
		{1 * mib, 1 * mib, "aligned extent"},
		{1 * mib, 1 * mib, "extent that follows on"},
		{-int64(unix.EINVAL), 0, "unaligned O_DIRECT extent"},
		{-int64(unix.EFAULT), 0, "extent past the registration"},
		{-int64(unix.ENOENT), 0, "unknown buffer"},
		{64 * kib, 64 * kib, "extent across end of file"},
		{256 * kib, 256 * kib, "aligned extent"},
	}
	if nfs {
		// NFS reads O_DIRECT at any offset: the extent lands.
		wants[3] = want{4096, 4096, "unaligned O_DIRECT extent (NFS takes any offset)"}
	}
	failed, err := f.ReadBatch(ext)
	if err != nil {
		return fmt.Errorf("BATCH_READ: %w", err)
	}
	nfail := 0
	for i, e := range ext {
		w := wants[i]
		if e.Result != w.result {
			return fmt.Errorf("BATCH_READ extent %d (%s, %+v): result %d, want %d", i, w.what, e, e.Result, w.result)
		}
		if e.Result != e.Len {
			nfail++
		}
		if w.landed > 0 {
			v.expect(e.BufOffset, e.FileOffset, w.landed)
		}
		if e.FileOffset+e.Len > fileLen && e.Result > 0 {
			v.pastEOF = append(v.pastEOF, [2]int64{e.BufOffset + e.Result, e.BufOffset + e.Len})
		}
	}
	if failed != nfail {
		return fmt.Errorf("BATCH_READ: %d failed extents reported, want %d", failed, nfail)
	}
	if err := v.verify("BATCH_READ"); err != nil {
		return err
	}
	ok("BATCH_READ of %d extents: %s landed (one merged, one short at end of file: the bytes past it hold 0 or the fill), %s, EFAULT past the registration, ENOENT for an unknown id",
		len(ext), map[bool]string{false: "5", true: "6"}[nfs], map[bool]string{false: "EINVAL for the unaligned one", true: "the unaligned one too (NFS)"}[nfs])
	ok("every byte of the registration and its guard checked: refused and failed extents moved no byte")
	return nil
}

// readBuffered: READ on a second, buffered open of the file: an offset
// and a buffer offset no O_DIRECT read could take land through the page
// cache (a CPU copy into the daemon's mapping of the device pages).
func readBuffered(v *vm, file string, buf client.Buffer) error {
	const bufOff, fileOff, n = 7*mib + 256*kib + 3, 8 * 12345, 100000
	g, err := client.Open(file)
	if err != nil {
		return err
	}
	defer g.Close()
	// the buffer was registered on the O_DIRECT file; any file of the
	// mount may name it
	got, err := g.Read(buf, bufOff, n, fileOff)
	if err != nil || got != n {
		return fmt.Errorf("buffered READ of %d bytes at file offset %d into buffer offset %#x: %d, %v", n, fileOff, bufOff, got, err)
	}
	v.expect(bufOff, fileOff, n)
	if err := v.verify("buffered READ"); err != nil {
		return err
	}
	ok("READ on a buffered open: %d bytes at unaligned file and buffer offsets landed", n)
	return nil
}

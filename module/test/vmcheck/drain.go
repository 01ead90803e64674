// The drain checks: phxfs waits until nothing holds pages of a
// registration before it gives them back (UNMAP, munmap, revocation), and
// never waits with a lock held that the holder may need.
//
// The holder is a pipe filled by vmsplice from the mapping: vmsplice takes
// a page reference per page (GUP, as O_DIRECT does) and the pipe keeps it
// until it is read or closed, so the test decides when the "I/O in flight"
// ends. The bytes read from the pipe are then the device memory's.
//
// revoke.go holds the revocation's drain check.
package main

import (
	"errors"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"phxmount/connector/pcibar"
	"phxmount/kmod"
)

// held is what a pipe holds: 16 pages, a pipe's default capacity.
const held = 64 << 10

// pagePipe is a pipe holding references on pages spliced into it.
type pagePipe struct{ r, w int }

// holdPages splices b (at most held bytes) into a new pipe.
func holdPages(b []byte) (*pagePipe, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, err
	}
	pp := &pagePipe{r: p[0], w: p[1]}
	n, err := splice(pp.w, b)
	if err != nil || n != len(b) {
		pp.close()
		return nil, fmt.Errorf("vmsplice %d bytes of the mapping: %d, %v", len(b), n, err)
	}
	return pp, nil
}

func splice(w int, b []byte) (int, error) {
	iov := []unix.Iovec{{Base: &b[0]}}
	iov[0].SetLen(len(b))
	return unix.Vmsplice(w, iov, 0)
}

// read reads n bytes (the pipe then lets go of their pages).
func (pp *pagePipe) read(n int) ([]byte, error) {
	b := make([]byte, n)
	for got := 0; got < n; {
		k, err := unix.Read(pp.r, b[got:])
		if err != nil {
			return nil, err
		}
		if k == 0 {
			return nil, fmt.Errorf("pipe: EOF after %d of %d bytes", got, n)
		}
		got += k
	}
	return b, nil
}

// close lets go of whatever the pipe still holds (no user memory touched).
func (pp *pagePipe) close() {
	unix.Close(pp.r)
	unix.Close(pp.w)
}

// spliceFault splices b into a pipe of its own and returns the error.
func spliceFault(b []byte) error {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return err
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	_, err := splice(p[1], b)
	return err
}

// resident reports whether the first page of b has a PTE (mincore).
func resident(b []byte) (bool, error) {
	vec := []byte{0}
	_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])),
		uintptr(os.Getpagesize()), uintptr(unsafe.Pointer(&vec[0])))
	if e != 0 {
		return false, e
	}
	return vec[0]&1 != 0, nil
}

// rawMap mmaps vmaSize bytes of d and MAPs size bytes of devAddr at the
// start of it, leaving the rest of the VMA without a registration.
func rawMap(d *kmod.Device, vmaSize, size int, devAddr uint64) ([]byte, error) {
	b, err := unix.Mmap(d.Fd(), 0, vmaSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	args := mapArgs(d, b, size, devAddr)
	if err := d.Ioctl(kmod.IoctlMap, &args); err != nil {
		unix.Munmap(b)
		return nil, err
	}
	return b, nil
}

func mapArgs(d *kmod.Device, b []byte, size int, devAddr uint64) kmod.MapArgs {
	return kmod.MapArgs{
		DevID:    uint64(d.Index()),
		HostAddr: uint64(uintptr(unsafe.Pointer(&b[0]))),
		HostSize: uint64(size),
		DevAddr:  devAddr,
		DevSize:  uint64(size),
	}
}

func registrations() int64 {
	n, err := kmod.ReadAttrInt(0, "registrations")
	if err != nil {
		return -1
	}
	return n
}

// waitRegistrations polls until registrations is want (10 s at most).
func waitRegistrations(want int64) error {
	for i := 0; ; i++ {
		n := registrations()
		if n == want {
			return nil
		}
		if i == 1000 {
			return fmt.Errorf("registrations %d, want %d", n, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func drainChecks(conn *pcibar.Connector, dev *kmod.Device, fd int) error {
	if err := unmapWaits(conn, dev, fd); err != nil {
		return fmt.Errorf("unmap-waits: %w", err)
	}
	if err := munmapDefers(conn); err != nil {
		return fmt.Errorf("munmap-defers: %w", err)
	}
	if err := revokeUnlocked(conn); err != nil {
		return fmt.Errorf("revoke-unlocked: %w", err)
	}
	if err := unmapDuringDirectIO(conn, dev, fd); err != nil {
		return fmt.Errorf("unmap-during-o_direct: %w", err)
	}
	return nil
}

// unmapWaits: UNMAP while a pipe holds pages of the registration waits
// until the pipe lets go; the bytes read from the pipe are the ones an
// O_DIRECT read landed in device memory.
func unmapWaits(conn *pcibar.Connector, dev *kmod.Device, fd int) error {
	const size = 1 << 20
	const fileOff = 3 << 20
	before := registrations()
	m, mp, err := mapAlloc(conn, dev, size)
	if err != nil {
		return err
	}
	defer m.Close()
	if n, err := unix.Pread(fd, mp.Bytes(), fileOff); err != nil || n != size {
		return fmt.Errorf("O_DIRECT pread: %d, %v", n, err)
	}
	pp, err := holdPages(mp.Bytes()[:held])
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- mp.Unmap() }()
	select {
	case err := <-done:
		pp.close()
		return fmt.Errorf("UNMAP returned (%v) while a pipe held pages of the registration", err)
	case <-time.After(500 * time.Millisecond):
	}
	if n := registrations(); n != before+1 {
		pp.close()
		<-done
		return fmt.Errorf("registrations %d while UNMAP waits, want %d", n, before+1)
	}
	ok("UNMAP waits while a pipe holds %d KiB of the mapping's pages (vmsplice)", held>>10)
	got, err := pp.read(held)
	pp.close()
	if err != nil {
		<-done
		return err
	}
	select {
	case err := <-done:
		if err != nil {
			return err
		}
	case <-time.After(10 * time.Second):
		return errors.New("UNMAP still waiting 10 s after the pipe let go")
	}
	if err := checkPattern(got, fileOff, "bytes read from the pipe"); err != nil {
		return err
	}
	if n := registrations(); n != before {
		return fmt.Errorf("registrations %d after UNMAP, want %d", n, before)
	}
	ok("UNMAP returned once the pipe let go; its %d KiB are the file's bytes", held>>10)
	return nil
}

// munmapDefers: munmap (vm_ops close, under mmap_lock) does not wait for a
// holder of the pages, but the registration is released only once the
// holder lets go (by a worker).
func munmapDefers(conn *pcibar.Connector) error {
	const size = 1 << 20
	before := registrations()
	d, err := kmod.Open(0)
	if err != nil {
		return err
	}
	defer d.Close()
	m, err := conn.Alloc(0, size)
	if err != nil {
		return err
	}
	defer m.Close()
	b, err := rawMap(d, size, size, m.Addr())
	if err != nil {
		return err
	}
	patternAt(b[:held], 11<<30)
	pp, err := holdPages(b[:held])
	if err != nil {
		unix.Munmap(b)
		return err
	}
	start := time.Now()
	if err := unix.Munmap(b); err != nil {
		pp.close()
		return err
	}
	took := time.Since(start)
	if n := registrations(); n != before+1 {
		pp.close()
		return fmt.Errorf("registrations %d after munmap while a pipe holds its pages, want %d (released without waiting)", n, before+1)
	}
	if took > 2*time.Second {
		pp.close()
		return fmt.Errorf("munmap took %v: it waited for the pipe", took)
	}
	ok("munmap returns at once (%v) while a pipe holds pages; the registration stays", took.Round(time.Microsecond))
	got, err := pp.read(held)
	pp.close()
	if err != nil {
		return err
	}
	if err := waitRegistrations(before); err != nil {
		return fmt.Errorf("after the pipe let go: %w", err)
	}
	if err := checkPattern(got, 11<<30, "bytes read from the pipe"); err != nil {
		return err
	}
	ok("released once the pipe let go; its %d KiB are the device memory's", held>>10)
	return nil
}

// unmapDuringDirectIO: UNMAP (and munmap) while O_DIRECT reads into the
// mapping are in flight. UNMAP succeeds, each read either completes or
// fails with EFAULT, and a completed read's bytes are right in device
// memory (seen through a second registration of the same memory).
func unmapDuringDirectIO(conn *pcibar.Connector, dev *kmod.Device, fd int) error {
	const size = 16 << 20
	const fileOff = 40 << 20
	before := registrations()
	d2, err := kmod.Open(0)
	if err != nil {
		return err
	}
	defer d2.Close()
	completed, faulted := 0, 0
	for _, delay := range []time.Duration{0, time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond} {
		full, err := unmapDuringRead(conn, dev, d2, fd, size, fileOff, delay)
		if err != nil {
			return fmt.Errorf("UNMAP %v into the read: %w", delay, err)
		}
		if full {
			completed++
		} else {
			faulted++
		}
	}
	if n := registrations(); n != before {
		return fmt.Errorf("registrations %d afterwards, want %d", n, before)
	}
	ok("UNMAP during O_DIRECT reads of %d MiB: %d reads completed with the right bytes, %d failed with EFAULT", size>>20, completed, faulted)
	return nil
}

// unmapDuringRead runs one read and, delay after it started, an UNMAP
// (the VMA stays until the read has returned, so that a late read cannot
// land in memory mapped there afterwards); returns whether the read
// completed.
func unmapDuringRead(conn *pcibar.Connector, dev, d2 *kmod.Device, fd int, size int64, fileOff int64, delay time.Duration) (bool, error) {
	m, err := conn.Alloc(0, size)
	if err != nil {
		return false, err
	}
	defer m.Close()
	view, err := d2.Map(m.Addr(), size)
	if err != nil {
		return false, err
	}
	defer view.Unmap()
	scribble(view.Bytes())
	b, err := rawMap(dev, int(size), int(size), m.Addr())
	if err != nil {
		return false, err
	}
	defer unix.Munmap(b)
	type result struct {
		n   int
		err error
	}
	read := make(chan result, 1)
	go func() {
		n, err := unix.Pread(fd, b, fileOff)
		read <- result{n, err}
	}()
	time.Sleep(delay)
	args := mapArgs(dev, b, int(size), m.Addr())
	uerr := dev.Ioctl(kmod.IoctlUnmap, &args)
	r := <-read
	if uerr != nil {
		return false, fmt.Errorf("UNMAP: %w", uerr)
	}
	switch {
	case r.err == nil && r.n == int(size):
		return true, checkPattern(view.Bytes(), fileOff, "device memory after the read")
	case errors.Is(r.err, unix.EFAULT):
		return false, nil
	default:
		return false, fmt.Errorf("O_DIRECT pread: %d, %v (want %d or EFAULT)", r.n, r.err, size)
	}
}

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
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/kmod"
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

// letGo reads the held bytes out of the pipe and closes it, then waits
// (10 s at most) for done, the end of what waited for the pipe to let go:
// the call named what. The bytes read must be the pattern at off.
func (pp *pagePipe) letGo(off int64, done <-chan error, what string) error {
	got, err := pp.read(held)
	pp.close()
	if err != nil {
		<-done
		return err
	}
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s still waiting 10 s after the pipe let go", what)
	}
	return checkPattern(got, off, "bytes read from the pipe")
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

// rawMapping is BAR memory registered at the start of a VMA of a device
// descriptor of its own by the MAP ioctl: the checks munmap or UNMAP it
// themselves.
type rawMapping struct {
	d *kmod.Device
	m connector.Memory
	b []byte // the whole VMA
}

// newRawMapping allocates size bytes of BAR and registers them at the
// start of a VMA of vmaSize bytes of a new descriptor of phxfs_dev0.
func (e *env) newRawMapping(vmaSize, size int) (*rawMapping, error) {
	d, err := kmod.Open(0)
	if err != nil {
		return nil, err
	}
	m, err := e.conn.Alloc(0, int64(size))
	if err != nil {
		d.Close()
		return nil, err
	}
	b, err := rawMap(d, vmaSize, size, m.Addr())
	if err != nil {
		m.Close()
		d.Close()
		return nil, err
	}
	return &rawMapping{d: d, m: m, b: b}, nil
}

// close frees the memory and closes the descriptor; the VMA stays the
// caller's to munmap.
func (r *rawMapping) close() {
	r.m.Close()
	r.d.Close()
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

// drainChecks runs the drain checks in order. Each is given the module's
// registrations when it starts (before) and must leave them as they were.
func drainChecks(e *env) error {
	for _, c := range []struct {
		name  string
		check func(e *env, before int64) error
	}{
		{"unmap-waits", unmapWaits},
		{"munmap-defers", munmapDefers},
		{"revoke-unlocked", revokeUnlocked},
		{"unmap-during-o_direct", unmapDuringDirectIO},
	} {
		before := registrations()
		if err := c.check(e, before); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		if n := registrations(); n != before {
			return fmt.Errorf("%s: registrations %d afterwards, want %d", c.name, n, before)
		}
	}
	return nil
}

// unmapWaits: UNMAP while a pipe holds pages of the registration waits
// until the pipe lets go; the bytes read from the pipe are the ones an
// O_DIRECT read landed in device memory.
func unmapWaits(e *env, before int64) error {
	const size = 1 << 20
	const fileOff = 3 << 20
	m, mp, err := e.mapAlloc(size)
	if err != nil {
		return err
	}
	defer m.Close()
	if n, err := unix.Pread(e.fd, mp.Bytes(), fileOff); err != nil || n != size {
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
	if err := pp.letGo(fileOff, done, "UNMAP"); err != nil {
		return err
	}
	ok("UNMAP returned once the pipe let go; its %d KiB are the file's bytes", held>>10)
	return nil
}

// munmapDefers: munmap (vm_ops close, under mmap_lock) does not wait for a
// holder of the pages, but the registration is released only once the
// holder lets go (by a worker).
func munmapDefers(e *env, before int64) error {
	const size = 1 << 20
	r, err := e.newRawMapping(size, size)
	if err != nil {
		return err
	}
	defer r.close()
	patternAt(r.b[:held], 11<<30)
	pp, err := holdPages(r.b[:held])
	if err != nil {
		unix.Munmap(r.b)
		return err
	}
	start := time.Now()
	if err := unix.Munmap(r.b); err != nil {
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
func unmapDuringDirectIO(e *env, _ int64) error {
	const size = 16 << 20
	const fileOff = 40 << 20
	d2, err := kmod.Open(0)
	if err != nil {
		return err
	}
	defer d2.Close()
	completed, faulted := 0, 0
	for _, delay := range []time.Duration{0, time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond} {
		full, err := e.unmapDuringRead(d2, size, fileOff, delay)
		if err != nil {
			return fmt.Errorf("UNMAP %v into the read: %w", delay, err)
		}
		if full {
			completed++
		} else {
			faulted++
		}
	}
	ok("UNMAP during O_DIRECT reads of %d MiB: %d reads completed with the right bytes, %d failed with EFAULT", size>>20, completed, faulted)
	return nil
}

// unmapDuringRead runs one read and, delay after it started, an UNMAP
// (the VMA stays until the read has returned, so that a late read cannot
// land in memory mapped there afterwards); returns whether the read
// completed.
func (e *env) unmapDuringRead(d2 *kmod.Device, size int64, fileOff int64, delay time.Duration) (bool, error) {
	m, err := e.conn.Alloc(0, size)
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
	b, err := rawMap(e.dev, int(size), int(size), m.Addr())
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
		n, err := unix.Pread(e.fd, b, fileOff)
		read <- result{n, err}
	}()
	time.Sleep(delay)
	args := mapArgs(e.dev, b, int(size), m.Addr())
	uerr := e.dev.Ioctl(kmod.IoctlUnmap, &args)
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

// The revoke checks: the vendor takes the memory back under a mapping
// (the emu backend's test hook runs the free-callback path), and the
// revocation drains the holders of its pages with no lock held (the pipe
// holders of drain.go).
package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/kmod"
)

// revokeRange has the vendor take [addr, addr+size) back: the emu
// backend's test hook runs its free-callback path.
func revokeRange(addr uint64, size int) error {
	return os.WriteFile(kmod.SysfsDir(0)+"/revoke", []byte(fmt.Sprintf("%#x %#x", addr, size)), 0)
}

// revoke: the vendor takes the memory back: PTEs zapped, I/O into it
// fails, UNMAP still cleans up.
func revoke(e *env) error {
	const size = 1 << 20
	before := registrations()
	m, mp, err := e.mapAlloc(size)
	if err != nil {
		return err
	}
	if err := revokeRange(m.Addr(), size); err != nil {
		return err
	}
	if _, err := unix.Pread(e.fd, mp.Bytes(), 0); !errors.Is(err, unix.EFAULT) {
		return fmt.Errorf("O_DIRECT pread into revoked registration: %v, want EFAULT", err)
	}
	ok("I/O into a revoked registration fails with EFAULT")
	if !smapsHas(mp.Host, "mm", "dc", "de", "dd") {
		return errors.New("smaps VmFlags of the mapping lack mm dc de dd")
	}
	ok("the VMA is VM_MIXEDMAP, VM_DONTCOPY, VM_DONTEXPAND, VM_DONTDUMP")
	if err := mp.Unmap(); err != nil {
		return fmt.Errorf("UNMAP of a revoked registration: %w", err)
	}
	if n := registrations(); n != before {
		return fmt.Errorf("registrations %d after UNMAP of the revoked one, %d before", n, before)
	}
	ok("UNMAP of a revoked registration releases it")
	return m.Close()
}

// smapsHas reports whether the VMA at addr has every VmFlags flag.
func smapsHas(addr uintptr, flags ...string) bool {
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return false
	}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			r := strings.SplitN(f[0], "-", 2)
			lo, _ := strconv.ParseUint(r[0], 16, 64)
			hi, _ := strconv.ParseUint(r[1], 16, 64)
			in = uint64(addr) >= lo && uint64(addr) < hi
			continue
		}
		if in && len(f) > 0 && f[0] == "VmFlags:" {
			have := map[string]bool{}
			for _, x := range f[1:] {
				have[x] = true
			}
			for _, x := range flags {
				if !have[x] {
					return false
				}
			}
			return true
		}
	}
	return false
}

// revokeUnlocked: a revocation waits for the holders of the revoked pages
// with no lock held. While it waits, a GUP that faults on the same VMA
// (vmsplice from a page with no registration: the fault handler takes the
// VMA's lock) fails with EFAULT at once, and mmap of the device (the
// device's lock) succeeds; with the locks held they waited for the
// revocation, and a GUP holding pins on the revoked pages while faulting
// on the next one deadlocked against it.
func revokeUnlocked(e *env, _ int64) error {
	const vma = 2 << 20
	const size = 1 << 20
	r, err := e.newRawMapping(vma, size)
	if err != nil {
		return err
	}
	defer r.close()
	defer unix.Munmap(r.b)
	patternAt(r.b[:held], 13<<30)
	if res, err := resident(r.b); err != nil || !res {
		return fmt.Errorf("mincore of a mapped page: %v, %v (want resident)", res, err)
	}
	pp, err := holdPages(r.b[:held])
	if err != nil {
		return err
	}
	revoked := make(chan error, 1)
	go func() { revoked <- revokeRange(r.m.Addr(), size) }()
	if err := revokeWaiting(r.b, revoked); err != nil {
		pp.close()
		return err
	}
	if err := whileRevoking(r.d, r.b[size:], pp, revoked); err != nil {
		return err
	}
	if err := pp.letGo(13<<30, revoked, "the revocation"); err != nil {
		return err
	}
	ok("the revocation returned once the pipe let go; its %d KiB are the device memory's", held>>10)
	args := mapArgs(r.d, r.b, size, r.m.Addr())
	if err := r.d.Ioctl(kmod.IoctlUnmap, &args); err != nil {
		return fmt.Errorf("UNMAP of the revoked registration: %w", err)
	}
	return nil
}

// revokeWaiting waits until the revocation has zapped the PTEs (it waits
// for the pipe after that) and checks that it has not returned.
func revokeWaiting(b []byte, revoked chan error) error {
	for i := 0; ; i++ {
		select {
		case err := <-revoked:
			return fmt.Errorf("the revocation returned (%v) while a pipe held its pages", err)
		default:
		}
		r, err := resident(b)
		if err != nil {
			return err
		}
		if !r {
			return nil
		}
		if i == 500 {
			return errors.New("the revocation did not zap the PTEs within 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
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

// whileRevoking: a faulting GUP on the VMA (at free, a page with no
// registration) and an mmap of the device do not wait for the revocation.
// On failure the pipe is closed, so that the revocation and the stuck
// calls finish.
func whileRevoking(d *kmod.Device, free []byte, pp *pagePipe, revoked chan error) error {
	stuck := func(what string, c chan error) error {
		pp.close()
		<-revoked
		<-c
		return fmt.Errorf("%s waited for the revocation's drain (locks held while draining)", what)
	}
	faulted := make(chan error, 1)
	go func() { faulted <- spliceFault(free[:4096]) }()
	select {
	case err := <-faulted:
		if !errors.Is(err, unix.EFAULT) {
			pp.close()
			return fmt.Errorf("vmsplice from a page with no registration: %v, want EFAULT", err)
		}
	case <-time.After(3 * time.Second):
		return stuck("a GUP faulting on the VMA", faulted)
	}
	ok("while a revocation waits for a pipe: a GUP faulting on the same VMA gets EFAULT at once")
	mapped := make(chan error, 1)
	go func() {
		b, err := unix.Mmap(d.Fd(), 0, 64<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err == nil {
			err = unix.Munmap(b)
		}
		mapped <- err
	}()
	select {
	case err := <-mapped:
		if err != nil {
			pp.close()
			return fmt.Errorf("mmap of the device: %w", err)
		}
	case <-time.After(3 * time.Second):
		return stuck("mmap of the device", mapped)
	}
	select {
	case err := <-revoked:
		pp.close()
		return fmt.Errorf("the revocation returned (%v) while the pipe held its pages", err)
	default:
	}
	ok("while a revocation waits for a pipe: mmap of the device succeeds; the revocation still waits")
	return nil
}

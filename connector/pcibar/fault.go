package pcibar

import (
	"runtime/debug"
	"unsafe"

	"golang.org/x/sys/unix"

	"phxmount/internal/errs"
)

// copyGuarded copies src to dst, one of which lies in bar, a CPU mapping of
// a BAR. The BAR is not client memory (a client cannot shrink it), but its
// mapping can still fault (a surprise-removed device; the sysfs resource
// file standing in for it in tests shrinking), and the daemon must fail the
// copy then, not die: the copy runs with SetPanicOnFault and a fault inside
// bar is returned as EFAULT. Any other panic is a bug and is not recovered.
func copyGuarded(bar, dst, src []byte) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if f, ok := r.(interface{ Addr() uintptr }); ok && inside(bar, f.Addr()) {
			err = errs.New(unix.EFAULT, "pcibar: BAR mapping at %#x faulted: %v", f.Addr(), r)
			return
		}
		panic(r)
	}()
	copy(dst, src)
	return nil
}

func inside(b []byte, addr uintptr) bool {
	if len(b) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&b[0]))
	return addr >= lo && addr-lo < uintptr(len(b))
}

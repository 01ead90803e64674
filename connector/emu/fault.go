package emu

import (
	"runtime/debug"
	"unsafe"

	"golang.org/x/sys/unix"

	"phxmount/internal/errs"
)

// copyGuarded copies src to dst, one of which is client memory (an
// imported buffer's alias). The client can make those pages fault at any
// time (ftruncate its memfd smaller: SIGBUS on a MAP_SHARED mapping), and
// the daemon must then fail the request, not die, so the copy runs with
// SetPanicOnFault and a fault inside mem is returned as EFAULT. Any other
// panic is a bug and is not recovered.
func copyGuarded(mem, dst, src []byte) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true)) // restored on return
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if f, ok := r.(interface{ Addr() uintptr }); ok && inside(mem, f.Addr()) {
			err = errs.New(unix.EFAULT, "emu: device memory at %#x faulted (the buffer shrank?): %v", f.Addr(), r)
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

// Package faultsafe copies memory that may fault under the copier: a
// client's shared memory that the client can shrink (a MAP_SHARED mapping
// past the end of its file raises SIGBUS), or a device BAR that can go
// away. The daemon must then fail the one request, not die.
package faultsafe

import (
	"runtime/debug"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// Copy copies src to dst, one of which lies in mem, the memory that may
// fault. It runs with SetPanicOnFault, and a fault inside mem comes back
// as an error wrapping EFAULT that names what (for example "emu: device
// memory"). Any other panic is a bug and is not recovered.
func Copy(what string, mem, dst, src []byte) error {
	return Run(what, mem, func() { copy(dst, src) })
}

// Run runs fn, which reads or writes mem, with SetPanicOnFault: a fault
// inside mem comes back as an error wrapping EFAULT that names what, and
// whatever fn had done before it stays done. Any other panic is a bug and
// is not recovered.
func Run(what string, mem []byte, fn func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if f, ok := r.(interface{ Addr() uintptr }); ok && inside(mem, f.Addr()) {
			err = errs.New(unix.EFAULT, "%s at %#x faulted: %v", what, f.Addr(), r)
			return
		}
		panic(r)
	}()
	fn()
	return nil
}

func inside(b []byte, addr uintptr) bool {
	if len(b) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&b[0]))
	return addr >= lo && addr-lo < uintptr(len(b))
}

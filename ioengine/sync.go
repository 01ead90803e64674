package ioengine

import (
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/fscred"
)

// syncEngine is the always-available fallback: one pread/pwrite at a time.
type syncEngine struct {
	chunk int64
	// writer: writes run with the fsuid and fsgid of writer.Creds on a
	// thread whose credentials are writer.base (nil: the thread's own;
	// writer.go). The engine's goroutine is locked to its thread.
	writer *syncWriter
}

type syncWriter struct {
	base fscred.State
	ids  fscred.Creds
}

func newSync() *syncEngine { return &syncEngine{chunk: chunkSize} }

func (e *syncEngine) Name() string { return KindSync }

func (e *syncEngine) Close() error { return nil }

func (e *syncEngine) Run(ops []Op) error { return e.runStrided(ops, 0, 1) }

func (e *syncEngine) runStrided(ops []Op, start, stride int) error {
	for i := start; i < len(ops); i += stride {
		op := &ops[i]
		if !checkOp(op) {
			continue
		}
		if op.Write && e.writer != nil {
			w := e.writer
			// A thread that cannot be given its ids back keeps the
			// writer's, which only narrows what its later writes may take.
			fscred.WithIDs(w.base, w.ids.FSUID, w.ids.FSGID, func() { op.Result = e.transfer(op) })
			continue
		}
		op.Result = e.transfer(op)
	}
	return nil
}

// transfer moves one op to completion: short transfers are continued until
// Len is done or a read hits end of file.
func (e *syncEngine) transfer(op *Op) int64 {
	nr := uintptr(unix.SYS_PREAD64)
	if op.Write {
		nr = unix.SYS_PWRITE64
	}
	var done int64
	again := 0
	for done < op.Len {
		n := op.Len - done
		if n > e.chunk {
			n = e.chunk
		}
		// The raw syscall takes the address as is: Op memory is mmap'd or
		// otherwise outside the Go heap, so no slice header is built for it.
		r, _, errno := unix.Syscall6(nr, uintptr(op.Fd), op.Addr+uintptr(done),
			uintptr(n), uintptr(op.Off+done), 0, 0)
		switch {
		case errno == unix.EINTR || errno == unix.EAGAIN:
			if again++; again > maxAgain {
				return -int64(unix.EAGAIN)
			}
		case errno != 0:
			return -int64(errno)
		case r == 0:
			if op.Write {
				// pwrite moving nothing would loop forever.
				return -int64(unix.EIO)
			}
			return done // end of file
		default:
			done += int64(r)
			again = 0
		}
	}
	return done
}

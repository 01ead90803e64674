// Package ioengine moves bytes between files and host-addressable memory:
// an Engine runs a set of positional reads or writes to completion, and a
// Pool runs engines on a fixed set of workers.
package ioengine

// Op is one positional transfer between a file and host-addressable memory.
type Op struct {
	Fd    int
	Write bool
	// Addr is the host address of the memory: mmap'd or otherwise pinned
	// memory the garbage collector does not move or free.
	Addr uintptr
	Len  int64
	Off  int64
	// Result is filled by the engine: bytes transferred (fewer than Len only
	// at end of file) or a negative errno.
	Result int64
}

// Engine performs Ops. An Engine belongs to one goroutine at a time.
type Engine interface {
	// Name is "io_uring" or "sync".
	Name() string
	// Run performs every op, filling Result. Short transfers are continued
	// and EAGAIN retried. It returns an error only for a failure of the
	// engine itself, after which the ops' results are undefined.
	Run(ops []Op) error
	Close() error
}

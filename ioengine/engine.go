// Package ioengine moves bytes between files and host-addressable memory:
// an Engine runs a set of positional reads or writes to completion, and a
// Pool runs engines on a fixed set of workers.
package ioengine

import (
	"math"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

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

// Engine kinds accepted by New and NewPool.
const (
	KindAuto    = "auto"     // io_uring when a ring can be created, else sync
	KindIOUring = "io_uring" // io_uring (per-worker sync fallback in a Pool)
	KindSync    = "sync"     // pread/pwrite loop
)

// EnvEngine names the environment variable KindFromEnv reads.
const EnvEngine = "PHX_ENGINE"

// DefaultQueueDepth is the io_uring window used when none is given; it
// matches libphoenix's per-thread ring.
const DefaultQueueDepth = 1024

// MaxQueueDepth is the kernel's limit on ring entries (IORING_MAX_ENTRIES).
const MaxQueueDepth = 32768

// KindFromEnv returns the engine kind named by PHX_ENGINE, "auto" when it
// is unset or empty. The value is not validated here: New and NewPool reject
// an unknown kind with an error wrapping EINVAL (CheckKind does it alone).
func KindFromEnv() string {
	k := strings.ToLower(strings.TrimSpace(os.Getenv(EnvEngine)))
	if k == "" {
		return KindAuto
	}
	return k
}

// CheckKind returns an error wrapping EINVAL unless kind is one of KindAuto,
// KindIOUring or KindSync.
func CheckKind(kind string) error {
	switch kind {
	case KindAuto, KindIOUring, KindSync:
		return nil
	}
	return errs.New(unix.EINVAL, "ioengine: unknown engine kind %q (want %s, %s or %s)",
		kind, KindAuto, KindIOUring, KindSync)
}

func checkQueueDepth(qd int) (int, error) {
	if qd <= 0 {
		return DefaultQueueDepth, nil
	}
	if qd > MaxQueueDepth {
		return 0, errs.New(unix.EINVAL, "ioengine: queue depth %d exceeds %d", qd, MaxQueueDepth)
	}
	return qd, nil
}

// New returns an engine of the given kind. queueDepth bounds the ops an
// io_uring engine keeps in flight (0 means DefaultQueueDepth); the sync
// engine ignores it. "auto" falls back to sync when no ring can be created;
// "io_uring" returns that failure instead.
func New(kind string, queueDepth int) (Engine, error) {
	if err := CheckKind(kind); err != nil {
		return nil, err
	}
	qd, err := checkQueueDepth(queueDepth)
	if err != nil {
		return nil, err
	}
	e, _, err := newEngine(kind, qd)
	return e, err
}

// engine is what this package's engines implement beyond Engine: running
// every stride-th op from start lets a Pool stripe one batch across workers
// without copying ops or results.
type engine interface {
	Engine
	runStrided(ops []Op, start, stride int) error
}

// newEngine builds an engine of a validated kind; ringErr is why io_uring
// was not used when "auto" fell back to sync.
func newEngine(kind string, qd int) (e engine, ringErr error, err error) {
	if kind == KindSync {
		return newSync(), nil, nil
	}
	u, err := newUring(qd)
	if err == nil {
		return u, nil, nil
	}
	if kind == KindIOUring {
		return nil, err, err
	}
	return newSync(), err, nil
}

// checkOp validates what the kernel would not catch, or would catch only
// after a partial transfer; false means op.Result has been set.
func checkOp(op *Op) bool {
	switch {
	case op.Len < 0 || op.Off < 0 || op.Off > math.MaxInt64-op.Len:
		op.Result = -int64(unix.EINVAL)
		return false
	case op.Len == 0:
		op.Result = 0
		return false
	}
	return true
}

// maxAgain bounds how often one op is resubmitted after EAGAIN/EINTR, so a
// descriptor that never becomes ready (a non-blocking pipe) cannot spin a
// worker forever; the op then reports -EAGAIN.
const maxAgain = 10000

// defaultChunk caps one kernel transfer: the kernel moves at most
// MAX_RW_COUNT (2 GiB - 4 KiB) per call and io_uring lengths are 32 bits.
const defaultChunk = 1 << 30

// chunkSize is the transfer cap given to new engines; tests lower it to
// exercise the continuation of short transfers.
var chunkSize int64 = defaultChunk

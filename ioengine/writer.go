package ioengine

import (
	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/internal/fscred"
)

// writeAsWriter makes e, a worker's engine on its locked thread, write
// file data as fscred.Writer where the thread is root for file systems
// (PoolConfig.Writer): an io_uring gets the identity as a registered
// personality that its writes name, the sync engine takes it around each
// write. A thread that is not root has nothing to give up.
func writeAsWriter(e engine) error {
	base, eno := fscred.Current()
	if eno != 0 {
		return errs.Wrapf(eno, "ioengine: read the worker's credentials")
	}
	if base.FSUID != 0 {
		return nil
	}
	w := fscred.Writer(base)
	switch e := e.(type) {
	case *uringEngine:
		var id uint
		var err error
		if eno := fscred.As(w, func() { id, err = e.ring.RegisterPersonality() }); eno != 0 {
			return errs.Wrapf(eno, "ioengine: take the writer identity (uid %d) for the ring", w.FSUID)
		}
		if err != nil {
			return errs.Wrapf(err, "ioengine: register the writer identity (uid %d) with the ring", w.FSUID)
		}
		e.personality = uint16(id)
	case *syncEngine:
		e.writer = &syncWriter{base: base, ids: w}
	}
	return nil
}

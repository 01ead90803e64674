package ioengine

import (
	"errors"
	"time"

	"github.com/pawelgaczynski/giouring"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// createRing makes the ring; tests replace it to force a failure.
var createRing = func(entries uint32) (*giouring.Ring, error) {
	return giouring.CreateRing(entries)
}

// uringEngine runs ops through one io_uring with a sliding window of at
// most qd ops in flight. Everything the hot path touches is allocated once,
// in newUring.
type uringEngine struct {
	ring  *giouring.Ring
	qd    int
	chunk int64
	slots []uringSlot // one per op in flight, indexed by CQE user data
	free  []uint32    // stack of unused slot indexes
	cqes  []*giouring.CompletionQueueEvent
	got   []cqeCopy
	// broken is set when ops may still be in flight after a failure: the
	// ring can no longer be trusted with new work.
	broken error
	// personality is the registered credentials writes run with (0: the
	// submitting thread's; writer.go).
	personality uint16
}

type uringSlot struct {
	op    int   // index into the ops being run
	done  int64 // bytes moved so far
	again int   // consecutive EAGAIN/EINTR results
}

// cqeCopy holds what is needed from a CQE, read before the CQE is released
// back to the kernel.
type cqeCopy struct {
	ud  uint64
	res int32
}

func newUring(qd int) (*uringEngine, error) {
	ring, err := createRing(uint32(qd))
	if err != nil {
		return nil, errs.Wrapf(err, "ioengine: create io_uring of %d entries", qd)
	}
	e := &uringEngine{
		ring:  ring,
		qd:    qd,
		chunk: chunkSize,
		slots: make([]uringSlot, qd),
		free:  make([]uint32, qd),
		// The CQ ring has twice the SQ entries; with at most qd in flight
		// one reap of qd entries takes everything.
		cqes: make([]*giouring.CompletionQueueEvent, qd),
		got:  make([]cqeCopy, qd),
	}
	for i := range e.free {
		e.free[i] = uint32(qd - 1 - i)
	}
	return e, nil
}

func (e *uringEngine) Name() string { return KindIOUring }

func (e *uringEngine) Close() error {
	if e.ring != nil {
		e.ring.QueueExit()
		e.ring = nil
	}
	return nil
}

func (e *uringEngine) Run(ops []Op) error { return e.runStrided(ops, 0, 1) }

func (e *uringEngine) runStrided(ops []Op, start, stride int) error {
	if e.broken != nil {
		return e.broken
	}
	if e.ring == nil {
		return errs.New(unix.EBADF, "ioengine: io_uring engine is closed")
	}
	next, inflight := start, 0
	for {
		// Fill the window.
		for inflight < e.qd && next < len(ops) {
			i := next
			next += stride
			if !checkOp(&ops[i]) {
				continue
			}
			s := e.free[len(e.free)-1]
			e.free = e.free[:len(e.free)-1]
			e.slots[s] = uringSlot{op: i}
			if err := e.prep(ops, s); err != nil {
				return e.fail(err, inflight)
			}
			inflight++
		}
		if inflight == 0 {
			return nil
		}
		if err := e.submitAndWait(); err != nil {
			return e.fail(err, inflight)
		}
		// Copy the CQEs out before releasing them: the kernel may reuse
		// their memory as soon as the head moves.
		n := int(e.ring.PeekBatchCQE(e.cqes))
		for k := 0; k < n; k++ {
			e.got[k] = cqeCopy{ud: e.cqes[k].UserData, res: e.cqes[k].Res}
		}
		e.ring.CQAdvance(uint32(n))
		for k := 0; k < n; k++ {
			finished, err := e.complete(ops, e.got[k])
			if err != nil {
				// Completions k.. were reaped: the kernel no longer holds them.
				return e.fail(err, inflight-(n-k))
			}
			if finished {
				inflight--
			}
		}
	}
}

// prep queues the rest of slot s's op as one read or write.
func (e *uringEngine) prep(ops []Op, s uint32) error {
	sqe := e.ring.GetSQE()
	if sqe == nil {
		// Cannot happen while inflight <= qd <= SQ entries.
		return errs.New(unix.EOVERFLOW, "ioengine: io_uring submission queue full")
	}
	sl := &e.slots[s]
	op := &ops[sl.op]
	n := op.Len - sl.done
	if n > e.chunk {
		n = e.chunk
	}
	addr, off := op.Addr+uintptr(sl.done), uint64(op.Off+sl.done)
	if op.Write {
		sqe.PrepareWrite(op.Fd, addr, uint32(n), off)
	} else {
		sqe.PrepareRead(op.Fd, addr, uint32(n), off)
	}
	// Prepare* leaves these alone and zeroes the user data, so set them after.
	sqe.Flags = 0
	sqe.OpcodeFlags = 0
	sqe.Personality = 0
	if op.Write {
		sqe.Personality = e.personality
	}
	sqe.SetData64(uint64(s))
	return nil
}

// complete handles one completion; finished reports that its op is done
// and its slot free.
func (e *uringEngine) complete(ops []Op, c cqeCopy) (finished bool, err error) {
	if c.ud >= uint64(len(e.slots)) {
		return false, errs.New(unix.EIO, "ioengine: io_uring completion with unknown user data %#x", c.ud)
	}
	s := uint32(c.ud)
	sl := &e.slots[s]
	op := &ops[sl.op]
	var result int64
	switch res := c.res; {
	case res == -int32(unix.EAGAIN) || res == -int32(unix.EINTR):
		if sl.again++; sl.again <= maxAgain {
			return false, e.prep(ops, s)
		}
		result = -int64(unix.EAGAIN)
	case res < 0:
		// An error after a partial transfer is still an error: a short
		// result means end of file only.
		result = int64(res)
	case res == 0 && op.Write:
		result = -int64(unix.EIO) // a write that moves nothing would loop
	case res == 0:
		result = sl.done // end of file
	default:
		sl.done += int64(res)
		sl.again = 0
		if sl.done < op.Len {
			return false, e.prep(ops, s)
		}
		result = sl.done
	}
	op.Result = result
	e.free = append(e.free, s)
	return true, nil
}

// submitAndWait submits what is queued and waits for a completion,
// riding out the transient failures of io_uring_enter.
func (e *uringEngine) submitAndWait() error {
	busy := 0
	for {
		_, err := e.ring.SubmitAndWait(1)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			// Signals (Go's preemption among them) interrupt the wait.
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EBUSY):
			// Out of kernel resources or the CQ is backed up: take what has
			// completed first, else give the kernel a moment.
			if e.ring.CQReady() > 0 {
				return nil
			}
			if busy++; busy > 20000 {
				return err
			}
			time.Sleep(50 * time.Microsecond)
		default:
			return err
		}
	}
}

// fail returns err as an engine failure after waiting for the ops the
// kernel still holds (pending of them, some perhaps not yet submitted), so
// none lands in the caller's memory after Run returns. If that cannot be
// ensured the engine refuses all further work.
func (e *uringEngine) fail(err error, pending int) error {
	err = errs.Wrapf(err, "ioengine: io_uring")
	if e.ring.SQReady() > 0 {
		// Prepared SQEs cannot be withdrawn and may be submitted later.
		e.broken = err
		return err
	}
	for pending > 0 {
		cqe, werr := e.ring.WaitCQE()
		if errors.Is(werr, unix.EINTR) {
			continue
		}
		if werr != nil || cqe == nil {
			e.broken = err
			return err
		}
		e.ring.CQESeen(cqe)
		pending--
	}
	e.free = e.free[:len(e.slots)]
	for i := range e.free {
		e.free[i] = uint32(len(e.slots) - 1 - i)
	}
	return err
}

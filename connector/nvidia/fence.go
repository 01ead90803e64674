package nvidia

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
)

// fence is a CUDA event recorded on a stream: one stream serves all of a
// worker's bounce buffers, and each buffer waits for its own copies only.
type fence struct {
	s      *Stream
	ev     uintptr
	seq    uint64 // the last copy before the fence
	waited atomic.Bool
}

// Fence records an event after the copies queued so far. Events are
// reused: a waited fence returns its event to the stream.
func (s *Stream) Fence() (connector.Fence, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errs.New(unix.EBADF, "nvidia: stream closed")
	}
	var ev uintptr
	err := s.c.onDev(s.dev, func() error {
		if n := len(s.events); n > 0 {
			ev, s.events = s.events[n-1], s.events[:n-1]
		} else if err := s.c.d.call(s.c.d.cuEventCreate, uintptr(unsafe.Pointer(&ev)), cuEventDisableTiming); err != nil {
			return err
		}
		if err := s.c.d.call(s.c.d.cuEventRecord, ev, s.h); err != nil {
			s.events = append(s.events, ev)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &fence{s: s, ev: ev, seq: s.seq}, nil
}

// Wait blocks until the fenced copies have completed (as PHX_CUDA_SYNC
// says threads wait) and returns the driver's error, if any.
func (f *fence) Wait() error {
	if f.waited.Swap(true) {
		return errs.New(unix.EINVAL, "nvidia: fence waited for twice")
	}
	s := f.s
	err := s.c.onDev(s.dev, func() error { return s.c.d.call(s.c.d.cuEventSynchronize, f.ev) })
	s.mu.Lock()
	if s.closed {
		// Close destroyed the idle events only: this one is ours to free.
		s.c.onDev(s.dev, func() error { return s.c.d.call(s.c.d.cuEventDestroy, f.ev) })
	} else {
		s.events = append(s.events, f.ev)
		s.drop(f.seq)
	}
	s.mu.Unlock()
	return err
}

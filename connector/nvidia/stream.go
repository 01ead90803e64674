package nvidia

import (
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
)

// Stream is a non-blocking CUDA stream on one device.
type Stream struct {
	c   *Connector
	dev int
	h   uintptr

	mu     sync.Mutex
	seq    uint64     // copies enqueued so far
	held   []heldHost // host buffers of queued copies: reachable until waited for
	events []uintptr  // idle events for Fence
	pieces pieceState // scatter and gather state (scatter.go)
	closed bool
}

// heldHost is the host buffer of the seq'th copy.
type heldHost struct {
	seq uint64
	buf []byte
}

// NewStream creates a non-blocking stream on dev: it does not serialise
// with the legacy default stream, so copies on different streams overlap.
func (c *Connector) NewStream(dev int) (connector.Stream, error) {
	if err := c.checkDev(dev); err != nil {
		return nil, err
	}
	if err := c.acquire(); err != nil {
		return nil, err
	}
	var h uintptr
	err := c.onDev(dev, func() error {
		return c.d.call(c.d.cuStreamCreate, uintptr(unsafe.Pointer(&h)), cuStreamNonBlocking)
	})
	if err != nil {
		c.release()
		return nil, err
	}
	return &Stream{c: c, dev: dev, h: h}, nil
}

// enqueue runs f, which queues work on the stream that reads or writes
// buf. An enqueue error belongs to its caller alone: it is returned, not
// kept for the stream's next Fence, which may be another transfer's. f may
// have queued part of its work (a scatter's copy before its kernel), so
// the stream is drained first: nothing of a failed enqueue is left in
// flight, and the caller may reuse buf at once. A sticky context error
// still reaches every later wait through the driver.
func (s *Stream) enqueue(buf []byte, f func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errs.New(unix.EBADF, "nvidia: stream closed")
	}
	err := s.c.onDev(s.dev, func() error {
		err := f()
		if err != nil {
			s.c.d.call(s.c.d.cuStreamSynchronize, s.h)
		}
		return err
	})
	if err != nil {
		return err
	}
	s.seq++
	s.held = append(s.held, heldHost{seq: s.seq, buf: buf})
	return nil
}

// drop forgets the host buffers of copies up to seq, which have completed;
// caller holds mu.
func (s *Stream) drop(seq uint64) {
	n := 0
	for n < len(s.held) && s.held[n].seq <= seq {
		n++
	}
	clear(s.held[:n])
	s.held = append(s.held[:0], s.held[n:]...)
}

// CopyToDevice queues a copy of src to device address dst. src must stay
// untouched until Synchronize returns; pinned memory (AllocHost) makes the
// copy truly asynchronous.
func (s *Stream) CopyToDevice(dst uint64, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return s.enqueue(src, func() error {
		return s.c.d.call(s.c.d.cuMemcpyHtoDAsync, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)), s.h)
	})
}

// CopyFromDevice queues a copy of len(dst) bytes at device address src into
// dst, which holds them once Synchronize returns.
func (s *Stream) CopyFromDevice(dst []byte, src uint64) error {
	if len(dst) == 0 {
		return nil
	}
	return s.enqueue(dst, func() error {
		return s.c.d.call(s.c.d.cuMemcpyDtoHAsync, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)), s.h)
	})
}

// Synchronize waits for every queued copy and returns the driver's error,
// if any (enqueue errors were returned by the enqueue).
func (s *Stream) Synchronize() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errs.New(unix.EBADF, "nvidia: stream closed")
	}
	return s.syncLocked()
}

func (s *Stream) syncLocked() error {
	err := s.c.onDev(s.dev, func() error {
		return s.c.d.call(s.c.d.cuStreamSynchronize, s.h)
	})
	s.drop(s.seq)
	return err
}

// Close waits for the queued copies (their host buffers may be Go memory),
// frees the stream's events and scatter staging, and destroys the stream.
// Fences not yet waited for must not be waited for afterwards. A second
// Close does nothing.
func (s *Stream) Close() error {
	return s.c.closeOnce(&s.mu, &s.closed, func() error {
		err := s.syncLocked()
		if derr := s.c.onDev(s.dev, s.destroy); err == nil {
			err = derr
		}
		return err
	})
}

// destroy frees what the stream owns, on its device; caller holds mu.
func (s *Stream) destroy() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	for _, ev := range s.events {
		keep(s.c.d.call(s.c.d.cuEventDestroy, ev))
	}
	s.events = nil
	keep(s.pieces.free(s.c.d))
	keep(s.c.d.call(s.c.d.cuStreamDestroy, s.h))
	return first
}

// The synchronous copies and memset below run on the legacy default
// stream, outside any Stream: copies queued on Streams are not waited for.

// syncLegacy waits for the legacy default stream: a pageable host-to-device
// copy or a memset may return before the device has the bytes.
func (c *Connector) syncLegacy() error {
	return c.d.call(c.d.cuStreamSynchronize, 0)
}

// legacyOp runs f, an operation of n bytes on dev's memory, with dev's
// context current, once dev, n and the connector check out: n == 0 does
// nothing, n < 0 is EINVAL (what names the operation in the error).
func (c *Connector) legacyOp(dev int, what string, n int64, f func() error) error {
	if err := c.checkDev(dev); err != nil {
		return err
	}
	if n < 0 {
		return errs.New(unix.EINVAL, "nvidia: %s of %d bytes", what, n)
	}
	if n == 0 {
		return nil
	}
	if err := c.checkOpen(); err != nil {
		return err
	}
	return c.onDev(dev, f)
}

// CopyToHost copies len(dst) bytes of dev's memory at src into dst and
// returns once they are there. Copies queued on Streams are not waited for.
func (c *Connector) CopyToHost(dst []byte, src uint64, dev int) error {
	return c.legacyOp(dev, "copy to host", int64(len(dst)), func() error {
		return c.d.call(c.d.cuMemcpyDtoH, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)))
	})
}

// CopyToDeviceSync copies src to dev's memory at dst and returns once the
// device holds the bytes.
func (c *Connector) CopyToDeviceSync(dev int, dst uint64, src []byte) error {
	return c.legacyOp(dev, "copy to device", int64(len(src)), func() error {
		if err := c.d.call(c.d.cuMemcpyHtoD, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src))); err != nil {
			return err
		}
		return c.syncLegacy()
	})
}

// Memset sets n bytes of dev's memory at addr to b and returns once done.
func (c *Connector) Memset(dev int, addr uint64, b byte, n int64) error {
	return c.legacyOp(dev, "memset", n, func() error {
		if err := c.d.call(c.d.cuMemsetD8, uintptr(addr), uintptr(b), uintptr(n)); err != nil {
			return err
		}
		return c.syncLegacy()
	})
}

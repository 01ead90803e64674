package emu

import (
	"sync"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/internal/faultsafe"
)

// stream is the emulated copy engine: a goroutine that performs copies in
// order, so that copies overlap the caller's storage reads as a GPU's DMA
// engine would. Its copies are the only CPU accesses the daemon makes to an
// imported buffer, and each is guarded (faultsafe.Copy): the client can make
// its pages fault at any time.
//
// Copies are counted (queued, done) and grouped into epochs, one per Fence:
// a fence waits until done reaches the count at its making and reports the
// first failure of its epoch.
type stream struct {
	c   *Connector
	dev int

	work   chan op
	sendMu sync.Mutex // orders the count with the channel send
	mu     sync.Mutex
	idle   *sync.Cond
	queued uint64
	done   uint64
	epoch  uint64
	errs   map[uint64]error // first failure per epoch, until reported
	closed chan struct{}
}

// op is one queued copy (or scatter, or gather) and its epoch.
type op struct {
	fn    func() error
	epoch uint64
}

// NewStream implements connector.Connector.
func (c *Connector) NewStream(dev int) (connector.Stream, error) {
	if err := c.checkDevice(dev); err != nil {
		return nil, err
	}
	s := &stream{c: c, dev: dev, work: make(chan op, 64), errs: map[uint64]error{}, closed: make(chan struct{})}
	s.idle = sync.NewCond(&s.mu)
	go s.run()
	return s, nil
}

func (s *stream) run() {
	defer close(s.closed)
	for o := range s.work {
		err := o.fn()
		s.mu.Lock()
		if err != nil && s.errs[o.epoch] == nil {
			s.errs[o.epoch] = err
		}
		s.done++
		s.idle.Broadcast()
		s.mu.Unlock()
	}
}

func (s *stream) enqueue(fn func() error) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.mu.Lock()
	s.queued++
	e := s.epoch
	s.mu.Unlock()
	s.work <- op{fn: fn, epoch: e}
}

const shrunk = "emu: device memory (the buffer shrank?)"

// CopyToDevice implements connector.Stream.
func (s *stream) CopyToDevice(dst uint64, src []byte) error {
	return s.ScatterToDevice(src, []connector.Piece{{Dev: dst, Len: int64(len(src))}})
}

// CopyFromDevice implements connector.Stream.
func (s *stream) CopyFromDevice(dst []byte, src uint64) error {
	return s.GatherFromDevice(dst, []connector.Piece{{Dev: src, Len: int64(len(dst))}})
}

// ScatterToDevice implements connector.Stream: one queued job copies every
// piece, as one kernel launch would.
func (s *stream) ScatterToDevice(src []byte, ps []connector.Piece) error {
	return s.pieces(src, ps, false)
}

// GatherFromDevice implements connector.Stream.
func (s *stream) GatherFromDevice(dst []byte, ps []connector.Piece) error {
	return s.pieces(dst, ps, true)
}

// pieces checks every piece (host range and device memory) before queuing
// anything, so a bad piece fails the call with nothing copied.
func (s *stream) pieces(host []byte, ps []connector.Piece, gather bool) error {
	devs := make([][]byte, len(ps))
	for i, p := range ps {
		if p.Off < 0 || p.Len < 0 || p.Off > int64(len(host))-p.Len {
			return errs.New(unix.EINVAL, "emu: piece of %d bytes at %d outside a %d-byte host buffer", p.Len, p.Off, len(host))
		}
		if p.Len == 0 {
			continue
		}
		d, err := s.c.alias(s.dev, p.Dev, p.Len)
		if err != nil {
			return err
		}
		devs[i] = d
	}
	s.enqueue(func() error {
		for i, p := range ps {
			h := host[p.Off : p.Off+p.Len]
			var err error
			if gather {
				err = faultsafe.Copy(shrunk, devs[i], h, devs[i])
			} else {
				err = faultsafe.Copy(shrunk, devs[i], devs[i], h)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	return nil
}

// fence is a point in a stream.
type fence struct {
	s      *stream
	upto   uint64
	epoch  uint64
	waited bool
}

// Fence implements connector.Stream.
func (s *stream) Fence() (connector.Fence, error) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	f := &fence{s: s, upto: s.queued, epoch: s.epoch}
	s.epoch++
	return f, nil
}

// Wait implements connector.Fence.
func (f *fence) Wait() error {
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.waited {
		return errs.New(unix.EINVAL, "emu: fence waited for twice")
	}
	f.waited = true
	for s.done < f.upto {
		s.idle.Wait()
	}
	err := s.errs[f.epoch]
	delete(s.errs, f.epoch)
	return err
}

// Synchronize implements connector.Stream: it reports the first failure
// not yet reported by a fence.
func (s *stream) Synchronize() error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.done < s.queued {
		s.idle.Wait()
	}
	var err error
	first := ^uint64(0)
	for e, x := range s.errs {
		if e < first {
			first, err = e, x
		}
	}
	clear(s.errs)
	s.epoch++
	return err
}

// Close implements connector.Stream.
func (s *stream) Close() error {
	err := s.Synchronize()
	close(s.work)
	<-s.closed
	return err
}

package emu

import (
	"sync"

	"phxmount/connector"
	"phxmount/internal/faultsafe"
)

// stream is the emulated copy engine: a goroutine that performs copies in
// order, so that copies overlap the caller's storage reads as a GPU's DMA
// engine would. Its copies are the only CPU accesses the daemon makes to an
// imported buffer, and each is guarded (faultsafe.Copy): the client can make
// its pages fault at any time.
type stream struct {
	c   *Connector
	dev int

	work chan func() error
	mu   sync.Mutex
	idle *sync.Cond
	busy int   // copies enqueued and not yet done
	err  error // first failure since the last Synchronize
	done chan struct{}
}

// NewStream implements connector.Connector.
func (c *Connector) NewStream(dev int) (connector.Stream, error) {
	if err := c.checkDevice(dev); err != nil {
		return nil, err
	}
	s := &stream{c: c, dev: dev, work: make(chan func() error, 64), done: make(chan struct{})}
	s.idle = sync.NewCond(&s.mu)
	go s.run()
	return s, nil
}

func (s *stream) run() {
	defer close(s.done)
	for fn := range s.work {
		err := fn()
		s.mu.Lock()
		if err != nil && s.err == nil {
			s.err = err
		}
		s.busy--
		if s.busy == 0 {
			s.idle.Broadcast()
		}
		s.mu.Unlock()
	}
}

func (s *stream) enqueue(fn func() error) {
	s.mu.Lock()
	s.busy++
	s.mu.Unlock()
	s.work <- fn
}

// CopyToDevice implements connector.Stream.
func (s *stream) CopyToDevice(dst uint64, src []byte) error {
	d, err := s.c.alias(s.dev, dst, int64(len(src)))
	if err != nil {
		return err
	}
	s.enqueue(func() error { return faultsafe.Copy("emu: device memory (the buffer shrank?)", d, d, src) })
	return nil
}

// CopyFromDevice implements connector.Stream.
func (s *stream) CopyFromDevice(dst []byte, src uint64) error {
	d, err := s.c.alias(s.dev, src, int64(len(dst)))
	if err != nil {
		return err
	}
	s.enqueue(func() error { return faultsafe.Copy("emu: device memory (the buffer shrank?)", d, dst, d) })
	return nil
}

// Synchronize implements connector.Stream.
func (s *stream) Synchronize() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.busy > 0 {
		s.idle.Wait()
	}
	err := s.err
	s.err = nil
	return err
}

// Close implements connector.Stream.
func (s *stream) Close() error {
	if err := s.Synchronize(); err != nil {
		return err
	}
	close(s.work)
	<-s.done
	return nil
}

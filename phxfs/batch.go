package phxfs

import (
	"runtime/trace"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// ReadBatch performs every request, blocks until all complete and fills
// each Result. It returns 0 when every request transferred exactly Len
// bytes, otherwise the number of requests that did not; an error only when
// the batch could not be submitted at all. A request whose buffer does not
// resolve gets -EFAULT and never reaches the engine. One batch may mix
// devices and host buffers.
func (l *Lib) ReadBatch(reqs []Request) (int, error) { return l.batch(false, reqs) }

// WriteBatch is ReadBatch for writes.
func (l *Lib) WriteBatch(reqs []Request) (int, error) { return l.batch(true, reqs) }

func (l *Lib) batch(write bool, reqs []Request) (int, error) {
	var p *plan
	var err error
	trace.WithRegion(bg, "phxfs.prepare", func() { p, err = l.prepare(write, reqs) })
	if err != nil {
		return 0, err
	}
	l.stats.batches.Add(1)
	trace.WithRegion(bg, "phxfs.execute", func() { l.execute(p) })
	p.recycle()
	return failures(reqs), nil
}

// Batch is a submitted asynchronous batch.
type Batch struct {
	l      *Lib
	caller []Request // where Wait copies the results
	p      *plan     // works on its own copy of the requests
	done   chan struct{}

	mu        sync.Mutex
	ended     bool // Wait or Destroy was called
	abandoned atomic.Bool
}

// SubmitRead queues a batch of reads and returns at once. Batches run one at
// a time, in order, each with the whole worker pool; when
// Config.MaxQueuedBatches are already waiting it fails with EBUSY. An empty
// batch is valid and its Wait returns 0. reqs is not touched until Wait,
// which fills in the results; the requests' descriptors and buffers must
// stay valid until then.
func (l *Lib) SubmitRead(reqs []Request) (*Batch, error) { return l.submit(false, reqs) }

// SubmitWrite is SubmitRead for writes.
func (l *Lib) SubmitWrite(reqs []Request) (*Batch, error) { return l.submit(true, reqs) }

func (l *Lib) submit(write bool, reqs []Request) (*Batch, error) {
	own := append([]Request(nil), reqs...)
	p, err := l.prepare(write, own)
	if err != nil {
		return nil, err
	}
	b := &Batch{l: l, caller: reqs, p: p, done: make(chan struct{})}
	if len(own) == 0 {
		close(b.done)
		return b, nil
	}
	l.mu.Lock()
	var full, closed bool
	if l.closed {
		closed = true
	} else {
		select {
		case l.queue <- b:
		default:
			full = true
		}
	}
	l.mu.Unlock()
	if full || closed {
		// Nothing ran: drop the holds without counting any I/O.
		l.mu.Lock()
		for _, r := range p.held {
			l.release(r)
		}
		l.mu.Unlock()
		if closed {
			return nil, errs.New(unix.EINVAL, "phxfs: library closed")
		}
		return nil, errs.New(unix.EBUSY, "phxfs: %d batches already queued", cap(l.queue))
	}
	return b, nil
}

// dispatch runs queued batches one at a time until the queue is closed.
func (l *Lib) dispatch() {
	defer close(l.stopped)
	for b := range l.queue {
		l.stats.batches.Add(1)
		if b.abandoned.Load() {
			// Destroyed before it started: nothing to quiesce.
			for i := range b.p.reqs {
				b.p.reqs[i].Result = -int64(unix.ECANCELED)
			}
			b.p.xfers = nil
			l.finish(b.p)
		} else {
			l.execute(b.p)
		}
		close(b.done)
	}
}

func (b *Batch) end() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return errs.New(unix.EINVAL, "phxfs: batch already waited for or destroyed")
	}
	b.ended = true
	return nil
}

// Wait blocks until the batch completes, copies the results into the
// requests given to Submit and returns as ReadBatch does. The handle is
// spent afterwards.
func (b *Batch) Wait() (int, error) {
	if err := b.end(); err != nil {
		return 0, err
	}
	<-b.done
	for i := range b.caller {
		b.caller[i].Result = b.p.reqs[i].Result
	}
	return failures(b.caller), nil
}

// Destroy abandons the batch and drops its results: a batch still queued
// never runs; one already running is waited for until its I/O quiesces.
func (b *Batch) Destroy() error {
	if err := b.end(); err != nil {
		return err
	}
	b.abandoned.Store(true)
	<-b.done
	return nil
}

// Done is closed when the batch has completed.
func (b *Batch) Done() <-chan struct{} { return b.done }

package ioengine

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// PoolConfig configures a Pool. Zero values pick defaults: Kind "auto",
// one worker per CPU, DefaultQueueDepth.
type PoolConfig struct {
	Kind       string
	Workers    int
	QueueDepth int
	// Writer: where the workers' thread is root for file systems (fsuid
	// 0), their writes of file data run as fscred.Writer, not as root, so
	// that they take no block a file system reserves for root (a daemon
	// writing for its callers); reads are untouched.
	Writer bool
}

// MaxWorkers bounds PoolConfig.Workers: each worker holds an OS thread.
const MaxWorkers = 1024

// jobQueueLen bounds each worker's FIFO so callers can queue several
// batches ahead without unbounded memory.
const jobQueueLen = 64

// Pool runs batches on a fixed set of workers. Each worker is a goroutine
// locked to its own OS thread that owns one Engine, so per-thread state
// (the ring, a device context set up in Each) stays with one thread.
type Pool struct {
	kind    string
	name    string
	workers []*worker
	ringErr error
	wg      sync.WaitGroup

	// mu is held shared while jobs are queued and exclusively by Close, so
	// no job is queued on a closed channel.
	mu     sync.RWMutex
	closed bool
}

type worker struct {
	id   int
	jobs chan *job
	eng  engine
}

// job is one worker's share of a Run, or one call of an Each.
type job struct {
	ops    []Op
	stride int
	fn     func(worker int, e Engine)
	b      *batch
}

// batch collects the workers' outcomes of one Run or Each.
type batch struct {
	mu   sync.Mutex
	err  error
	left atomic.Int64  // jobs not returned yet
	done chan struct{} // closed when the last returns
}

func newBatch(jobs int) *batch {
	b := &batch{done: make(chan struct{})}
	b.left.Store(int64(jobs))
	return b
}

// ended marks one of b's jobs returned.
func (b *batch) ended() {
	if b.left.Add(-1) == 0 {
		close(b.done)
	}
}

func (b *batch) error() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

func (b *batch) setErr(err error) {
	b.mu.Lock()
	if b.err == nil {
		b.err = err
	}
	b.mu.Unlock()
}

// NewPool starts cfg.Workers workers, each with its own engine of cfg.Kind.
// A worker whose ring cannot be created runs the sync engine instead; Name
// reports it. Only when the kind is "io_uring" and no worker got a ring is
// that an error.
func NewPool(cfg PoolConfig) (*Pool, error) {
	kind := cfg.Kind
	if kind == "" {
		kind = KindAuto
	}
	if err := CheckKind(kind); err != nil {
		return nil, err
	}
	qd, err := checkQueueDepth(cfg.QueueDepth)
	if err != nil {
		return nil, err
	}
	n := cfg.Workers
	if n <= 0 {
		n = runtime.NumCPU()
	}
	if n > MaxWorkers {
		return nil, errs.New(unix.EINVAL, "ioengine: %d workers exceed %d", n, MaxWorkers)
	}

	// A worker in "io_uring" mode falls back like "auto"; the pool decides
	// below whether the outcome is acceptable.
	wkind := kind
	if wkind == KindIOUring {
		wkind = KindAuto
	}
	p := &Pool{workers: make([]*worker, n)}
	type started struct {
		eng     engine
		ringErr error
		err     error // the writer identity could not be set up
	}
	ready := make(chan started, n)
	for i := range p.workers {
		w := &worker{id: i, jobs: make(chan *job, jobQueueLen)}
		p.workers[i] = w
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			// Never unlocked: when the worker ends its thread ends with it,
			// taking any thread state a job set up.
			runtime.LockOSThread()
			e, ringErr, _ := newEngine(wkind, qd) // auto cannot fail
			w.eng = e
			var err error
			if cfg.Writer {
				err = writeAsWriter(e)
			}
			ready <- started{e, ringErr, err}
			w.loop()
		}()
	}
	onSync := 0
	var werr error
	for range n {
		s := <-ready
		if s.eng.Name() == KindSync {
			onSync++
		}
		if s.ringErr != nil && p.ringErr == nil {
			p.ringErr = s.ringErr
		}
		if s.err != nil && werr == nil {
			werr = s.err
		}
	}
	if werr != nil {
		p.Close()
		return nil, werr
	}

	switch {
	case kind == KindSync:
		p.kind, p.name = KindSync, KindSync
	case onSync == n && kind == KindIOUring:
		p.Close()
		return nil, errs.Wrapf(p.ringErr, "ioengine: no worker could create an io_uring")
	case onSync == n:
		p.kind, p.name = KindSync, KindSync
	case onSync == 0:
		p.kind, p.name = KindIOUring, KindIOUring
	default:
		// Ties go to io_uring, the kind that was asked for.
		p.kind = KindIOUring
		if onSync*2 > n {
			p.kind = KindSync
		}
		p.name = fmt.Sprintf("io_uring (%d of %d workers on sync)", onSync, n)
	}
	return p, nil
}

// loop runs the worker's jobs in FIFO order until its queue is closed and
// drained, then closes its engine.
func (w *worker) loop() {
	for j := range w.jobs {
		w.run(j)
	}
	_ = w.eng.Close()
}

func (w *worker) run(j *job) {
	defer j.b.ended()
	if j.fn != nil {
		// A panicking fn must not kill the worker: the pool would hang.
		defer func() {
			if r := recover(); r != nil {
				j.b.setErr(errs.New(unix.EIO, "ioengine: worker %d: Each function panicked: %v", w.id, r))
			}
		}()
		j.fn(w.id, w.eng)
		return
	}
	if err := w.eng.runStrided(j.ops, w.id, j.stride); err != nil {
		j.b.setErr(fmt.Errorf("ioengine: worker %d: %w", w.id, err))
	}
}

// Name reports the engine in use, and how many workers fell back to sync
// when only some did.
func (p *Pool) Name() string { return p.name }

// Kind is "io_uring" or "sync": the engine of most workers.
func (p *Pool) Kind() string { return p.kind }

// Workers is the number of workers.
func (p *Pool) Workers() int { return len(p.workers) }

// RingError is why a worker could not create its io_uring (the first such
// failure), nil when every worker that tried got one.
func (p *Pool) RingError() error { return p.ringErr }

// Run performs every op, striped round-robin across the workers (op i on
// worker i mod Workers), and returns when all are done. Results are in each
// op's Result; the error reports only engine failures. The ops must not be
// touched until Run returns. It is safe to call from many goroutines, but
// not from inside an Each function of the same pool (that would wait on
// itself).
func (p *Pool) Run(ops []Op) error {
	if len(ops) == 0 {
		return nil
	}
	n := min(len(ops), len(p.workers))
	b := newBatch(n)
	jobs := make([]job, n)
	for i := range jobs {
		jobs[i] = job{ops: ops, stride: len(p.workers), b: b}
	}
	if err := p.submit(jobs, func(i int) int { return i }); err != nil {
		return err
	}
	<-b.done
	return b.error()
}

// Each runs fn once on every worker, concurrently, each on its worker's
// thread with its worker's engine, and returns when all have returned. The
// engine belongs to fn only for the call. fn must not call Run, Each or
// Close on the same pool. A panic in fn is returned as an error.
func (p *Pool) Each(fn func(worker int, e Engine)) error {
	return p.EachOn(0, len(p.workers), fn)
}

// EachOn is Each on n workers only: start, start+1, ... wrapping around
// (n is clamped to 1..Workers). Small jobs on a few workers leave the
// others to concurrent callers.
func (p *Pool) EachOn(start, n int, fn func(worker int, e Engine)) error {
	return p.EachIn(0, len(p.workers), start, n, fn)
}

// EachIn is EachOn inside the part [base, base+size) of the pool: workers
// base+start, base+start+1, ... wrapping around inside the part (size is
// clamped to the pool, n to 1..size), so that the plans of one part
// cover all of its workers alike, the first ones as often as the last.
func (p *Pool) EachIn(base, size, start, n int, fn func(worker int, e Engine)) error {
	return p.EachInUntil(nil, base, size, start, n, fn)
}

// EachInUntil is EachIn that also returns, with no error, once enough
// is closed: a caller whose jobs take their work from one shared supply
// (phxfs hands a plan's transfers out a chunk at a time) is done when the
// work is, not when its last job, queued behind another caller's on a
// busy worker, has run to find nothing left. Jobs that have not run yet
// still run later, so fn must then find nothing to do and must touch
// nothing the caller has let go of. Until enough is closed (a nil enough
// never is) it waits for every job, and returns EachIn's error.
func (p *Pool) EachInUntil(enough <-chan struct{}, base, size, start, n int, fn func(worker int, e Engine)) error {
	w := len(p.workers)
	base = min(max(base, 0), w-1)
	size = min(max(size, 1), w-base)
	n = min(max(n, 1), size)
	start = (start%size + size) % size
	b := newBatch(n)
	jobs := make([]job, n)
	for i := range jobs {
		jobs[i] = job{fn: fn, b: b}
	}
	if err := p.submit(jobs, func(i int) int { return base + (start+i)%size }); err != nil {
		return err
	}
	select {
	case <-b.done:
		return b.error()
	case <-enough:
		return nil
	}
}

// submit queues jobs[i] on worker at(i), in FIFO order behind earlier
// jobs.
func (p *Pool) submit(jobs []job, at func(i int) int) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errs.New(unix.ESHUTDOWN, "ioengine: pool is closed")
	}
	for i := range jobs {
		// Workers keep draining while we hold the shared lock, so a full
		// queue only delays this send.
		p.workers[at(i)].jobs <- &jobs[i]
	}
	return nil
}

// Close lets the workers finish every queued job, stops them and closes
// their engines. Run and Each calls after Close fail with ESHUTDOWN. Close
// must not be called from inside an Each function. Every Close, the first
// and any concurrent or later one, returns once the workers have stopped.
func (p *Pool) Close() error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		for _, w := range p.workers {
			close(w.jobs)
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

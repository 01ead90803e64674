package ioengine

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pawelgaczynski/giouring"
	"golang.org/x/sys/unix"
)

func poolKinds(t *testing.T, f func(t *testing.T, kind string)) {
	for _, kind := range []string{KindIOUring, KindSync} {
		t.Run(kind, func(t *testing.T) {
			if kind == KindIOUring {
				requireUring(t)
			}
			f(t, kind)
		})
	}
}

// readOps builds n reads of bs bytes at shuffled offsets of fd, each
// landing at its file offset in mem.
func readOps(fd int, mem []byte, n, bs int, seed int) []Op {
	ops := make([]Op, n)
	for i := range ops {
		k := (i*7919 + seed) % n
		ops[i] = Op{Fd: fd, Addr: addr(mem) + uintptr(k*bs), Len: int64(bs), Off: int64(k * bs)}
	}
	return ops
}

func verifyOps(ops []Op, mem []byte) error {
	base := addr(mem)
	for i, op := range ops {
		if op.Result != op.Len {
			return fmt.Errorf("op %d: Result %d (%v), want %d", i, op.Result, errno(op.Result), op.Len)
		}
		start := int64(op.Addr - base)
		for j := int64(0); j < op.Len; j++ {
			if mem[start+j] != patternByte(op.Off+j) {
				return fmt.Errorf("op %d: byte %d wrong", i, j)
			}
		}
	}
	return nil
}

// newPool makes a pool of cfg or fails the test.
func newPool(t *testing.T, cfg PoolConfig) *Pool {
	t.Helper()
	p, err := NewPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPoolConcurrentRun(t *testing.T) {
	const n, bs = 256, 4096
	path := patternFile(t, testDir(t), n*bs)
	poolKinds(t, func(t *testing.T, kind string) {
		p := newPool(t, PoolConfig{Kind: kind, Workers: 4, QueueDepth: 32})
		defer p.Close()
		if p.Workers() != 4 || p.Kind() != kind || p.Name() != kind {
			t.Fatalf("pool: Workers %d Kind %q Name %q", p.Workers(), p.Kind(), p.Name())
		}
		fd := openFd(t, path, unix.O_RDONLY)
		const callers, rounds = 8, 15
		mems := make([][]byte, callers)
		for c := range mems {
			mems[c] = mmapAnon(t, n*bs)
		}
		var wg sync.WaitGroup
		errc := make(chan error, callers)
		for c := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := range rounds {
					clear(mems[c])
					// Odd sizes leave some workers without ops.
					ops := readOps(fd, mems[c], n-(c*r)%200, bs, c+r)
					if err := p.Run(ops); err != nil {
						errc <- err
						return
					}
					if err := verifyOps(ops, mems[c]); err != nil {
						errc <- fmt.Errorf("caller %d round %d: %w", c, r, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Error(err)
		}
		if err := p.Run(nil); err != nil {
			t.Errorf("Run(nil) = %v", err)
		}
	})
}

func TestPoolEach(t *testing.T) {
	path := patternFile(t, testDir(t), 1<<20)
	poolKinds(t, func(t *testing.T, kind string) {
		const workers = 4
		p := newPool(t, PoolConfig{Kind: kind, Workers: workers, QueueDepth: 8})
		defer p.Close()
		fd := openFd(t, path, unix.O_RDONLY)
		mem := mmapAnon(t, 1<<20)
		var calls [workers]atomic.Int32
		var tids [2][workers]int
		for round := range 2 {
			err := p.Each(func(w int, e Engine) {
				calls[w].Add(1)
				tids[round][w] = unix.Gettid()
				if e.Name() != kind {
					panic("worker engine is " + e.Name())
				}
				// Each worker reads its quarter with its own engine.
				q := len(mem) / workers
				ops := readOps(fd, mem[w*q:(w+1)*q], q/4096, 4096, 0)
				for i := range ops {
					ops[i].Off += int64(w * q)
				}
				if err := e.Run(ops); err != nil {
					panic(err)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		checkPattern(t, "mapping", mem, 0)
		seen := map[int]int{}
		for w := range workers {
			if c := calls[w].Load(); c != 2 {
				t.Errorf("worker %d ran fn %d times in 2 Each calls", w, c)
			}
			// Locked to its thread: same thread both times, no thread shared.
			if tids[0][w] != tids[1][w] {
				t.Errorf("worker %d ran on thread %d then %d", w, tids[0][w], tids[1][w])
			}
			if o, dup := seen[tids[0][w]]; dup {
				t.Errorf("workers %d and %d share thread %d", o, w, tids[0][w])
			}
			seen[tids[0][w]] = w
		}

		// A panic comes back as an error and leaves the pool working.
		err := p.Each(func(w int, e Engine) {
			if w == 1 {
				panic("boom")
			}
		})
		if !isErrno(err, unix.EIO) {
			t.Errorf("Each with a panicking fn: %v, want EIO", err)
		}
		clear(mem)
		ops := readOps(fd, mem, 256, 4096, 3)
		if err := p.Run(ops); err != nil {
			t.Fatal(err)
		}
		if err := verifyOps(ops, mem); err != nil {
			t.Error(err)
		}
	})
}

// failRings makes createRing fail for the calls fail picks, until cleanup.
func failRings(t *testing.T, fail func(call int) bool) {
	t.Helper()
	requireUring(t)
	orig := createRing
	var calls atomic.Int32
	createRing = func(entries uint32) (*giouring.Ring, error) {
		if fail(int(calls.Add(1)) - 1) {
			return nil, unix.ENOMEM
		}
		return orig(entries)
	}
	t.Cleanup(func() { createRing = orig })
}

func TestPoolFallback(t *testing.T) {
	path := patternFile(t, testDir(t), 1<<20)
	fd := openFd(t, path, unix.O_RDONLY)

	check := func(t *testing.T, p *Pool, wantSync int) {
		t.Helper()
		var onSync atomic.Int32
		if err := p.Each(func(w int, e Engine) {
			if e.Name() == KindSync {
				onSync.Add(1)
			}
		}); err != nil {
			t.Fatal(err)
		}
		if int(onSync.Load()) != wantSync {
			t.Errorf("%d workers on sync, want %d", onSync.Load(), wantSync)
		}
		if wantSync > 0 && !isErrno(p.RingError(), unix.ENOMEM) {
			t.Errorf("RingError() = %v, want ENOMEM", p.RingError())
		}
		mem := mmapAnon(t, 1<<20)
		ops := readOps(fd, mem, 256, 4096, 1)
		if err := p.Run(ops); err != nil {
			t.Fatal(err)
		}
		if err := verifyOps(ops, mem); err != nil {
			t.Error(err)
		}
	}

	t.Run("some", func(t *testing.T) {
		failRings(t, func(call int) bool { return call%2 == 1 })
		for _, kind := range []string{KindIOUring, KindAuto} {
			p := newPool(t, PoolConfig{Kind: kind, Workers: 4, QueueDepth: 16})
			if want := "io_uring (2 of 4 workers on sync)"; p.Name() != want {
				t.Errorf("%s: Name() = %q, want %q", kind, p.Name(), want)
			}
			if p.Kind() != KindIOUring {
				t.Errorf("%s: Kind() = %q, want io_uring", kind, p.Kind())
			}
			check(t, p, 2)
			p.Close()
		}
	})
	t.Run("most", func(t *testing.T) {
		failRings(t, func(call int) bool { return call != 0 })
		p := newPool(t, PoolConfig{Kind: KindAuto, Workers: 3, QueueDepth: 16})
		defer p.Close()
		if want := "io_uring (2 of 3 workers on sync)"; p.Name() != want {
			t.Errorf("Name() = %q, want %q", p.Name(), want)
		}
		if p.Kind() != KindSync {
			t.Errorf("Kind() = %q, want sync", p.Kind())
		}
		check(t, p, 2)
	})
	t.Run("all", func(t *testing.T) {
		failRings(t, func(int) bool { return true })
		p := newPool(t, PoolConfig{Kind: KindAuto, Workers: 2})
		if p.Name() != KindSync || p.Kind() != KindSync {
			t.Errorf("auto with no rings: Name %q Kind %q, want sync", p.Name(), p.Kind())
		}
		check(t, p, 2)
		p.Close()

		// Asked for io_uring by name and got none: an error, not silence.
		if _, err := NewPool(PoolConfig{Kind: KindIOUring, Workers: 2}); !isErrno(err, unix.ENOMEM) {
			t.Errorf("NewPool(io_uring) with no rings: %v, want ENOMEM", err)
		}
		if _, err := New(KindIOUring, 0); !isErrno(err, unix.ENOMEM) {
			t.Errorf("New(io_uring) with no ring: %v, want ENOMEM", err)
		}
		e, err := New(KindAuto, 0)
		if err != nil || e.Name() != KindSync {
			t.Fatalf("New(auto) with no ring: %v, %v; want the sync engine", e, err)
		}
		e.Close()
	})
}

// TestPoolCloseQueued: Close while a Run is queued behind a busy worker
// finishes that Run before stopping.
func TestPoolCloseQueued(t *testing.T) {
	path := patternFile(t, testDir(t), 1<<20)
	poolKinds(t, func(t *testing.T, kind string) {
		p := newPool(t, PoolConfig{Kind: kind, Workers: 2, QueueDepth: 8})
		fd := openFd(t, path, unix.O_RDONLY)
		mem := mmapAnon(t, 1<<20)
		ops := readOps(fd, mem, 256, 4096, 5)

		release := make(chan struct{})
		var inside atomic.Int32
		eachDone := make(chan error, 1)
		go func() {
			eachDone <- p.Each(func(int, Engine) {
				inside.Add(1)
				<-release
			})
		}()
		// Both workers are held inside fn, so the Run must queue.
		waitFor(t, "workers busy", func() bool { return inside.Load() == 2 })
		runDone := make(chan error, 1)
		go func() { runDone <- p.Run(ops) }()
		waitFor(t, "Run queued", func() bool {
			for _, w := range p.workers {
				if len(w.jobs) == 0 {
					return false
				}
			}
			return true
		})
		closeDone := make(chan error, 1)
		go func() { closeDone <- p.Close() }()
		waitFor(t, "Close started", func() bool {
			p.mu.RLock()
			defer p.mu.RUnlock()
			return p.closed
		})
		// A second Close also waits for the workers.
		closeDone2 := make(chan error, 1)
		go func() { closeDone2 <- p.Close() }()
		select {
		case <-closeDone:
			t.Fatal("Close returned while jobs were still running")
		case <-closeDone2:
			t.Fatal("second Close returned while jobs were still running")
		case <-time.After(20 * time.Millisecond):
		}
		close(release)
		for what, c := range map[string]chan error{"Each": eachDone, "Run": runDone, "Close": closeDone, "second Close": closeDone2} {
			select {
			case err := <-c:
				if err != nil {
					t.Errorf("%s: %v", what, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s did not return", what)
			}
		}
		if err := verifyOps(ops, mem); err != nil {
			t.Errorf("queued Run: %v", err)
		}

		if err := p.Run(ops); !isErrno(err, unix.ESHUTDOWN) {
			t.Errorf("Run after Close: %v, want ESHUTDOWN", err)
		}
		if err := p.Each(func(int, Engine) {}); !isErrno(err, unix.ESHUTDOWN) {
			t.Errorf("Each after Close: %v, want ESHUTDOWN", err)
		}
		if err := p.Run(nil); err != nil {
			t.Errorf("Run(nil) after Close: %v", err)
		}
		if err := p.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
}

// TestPoolCloseBusy: Close while many callers keep Run busy neither
// deadlocks nor panics; every Run either completes fully or is refused.
func TestPoolCloseBusy(t *testing.T) {
	const n, bs = 2000, 4096
	path := patternFile(t, testDir(t), n*bs)
	poolKinds(t, func(t *testing.T, kind string) {
		p := newPool(t, PoolConfig{Kind: kind, Workers: 2, QueueDepth: 64})
		fd := openFd(t, path, unix.O_RDONLY)
		const callers = 6
		var wg sync.WaitGroup
		var completed, refused atomic.Int32
		errc := make(chan error, callers)
		for c := range callers {
			mem := mmapAnon(t, n*bs)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := 0; ; r++ {
					ops := readOps(fd, mem, n, bs, c+r)
					err := p.Run(ops)
					if isErrno(err, unix.ESHUTDOWN) {
						refused.Add(1)
						return
					}
					if err == nil {
						err = verifyOps(ops, mem)
					}
					if err != nil {
						errc <- err
						return
					}
					completed.Add(1)
				}
			}()
		}
		time.Sleep(100 * time.Millisecond)
		done := make(chan struct{})
		go func() {
			p.Close()
			wg.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("Close with Runs in flight did not finish")
		}
		close(errc)
		for err := range errc {
			t.Error(err)
		}
		if refused.Load() != callers {
			t.Errorf("%d of %d callers saw ESHUTDOWN", refused.Load(), callers)
		}
		if completed.Load() == 0 {
			t.Error("no Run completed before Close")
		}
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestEachOn runs a function on a wrapped-around subset of the workers
// only, each once.
func TestEachOn(t *testing.T) {
	p := newPool(t, PoolConfig{Kind: KindSync, Workers: 4})
	defer p.Close()
	for _, c := range []struct {
		start, n int
		want     []int
	}{{3, 2, []int{0, 3}}, {1, 1, []int{1}}, {6, 9, []int{0, 1, 2, 3}}, {0, 0, []int{0}}} {
		var mu sync.Mutex
		var ran []int
		err := p.EachOn(c.start, c.n, func(w int, e Engine) {
			mu.Lock()
			ran = append(ran, w)
			mu.Unlock()
		})
		slices.Sort(ran)
		if err != nil || !slices.Equal(ran, c.want) {
			t.Errorf("EachOn(%d, %d) ran on %v (%v), want %v", c.start, c.n, ran, err, c.want)
		}
	}
}

// TestEachInUntil: the call returns once enough is closed, though a job
// is still queued behind a busy worker (which runs it later); with enough
// never closed it waits for every job and reports a panic as EachIn does.
func TestEachInUntil(t *testing.T) {
	p := newPool(t, PoolConfig{Kind: KindSync, Workers: 2})
	defer p.Close()
	busy, release := make(chan struct{}), make(chan struct{})
	go p.EachOn(1, 1, func(int, Engine) { close(busy); <-release })
	<-busy
	enough := make(chan struct{})
	var ran atomic.Int32
	err := p.EachInUntil(enough, 0, 2, 0, 2, func(w int, e Engine) {
		if ran.Add(1) == 1 {
			close(enough) // the first job does all the work
		}
	})
	if err != nil || ran.Load() != 1 {
		t.Fatalf("EachInUntil: %v after %d jobs, want nil after the first", err, ran.Load())
	}
	close(release)
	if err := p.EachOn(1, 1, func(int, Engine) {}); err != nil || ran.Load() != 2 {
		t.Fatalf("the late job: ran %d jobs (%v), want 2", ran.Load(), err)
	}
	err = p.EachInUntil(nil, 0, 2, 0, 2, func(w int, e Engine) {
		if w == 1 {
			panic("boom")
		}
	})
	if err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("a panicking job: %v, want its error", err)
	}
}

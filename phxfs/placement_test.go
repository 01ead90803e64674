package phxfs

import (
	"bytes"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/ioengine"
)

// TestPlacementSplitsThePool: one device loading gets every worker; two
// devices loading at once get disjoint halves, whatever the rotation.
func TestPlacementSplitsThePool(t *testing.T) {
	l, _ := newLib(t, setup{"sync", Staged}, 2, func(c *Config) { c.Workers = 8 })
	r0, k, _ := l.loading.enter(0)
	if r0 != 0 || k != 1 {
		t.Fatalf("one device loading: rank %d of %d", r0, k)
	}
	if c := l.place(r0, k, 100); c.base != 0 || c.size != 8 || c.n != 8 {
		t.Fatalf("alone: %+v, want all 8 workers", c)
	}
	r1, k, _ := l.loading.enter(1)
	if r1 != 1 || k != 2 {
		t.Fatalf("second device: rank %d of %d", r1, k)
	}
	for i := range 20 {
		for rank, lo := range []int{0, 4} {
			c := l.place(rank, 2, 1+i%6)
			if c.n != min(1+i%6, 4) {
				t.Fatalf("rank %d of 2, %d wanted: %d workers", rank, 1+i%6, c.n)
			}
			for j := range c.n {
				if w := c.worker(j); w < lo || w >= lo+4 || c.index(w) != j {
					t.Fatalf("rank %d of 2, %d wanted: worker %d of %+v is %d, outside [%d, %d)", rank, 1+i%6, j, c, w, lo, lo+4)
				}
			}
		}
	}
	l.loading.leave(0)
	if r, k, _ := l.loading.enter(1); r != 0 || k != 1 {
		t.Fatalf("after device 0 left: rank %d of %d", r, k)
	}
	l.loading.leave(1)
	l.loading.leave(1)
	if len(l.loading.active) != 0 {
		t.Fatalf("active left: %v", l.loading.active)
	}
}

// TestPlacementCoversThePartAlike: the plans of one device wrap around
// its part of the pool, so that each worker gets as many jobs as any
// other (a KV client's batches in flight: seven workers each of sixteen).
// Starts kept inside the part without wrapping gave workers 6-9 seven
// jobs for each one of workers 0 and 15.
func TestPlacementCoversThePartAlike(t *testing.T) {
	l, _ := newLib(t, setup{"sync", Staged}, 0, func(c *Config) { c.Workers = 16 })
	for _, tc := range []struct{ rank, k, want, lo, size int }{{0, 1, 7, 0, 16}, {1, 2, 3, 8, 8}} {
		jobs := make([]int, 16)
		for range 16 * tc.size {
			c := l.place(tc.rank, tc.k, tc.want)
			for i := range c.n {
				jobs[c.worker(i)]++
			}
		}
		part := jobs[tc.lo : tc.lo+tc.size]
		if slices.Min(part) != slices.Max(part) || slices.Min(part) == 0 {
			t.Errorf("rank %d of %d, plans of %d workers: jobs per worker of its part %v, want all alike", tc.rank, tc.k, tc.want, part)
		}
		for w, n := range jobs {
			if (w < tc.lo || w >= tc.lo+tc.size) && n != 0 {
				t.Errorf("rank %d of %d: worker %d outside its part got %d jobs", tc.rank, tc.k, w, n)
			}
		}
	}
}

// TestClaimerAndLeaving: a plan's xfers are handed out once each, in
// order, in chunks of about a slot; a worker the placement gives to another
// device may leave only while one of the plan's workers stays in its part.
func TestClaimerAndLeaving(t *testing.T) {
	xs := make([]xfer, 100)
	for i := range xs {
		xs[i].len = 1000
	}
	c := newClaimer(xs, 4, 10_000)
	seen := 0
	for idx := c.claim(nil); idx != nil; idx = c.claim(nil) {
		if len(idx) != 10 || idx[0] != seen {
			t.Fatalf("chunk %v after %d xfers", idx, seen)
		}
		seen += len(idx)
	}
	if seen != 100 {
		t.Fatalf("%d xfers handed out", seen)
	}
	if c := newClaimer(xs, 50, 10_000); len(c.claim(nil)) != 2 {
		t.Error("a plan on 50 workers is not spread by an even share")
	}

	// Workers claiming at once: every xfer exactly once, each chunk a run
	// of consecutive xfers.
	many := make([]xfer, 5000)
	for i := range many {
		many[i].len = int64(1 + i%7)
	}
	c = newClaimer(many, 8, 64)
	got := make([]atomic.Int32, len(many))
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []int
			for buf = c.claim(buf); buf != nil; buf = c.claim(buf) {
				for k, i := range buf {
					if i != buf[0]+k {
						t.Errorf("chunk %v: not consecutive", buf)
						return
					}
					got[i].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	for i := range got {
		if n := got[i].Load(); n != 1 {
			t.Fatalf("xfer %d claimed %d times", i, n)
		}
	}

	l, _ := newLib(t, setup{"sync", Staged}, 2, func(c *Config) { c.Workers = 8 })
	l.loading.enter(1) // device 1 alone: its plan took every worker
	if l.mayLeave(1, 2, crew{0, 8, 0, 8}) {
		t.Error("a worker left with one device loading")
	}
	l.loading.enter(0) // device 0 arrives: it gets workers 0-3
	if !l.mayLeave(1, 2, crew{0, 8, 0, 8}) || l.mayLeave(1, 5, crew{0, 8, 0, 8}) {
		t.Error("device 1's plan should give back workers 0-3, and keep 4-7")
	}
	if l.mayLeave(1, 2, crew{0, 8, 0, 3}) {
		t.Error("a plan with no worker left in its part must keep its workers")
	}
}

// TestLastWorkerNeverLeaves: ranks shift while loads start and finish, so
// that every worker of a plan sees the placement give it to another device
// at the moment it asks; the plan's last worker stays anyway, or its
// unclaimed xfers would never run (issue 18, item 2).
func TestLastWorkerNeverLeaves(t *testing.T) {
	// Placement is arithmetic on device numbers: no device is opened.
	l, _ := newLib(t, setup{"sync", Staged}, 0, func(c *Config) { c.Workers = 8 })
	const dev = 1
	rank, k, _ := l.loading.enter(dev) // device 1 alone: its plan takes every worker
	cr := l.place(rank, k, 8)
	if cr.base != 0 || cr.size != 8 || cr.n != 8 {
		t.Fatalf("alone: %+v, want all 8 workers", cr)
	}
	xs := make([]xfer, 64)
	for i := range xs {
		xs[i].len = 4096
	}
	c := newClaimer(xs, cr.n, 4096)
	var stayed []int
	ask := func(workers ...int) {
		for _, w := range workers {
			if !l.mayLeave(dev, w, cr) {
				t.Fatalf("worker %d: the placement keeps it; the test wants every worker asked to leave", w)
			}
			if !l.leaves(c, dev, w, cr) {
				stayed = append(stayed, w)
			}
		}
	}
	// Devices 0 and 2 start loading: device 1 (rank 1 of 3) gets workers
	// 2-3, and the plan's others are asked to leave.
	l.loading.enter(0)
	l.loading.enter(2)
	ask(0, 1, 4, 5, 6, 7)
	// Device 2 finishes: device 1 (rank 1 of 2) gets workers 4-7, and 2-3
	// are asked to leave too.
	l.loading.leave(2)
	ask(2, 3)
	if len(stayed) != 1 || stayed[0] != 3 {
		t.Fatalf("workers %v stayed, want the last one asked (3) alone", stayed)
	}
	// The one staying claims every xfer.
	claimed := 0
	for idx := c.claim(nil); idx != nil; idx = c.claim(nil) {
		claimed += len(idx)
	}
	if claimed != len(xs) {
		t.Fatalf("%d of %d xfers claimed", claimed, len(xs))
	}
	l.loading.leave(0)
	l.loading.leave(dev)
}

// TestManyDevicesLoadingAtOnce: four staged devices load at once, each
// its own batches of its own size, so that loads start and finish at
// different times and ranks shift under running plans. Every request
// moves exactly its length and every byte lands (issue 18, item 2: with
// three or more devices, every worker of a plan could leave it and its
// unclaimed transfers came back as short successes).
func TestManyDevicesLoadingAtOnce(t *testing.T) {
	const devices, blocks, block = 4, 64, 64 << 10
	c := emuStaged(t, devices)
	l := newLibOn(t, c, setup{"sync", Staged}, devices, func(c *Config) {
		c.Workers, c.BounceSize, c.StagedShare = 8, block, block
	})
	name := patternFile(t, blocks*block)
	fd := openFile(t, name, unix.O_RDONLY)
	mems := make([]connector.Memory, devices)
	for d := range mems {
		mems[d] = alloc(t, c, d, blocks*block)
		register(t, l, mems[d])
	}
	var wg sync.WaitGroup
	for d := range devices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 8 << (d % 3) // 8, 16, 32 or 8 blocks a batch
			for it := range 24 + 8*d {
				if !loadAndCheck(t, l, c, mems[d], fd, n, it*5+d*3) {
					return
				}
			}
		}()
	}
	wg.Wait()
}

// loadAndCheck reads n blocks of the pattern file into m in one batch,
// from offsets that differ with seed (so bytes left by an earlier batch do
// not pass), and checks every result and every byte.
func loadAndCheck(t *testing.T, l *Lib, c connector.Connector, m connector.Memory, fd, n, seed int) bool {
	const blocks, block = 64, 64 << 10
	reqs := make([]Request, n)
	for k := range reqs {
		off := int64((seed+k*7)%blocks) * block
		reqs[k] = Request{Fd: fd, Device: m.Device(), DevAddr: m.Addr(), BufOffset: int64(k) * block, Len: block, FileOffset: off}
	}
	if failed, err := l.ReadBatch(reqs); failed != 0 || err != nil {
		t.Errorf("device %d: %d failed, %v: %s", m.Device(), failed, err, describe(reqs))
		return false
	}
	got := deviceBytes(t, c, m, 0, int64(n)*block)
	for k, rq := range reqs {
		want := make([]byte, block)
		fillPattern(want, rq.FileOffset)
		if !bytes.Equal(got[int64(k)*block:int64(k+1)*block], want) {
			t.Errorf("device %d: block %d (file offset %d) differs", m.Device(), k, rq.FileOffset)
			return false
		}
	}
	return true
}

// TestPlanEndsWithItsWorkNotItsLastJob: a staged read is done when its
// chunks have landed, not when every worker it was handed to has run. One
// of its workers is busy (another caller's job, held here): the other
// claims every chunk, the batch returns with every block in place, and the
// busy worker's job, when it runs at last, finds nothing to do.
func TestPlanEndsWithItsWorkNotItsLastJob(t *testing.T) {
	// The staged pipeline's own logic: the emulated staged device whatever
	// PHX_TEST_CONNECTOR says (the kmod transport stripes over every worker).
	c := emuStaged(t, 1)
	l := newLibOn(t, c, setup{"sync", Staged}, 1, func(cfg *Config) { cfg.Workers = 2 })
	m, reqs := kvBatch(t, l, c, 5)
	defer holdWorkers(l, 1, 1)()
	waitRead(t, readAsync(l, reqs), "the batch waited for its job queued behind a busy worker")
	dev := deviceBytes(t, c, m, 0, 416*16384)
	for _, rq := range reqs {
		checkPattern(t, dev[rq.BufOffset:rq.BufOffset+rq.Len], rq.FileOffset)
	}
}

// TestAWorkerDoneTakesAnotherReadsChunks: a read whose crew is busy with
// other work is read by a worker outside its crew as soon as that worker
// has finished its own read (steal.go); every byte lands. The old code
// left the read waiting for its crew.
func TestAWorkerDoneTakesAnotherReadsChunks(t *testing.T) {
	c := emuStaged(t, 1) // the staged pipeline's own logic, whatever PHX_TEST_CONNECTOR says
	l := newLibOn(t, c, setup{"sync", Staged}, 1, func(cfg *Config) { cfg.Workers = 3 })
	m, reqs := kvBatch(t, l, c, 7)
	// a: two bounce slots' worth (the tests' 256 KiB), so two workers; b: one block, one worker.
	a, b := reqs[:30], reqs[30:31]
	if n := stagedWorkersOf(t, l, a); n != 2 {
		t.Fatalf("the first read goes to %d workers, want 2", n)
	}

	defer holdWorkers(l, 1, 2)()
	read := func(reqs []Request, rotor uint64) <-chan error {
		l.rotor.Store(rotor) // place: the crew starts at (rotor + n) % 3
		return readAsync(l, reqs)
	}
	doneA := read(a, 2) // crew: workers 1 and 2, both busy
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		l.offers.mu.Lock()
		n := len(l.offers.open)
		l.offers.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first read never started")
		}
	}
	doneB := read(b, 2) // crew: worker 0 alone, idle
	for _, done := range []<-chan error{doneB, doneA} {
		waitRead(t, done, "a read waited for its busy crew while worker 0 was done")
	}
	if s := l.offers.stolen.Load(); s < 1 {
		t.Fatalf("%d chunks stolen, want the first read's", s)
	}
	dev := deviceBytes(t, c, m, 0, 416*16384)
	for _, rq := range reqs[:31] {
		checkPattern(t, dev[rq.BufOffset:rq.BufOffset+rq.Len], rq.FileOffset)
	}
}

// stagedWorkersOf is how many workers a read of reqs alone goes to.
func stagedWorkersOf(t *testing.T, l *Lib, reqs []Request) int {
	p, err := l.prepare(false, reqs)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		l.mu.Lock()
		for _, h := range p.held {
			l.release(h)
		}
		l.mu.Unlock()
		p.recycle()
	}()
	return l.stagedWorkers(p.xfers, 1)
}

// TestDrainWaitsForAWorkerInThePlan: a plan's end (claimer.drain) claims
// nothing more and waits for the worker that still reads a chunk (a
// stealer, which no job of the crew accounts for); with nobody in the
// plan it returns at once, the chunks left unclaimed for good.
func TestDrainWaitsForAWorkerInThePlan(t *testing.T) {
	xs := make([]xfer, 4)
	for i := range xs {
		xs[i].len = 100
	}
	c := newClaimer(xs, 2, 200)
	c.begin()
	if got := c.claim(nil); len(got) != 2 {
		t.Fatalf("claimed %v, want two xfers", got)
	}
	drained := make(chan struct{})
	go func() { c.drain(); close(drained) }()
	select {
	case <-drained:
		t.Fatal("drain returned while a worker read its chunk")
	case <-time.After(50 * time.Millisecond):
	}
	if got := c.claim(nil); got != nil {
		t.Fatalf("claimed %v after drain began", got)
	}
	c.end()
	select {
	case <-drained:
	case <-time.After(5 * time.Second):
		t.Fatal("drain did not return after the last worker ended")
	}

	idle := newClaimer(xs, 2, 200)
	idle.drain()
	if idle.left() || idle.claim(nil) != nil {
		t.Fatal("chunks left to claim after drain")
	}
}

// holdWorkers keeps n workers from start busy until the function it
// returns is called.
func holdWorkers(l *Lib, start, n int) (release func()) {
	var busy sync.WaitGroup
	busy.Add(n)
	free := make(chan struct{})
	held := make(chan error, 1)
	go func() { held <- l.pool.EachOn(start, n, func(int, ioengine.Engine) { busy.Done(); <-free }) }()
	busy.Wait()
	return func() { close(free); <-held }
}

// readAsync runs ReadBatch(reqs) on a goroutine; its error (or how many
// requests failed) comes on the channel.
func readAsync(l *Lib, reqs []Request) <-chan error {
	done := make(chan error, 1)
	go func() {
		n, err := l.ReadBatch(reqs)
		if err == nil && n != 0 {
			err = fmt.Errorf("%d requests failed", n)
		}
		done <- err
	}()
	return done
}

// waitRead fails the test with why unless done says the read succeeded
// within 10 s.
func waitRead(t *testing.T, done <-chan error, why string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal(why)
	}
}

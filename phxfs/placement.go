package phxfs

import (
	"sync"
	"sync/atomic"
)

// Placement: which workers run a staged plan. A worker serves its jobs one
// after the other, so two devices' loads striped over every worker would
// run one after the other on each of them: one GPU's copy engine idles
// while the other's works. Devices loading at the same time therefore
// split the pool: with k devices loading, device rank r (by index among
// them) gets workers [r·W/k, (r+1)·W/k). One device alone gets all of
// them. Measured on two H200s (docs/gpu-notes.md, run 11): one shared
// pool moved 52.7 GB/s into both GPUs, the pool split by device 83.9.

// loading counts the staged plans running per device.
type loading struct {
	mu     sync.Mutex
	active map[int]int
}

// enter counts a plan of dev and returns dev's rank among the devices
// loading now, how many they are, and how many plans of dev run now,
// this one included.
func (ld *loading) enter(dev int) (rank, k, plans int) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if ld.active == nil {
		ld.active = map[int]int{}
	}
	ld.active[dev]++
	rank, k = ld.rankLocked(dev)
	return rank, k, ld.active[dev]
}

func (ld *loading) leave(dev int) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if ld.active[dev]--; ld.active[dev] <= 0 {
		delete(ld.active, dev)
	}
}

// crew is the workers of a plan: n of them from base+start, wrapping
// around inside the device's part [base, base+size) of the pool.
type crew struct{ base, size, start, n int }

// worker is the plan's i-th worker.
func (c crew) worker(i int) int { return c.base + (c.start+i)%c.size }

// index is which of the plan's workers w is (its i: worker(i) == w).
func (c crew) index(w int) int { return ((w-c.base-c.start)%c.size + c.size) % c.size }

// place returns the workers of a plan that wants want of them, for device
// rank of k loading: inside the device's part of the pool, starting where
// the previous plan stopped and wrapping around inside the part, so that
// small concurrent batches spread over the whole part alike. (Starts kept
// inside the part without wrapping gave its middle workers seven times the
// jobs of its first and last: four KV batches in flight of seven workers
// each queued three deep on workers 7-10 of 16 while 0 and 15 idled.)
func (l *Lib) place(rank, k, want int) crew {
	base, part := l.part(rank, k)
	n := min(want, part)
	rot := int(l.rotor.Add(uint64(n)) % uint64(part))
	return crew{base: base, size: part, start: rot, n: n}
}

// stagedDevice is the device of a plan's first staged xfer.
func stagedDevice(xs []xfer) int {
	for i := range xs {
		if xs[i].staged {
			return xs[i].dev
		}
	}
	return 0
}

// rankOf is dev's rank among the devices loading now, and their number.
func (ld *loading) rankOf(dev int) (rank, k int) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.rankLocked(dev)
}

// rankLocked counts the loading devices before dev; caller holds mu.
func (ld *loading) rankLocked(dev int) (rank, k int) {
	for d := range ld.active {
		if d < dev {
			rank++
		}
	}
	return rank, len(ld.active)
}

// part is the workers [base, base+size) of device rank of k loading.
func (l *Lib) part(rank, k int) (base, size int) {
	size = max(l.pool.Workers()/k, 1)
	return min(rank*size, l.pool.Workers()-size), size
}

// mayLeave says whether worker w, one of the plan's crew, would leave its
// plan of dev: the placement now gives w to another device, and a worker
// of the plan is inside dev's part to go on with it. Ranks shift while
// other loads start and finish, so every worker of a plan can see this at
// one time or another: the claimer keeps the last one (leaves).
func (l *Lib) mayLeave(dev, w int, c crew) bool {
	rank, k := l.loading.rankOf(dev)
	if k <= 1 {
		return false
	}
	base, part := l.part(rank, k)
	inside := func(x int) bool { return x >= base && x < base+part }
	if inside(w) {
		return false
	}
	for i := range c.n {
		if inside(c.worker(i)) {
			return true
		}
	}
	return false
}

// leaves says whether worker w leaves its plan (of dev, its crew c) now:
// the placement wants it elsewhere (mayLeave) and it is not the plan's
// last worker, which claims what is left whatever the placement says.
func (l *Lib) leaves(cl *claimer, dev, w int, c crew) bool {
	return l.mayLeave(dev, w, c) && cl.leave()
}

// claimer hands a plan's xfers out in order, a chunk at a time, to the
// workers running it: a worker that leaves the plan (leaves) leaves the
// rest to the others. A chunk is about one slot's worth, and no more than
// an even share of the plan, so small plans still spread.
//
// The plan is done when every chunk is claimed and every worker that
// claims has finished (done is closed then), not when every worker it was
// handed to has run: one queued behind another plan on a busy worker
// finds the chunks taken by the others and nothing to do
// (ioengine.Pool.EachInUntil). A worker outside the crew may claim chunks
// too (steal.go): no job of the plan accounts for it, so the plan ends
// with drain, which waits for it.
type claimer struct {
	next    atomic.Int64
	staying atomic.Int64 // the plan's workers that have not left
	working atomic.Int64 // workers between begin and end
	ended   atomic.Bool
	done    chan struct{}
	xfers   []xfer
	chunk   int64
}

// newClaimer hands xs out to workers workers.
func newClaimer(xs []xfer, workers int, slot int64) *claimer {
	var total int64
	for i := range xs {
		total += xs[i].len
	}
	c := &claimer{xfers: xs, chunk: max(min(slot, total/int64(max(workers, 1))), 1), done: make(chan struct{})}
	c.staying.Store(int64(max(workers, 1)))
	return c
}

// begin is called by a worker before its first claim, end after its last
// chunk has landed: the last end after every chunk is claimed closes
// done. A worker that begins after that claims nothing.
func (c *claimer) begin() { c.working.Add(1) }

func (c *claimer) end() {
	if c.working.Add(-1) == 0 && c.next.Load() >= int64(len(c.xfers)) && c.ended.CompareAndSwap(false, true) {
		close(c.done)
	}
}

// drain ends the plan: no chunk is claimed from now on, and drain returns
// once every worker that claimed one has ended.
func (c *claimer) drain() {
	n := int64(len(c.xfers))
	for s := c.next.Load(); s < n && !c.next.CompareAndSwap(s, n); s = c.next.Load() {
	}
	c.begin()
	c.end() // closes done when no worker is in the plan; else the last one's end does
	<-c.done
}

// left says whether a chunk is still unclaimed.
func (c *claimer) left() bool { return c.next.Load() < int64(len(c.xfers)) }

// leave takes a worker off the plan, unless it is the last one staying:
// the last worker claims every xfer left, so none is left unrun.
func (c *claimer) leave() bool {
	for {
		s := c.staying.Load()
		if s <= 1 {
			return false
		}
		if c.staying.CompareAndSwap(s, s-1) {
			return true
		}
	}
}

// claim returns the next chunk of xfer indices (in buf's array, which it
// reuses), nil when none is left. A chunk is taken with one
// compare-and-swap: the workers of a column slice (thousands of small
// xfers) would otherwise pass the counter's cache line back and forth
// once per xfer.
func (c *claimer) claim(buf []int) []int {
	n := int64(len(c.xfers))
	for {
		start := c.next.Load()
		if start >= n {
			return nil
		}
		end, bytes := start, int64(0)
		for end < n && bytes < c.chunk {
			bytes += c.xfers[end].len
			end++
		}
		if !c.next.CompareAndSwap(start, end) {
			continue
		}
		idx := buf[:0]
		for i := start; i < end; i++ {
			idx = append(idx, int(i))
		}
		return idx
	}
}

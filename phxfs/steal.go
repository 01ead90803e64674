package phxfs

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/phxmount/phxmount/ioengine"
)

// Stealing: a worker that has finished its share of a staged read takes
// the chunks still unclaimed of the other staged reads of its device, the
// oldest first, before it goes back to its queue.
//
// A staged read is handed to its crew (placement.go), and a crew worker
// serves its queue in order: with several small reads in flight (a
// KV-cache client keeps four 16 KiB batches of 409 blocks in flight, each
// handed to seven of sixteen workers) a read waits for crew workers busy
// with the reads queued before it while workers outside its crew idle.
// Run 72 (docs/gpu-notes.md): one client's four batches in flight moved
// 17.8 GB/s in process, a batch 1.5 ms where one alone takes 1.0, and the
// pool's gathers kept 5.3 workers of 16 busy on average. The chunks a
// worker steals are the ones a busy crew worker would have claimed later;
// when that worker runs its job it finds them taken and touches nothing
// (the claimer's late job). Writes are striped, not claimed: nothing to
// steal.

// offer is a staged read running now: what a worker needs to claim and
// read its chunks.
type offer struct {
	p    *plan
	c    *claimer
	bf   batchFiles
	mode ODirect
	dev  int
}

// offers are the staged reads running now, in the order they started.
type offers struct {
	mu     sync.Mutex
	open   []*offer
	stolen atomic.Int64 // chunks read by a worker outside their read's crew
}

func (s *offers) add(o *offer) {
	s.mu.Lock()
	s.open = append(s.open, o)
	s.mu.Unlock()
}

// remove takes o off the list; its read is done (its chunks all read),
// and what a worker that took o before this still does with it claims
// nothing (claimer).
func (s *offers) remove(o *offer) {
	s.mu.Lock()
	if i := slices.Index(s.open, o); i >= 0 {
		s.open = slices.Delete(s.open, i, i+1)
	}
	s.mu.Unlock()
}

// next is the oldest read of dev with chunks left to claim, or nil.
func (s *offers) next(dev int) *offer {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.open {
		if o.dev == dev && o.c.left() {
			return o
		}
	}
	return nil
}

// readShare is worker w's part of o's read: chunks claimed until none is
// left or leave says the worker goes, each read through w's slots, every
// one landed before it returns. stolen: w is not of o's crew (each chunk
// is counted before the read can end).
func (l *Lib) readShare(w int, eng ioengine.Engine, o *offer, leave func() bool, stolen bool) {
	o.c.begin()
	defer o.c.end()
	// The worker's claims, one array, kept for its next read (a worker
	// runs one read at a time).
	buf := l.staged.claims[w]
	defer func() { l.staged.claims[w] = buf }()
	src := func() []int {
		if leave() {
			return nil
		}
		idx := o.c.claim(buf)
		if idx == nil {
			return nil // buf keeps its array
		}
		buf = idx
		if stolen {
			l.offers.stolen.Add(1)
		}
		return l.hostFirst(eng, o.p, idx)
	}
	l.stagedRead(w, eng, o.p.xfers, src, o.bf, o.mode)
}

// steal has worker w read the unclaimed chunks of dev's other staged
// reads while w belongs to dev's part of the pool.
func (l *Lib) steal(w int, eng ioengine.Engine, dev int) {
	gone := func() bool { return !l.inPart(dev, w) }
	for {
		// An offer of dev means a read of dev runs: dev is loading.
		o := l.offers.next(dev)
		if o == nil || gone() {
			return
		}
		l.readShare(w, eng, o, gone, true)
	}
}

// inPart says whether worker w is inside the part of the pool that the
// placement gives dev now (all of it while dev alone loads, or none does).
func (l *Lib) inPart(dev, w int) bool {
	rank, k := l.loading.rankOf(dev)
	if k <= 1 {
		return true
	}
	base, part := l.part(rank, k)
	return w >= base && w < base+part
}

package phxfs

import "sync"

// A plan's arrays are made anew for every batch unless kept: a KV-cache
// client's batch of 409 blocks made ~200 KB of them (the xfers, their
// segments, the sort's keys and targets, the holds), several thousand
// batches a second through the mount, and the collections that garbage
// cost ran beside every worker's copies. So a batch that is done with its
// plan (ReadBatch, WriteBatch, Read, Write: when execute has returned)
// gives the arrays back for the next batch's plan; an asynchronous
// batch's plan lives on in its Batch and is left to the collector.

// planMemory is the arrays of one plan, kept between batches.
type planMemory struct {
	targets, sorted []target
	keys            []orderKey
	ks              []int64
	segs            []segment
	xfers           []xfer
	reqSegs         [][]segment
	held            []*region
	trans           []Transport
}

var planMemories = sync.Pool{New: func() any { return new(planMemory) }}

// maxKeptPlan bounds the xfers of a plan whose arrays are kept: a
// strided batch's thousands of pieces are not a KV batch's, and one such
// plan must not pin its arrays for the life of the process.
const maxKeptPlan = 4096

// sized is s with length n, its array reused where large enough; the
// elements are zero.
func sized[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// reserved is s emptied, with room for n elements: its array where large
// enough, else a new one of exactly n (slices.Grow makes a temporary as
// large under the race detector, and tests bound what a batch allocates).
func reserved[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, 0, n)
	}
	return s[:0]
}

// recycle gives p's arrays back for another plan; p is not used again.
// Nothing kept holds a registration (their pointers are cleared): a
// region deregistered meanwhile is not kept alive by a pooled plan.
func (p *plan) recycle() {
	m := p.mem
	if m == nil {
		return
	}
	p.mem = nil
	m.xfers, m.held, m.reqSegs, m.trans = p.xfers[:0], p.held[:0], p.segs[:0], p.trans[:0]
	if cap(m.xfers) > maxKeptPlan || cap(m.reqSegs) > maxKeptPlan {
		return
	}
	for _, s := range [][]target{m.targets, m.sorted} {
		clear(s[:cap(s)])
	}
	clear(m.xfers[:cap(m.xfers)])
	clear(m.held[:cap(m.held)])
	clear(m.reqSegs[:cap(m.reqSegs)])
	planMemories.Put(m)
}

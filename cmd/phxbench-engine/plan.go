package main

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/phxfs"
)

// The request plans. phxfs's prepare sorts a batch by (fd, file offset) and
// merges requests whose file ranges and buffer ranges both follow on; fio
// does neither. The plans compared with fio keep both from happening, so
// the engine gets one op per request in submission order, as fio's queue
// does; the coalescing plan is measured and labelled on its own.
const (
	planRand     = "rand"       // random blocks, in submission order, one op each
	planSeq      = "seq"        // consecutive blocks, one op each
	planCoalesce = "seq-contig" // consecutive blocks into consecutive buffer slots: phxfs merges them
)

// planner builds the requests of each batch.
type planner struct {
	pattern string
	block   int64  // request size
	blocks  int64  // whole blocks in the file
	fds     []int  // fds[i] serves slot i; ascending, so prepare's sort keeps slot order
	buf     uint64 // the registered buffer, one block-sized slot per request
	rng     *rand.Rand
	next    int64 // the next sequential block
}

func newPlanner(pattern string, block, blocks int64, fds []int, buf uint64) (*planner, error) {
	switch {
	case pattern != planRand && pattern != planSeq && pattern != planCoalesce:
		return nil, fmt.Errorf("pattern %q: want %s, %s or %s", pattern, planRand, planSeq, planCoalesce)
	case block <= 0 || blocks <= 0 || len(fds) == 0:
		return nil, fmt.Errorf("plan needs a block size, a non-empty file and fds")
	case !slices.IsSorted(fds) || len(slices.Compact(slices.Clone(fds))) != len(fds):
		return nil, fmt.Errorf("plan fds must be distinct and ascending")
	}
	return &planner{pattern: pattern, block: block, blocks: blocks, fds: fds, buf: buf,
		rng: rand.New(rand.NewPCG(1, 2))}, nil
}

// fill builds the next batch into reqs; len(reqs) must not exceed len(fds).
func (p *planner) fill(reqs []phxfs.Request) {
	for i := range reqs {
		reqs[i] = phxfs.Request{Fd: p.fd(i), Device: 0, DevAddr: p.buf, BufOffset: p.slot(i, len(reqs)) * p.block,
			Len: p.block, FileOffset: p.nextBlock() * p.block}
	}
}

// fd gives every slot its own descriptor (dups of one open file), in
// ascending order, except in the coalescing plan, which needs one fd.
func (p *planner) fd(i int) int {
	if p.pattern == planCoalesce {
		return p.fds[0]
	}
	return p.fds[i]
}

// slot is where request i of n lands. The coalescing plan fills the buffer
// in order; the others fill it backwards, so no request's buffer follows on
// from the previous one's and nothing could merge even on one fd.
func (p *planner) slot(i, n int) int64 {
	if p.pattern == planCoalesce {
		return int64(i)
	}
	return int64(n - 1 - i)
}

func (p *planner) nextBlock() int64 {
	if p.pattern == planRand {
		return p.rng.Int64N(p.blocks)
	}
	b := p.next
	p.next = (p.next + 1) % p.blocks
	return b
}

// checkShape fails a run whose engine ops were not the requests it was
// meant to measure: the plans compared with fio must reach the engine as
// one op per request.
func checkShape(pattern string, st phxfs.Stats) error {
	if pattern == planCoalesce {
		return nil
	}
	if st.Coalesced != 0 || st.Ops != st.Requests {
		return fmt.Errorf("plan %s: %d requests became %d engine ops (%d coalesced); want one op per request",
			pattern, st.Requests, st.Ops, st.Coalesced)
	}
	return nil
}

// dupFds returns n dups of fd (one open file, so one O_DIRECT state, as
// fio's one fd has), ascending; the caller closes them.
func dupFds(fd, n int) ([]int, error) {
	var fds []int
	for len(fds) < n {
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			closeFds(fds)
			return nil, err
		}
		fds = append(fds, d)
	}
	slices.Sort(fds)
	return fds, nil
}

// closeFds closes the given descriptors.
func closeFds(fds []int) {
	for _, d := range fds {
		unix.Close(d)
	}
}

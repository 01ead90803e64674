package phxfs

import (
	"math"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// Planning turns a batch of requests into engine transfers in three steps:
// resolve (check each request and hold its registration), order (by file
// and offset, so neighbours meet) and cut (merge requests that follow on in
// both the file and the buffer, and split what is larger than one engine
// operation may be).

// xfer is one engine transfer: one or more coalesced requests, or a piece
// of a large one; or, for a strided read through the staged transport, a
// run of count of its pieces, stride apart in the file and one after the
// other in the device buffer (a column slice of every row: the run is
// gathered from the page cache into a slot and copied to the device in
// one piece, and costs the plan one xfer, not one per row).
type xfer struct {
	fd      int
	off     int64
	len     int64
	host    uintptr // where bytes land (host, kmod, host buffers)
	dev     int     // staged: the device and the device address
	devAddr uint64
	staged  bool
	result  int64 // bytes moved or a negative errno; notRun until it ran
	count   int64 // a run's pieces, each len/count bytes (0: one piece, len bytes)
	stride  int64 // a run's file stride
	// reg is the registration the bytes land in. Staged xfers and copies
	// never span two: each is one allocation of the device's (a CUDA IPC
	// import), and a copy past an allocation's end fails (CUDA: "copy is
	// larger than memobj size") even where the next allocation follows it
	// in the address space, as a caching allocator's segments and their
	// imports do.
	reg *region
}

// pieces is how many contiguous pieces of the file x moves.
func (x *xfer) pieces() int64 { return max(x.count, 1) }

// pieceLen is the length of each of x's pieces.
func (x *xfer) pieceLen() int64 { return x.len / x.pieces() }

// pieceOff is where x's piece j begins in the file.
func (x *xfer) pieceOff(j int64) int64 { return x.off + j*x.stride }

// end is where the last piece of x ends in the file.
func (x *xfer) end() int64 { return x.pieceOff(x.pieces()-1) + x.pieceLen() }

// notRun is the result of an xfer that no path has run yet. Every path
// that runs an xfer sets its result; one still notRun when the plan ends
// is an error for its request (finish), never a short count.
const notRun int64 = math.MinInt64

// segment maps part of a request onto part of an xfer.
type segment struct {
	x  int   // index into plan.xfers
	at int64 // offset of the segment inside the xfer
	n  int64
}

// plan is a batch resolved, checked, coalesced and cut into xfers.
type plan struct {
	write   bool
	reqs    []Request
	held    []*region // registrations held for the batch
	xfers   []xfer
	segs    [][]segment // per request, in order
	trans   []Transport // per request: its registration's transport ("" for host memory)
	hasHost bool
	staged  bool
	mem     *planMemory // the arrays above come from it (planMemory)
}

func (p *plan) verb() string {
	if p.write {
		return "write"
	}
	return "read"
}

// target is a resolved request: where its bytes go (where they come from
// is its request's: order sorts by it).
type target struct {
	i       int     // the request
	host    uintptr // host address (not staged)
	devAddr uint64  // device address (staged)
	staged  bool
	reg     *region
}

// prepare checks every request, takes a hold on every registration it uses,
// and plans the engine transfers. Requests that fail the checks get their
// errno as Result and never reach the engine.
func (l *Lib) prepare(write bool, reqs []Request) (*plan, error) {
	if n := batchPieces(reqs); n > MaxBatchPieces {
		return nil, errs.New(unix.E2BIG, "phxfs: a batch of more than %d pieces", MaxBatchPieces)
	}
	m := planMemories.Get().(*planMemory)
	p := &plan{write: write, reqs: reqs, mem: m, segs: sized(m.reqSegs, len(reqs)), held: m.held[:0],
		trans: sized(m.trans, len(reqs))}
	targets, err := l.resolve(p)
	if err != nil {
		p.recycle()
		return nil, err
	}
	order(reqs, targets, m)
	l.cut(p, targets)
	m.targets = targets
	l.stats.requests.Add(int64(len(targets)))
	l.stats.ops.Add(int64(len(p.xfers)))
	return p, nil
}

// resolve checks every request of p and holds the registration of each
// device buffer; it returns where each request that passed goes.
func (l *Lib) resolve(p *plan) ([]target, error) {
	targets := reserved(p.mem.targets, len(p.reqs))
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errs.New(unix.EINVAL, "phxfs: library closed")
	}
	for i := range p.reqs {
		rq := &p.reqs[i]
		rq.Result = 0
		switch {
		case rq.Len < 0 || rq.FileOffset < 0 || rq.BufOffset < 0 || rq.badShape():
			rq.Result = -int64(unix.EINVAL)
			continue
		case rq.Fd < 0:
			rq.Result = -int64(unix.EBADF)
			continue
		case rq.Len == 0:
			continue
		}
		if rq.Device < 0 {
			if rq.HostAddr == 0 {
				rq.Result = -int64(unix.EFAULT)
				continue
			}
			targets = append(targets, target{i: i, host: rq.HostAddr + uintptr(rq.BufOffset)})
			continue
		}
		r, err := l.hold(rq.Device, rq.DevAddr, rq.BufOffset, rq.span())
		if err != nil {
			rq.Result = -int64(unix.EFAULT)
			continue
		}
		if !p.write && r.readOnly {
			l.release(r)
			rq.Result = -int64(unix.EACCES) // memory shared read-only
			continue
		}
		p.held = append(p.held, r)
		p.trans[i] = r.transport
		targets = append(targets, r.target(i, rq.DevAddr+uint64(rq.BufOffset)))
	}
	return targets, nil
}

// target is where a request for device address addr inside r goes.
func (r *region) target(i int, addr uint64) target {
	t := target{i: i, devAddr: addr, staged: r.transport == Staged, reg: r}
	if !t.staged {
		t.host = r.host + uintptr(addr-r.addr)
	}
	return t
}

// order sorts the targets by file and offset, so that requests which
// follow on in the file meet (KV-cache blocks read head by head); requests
// at the same place keep their order. Planning a batch of 409 extents runs
// on every KV-cache ioctl: the key is compared directly, without
// reflection, and a sorted batch (a file read front to back) is left as is.
func order(reqs []Request, targets []target, m *planMemory) {
	keys := sized(m.keys, len(targets))
	m.keys = keys
	for k, t := range targets {
		rq := &reqs[t.i]
		// A descriptor is a C int, and a batch is MaxBatchPieces requests
		// at most: both fit 32 bits.
		keys[k] = orderKey{off: rq.FileOffset, fd: int32(rq.Fd), k: int32(k)}
	}
	if slices.IsSortedFunc(keys, orderKey.compare) {
		return
	}
	slices.SortFunc(keys, orderKey.compare)
	sorted := sized(m.sorted, len(targets))
	m.sorted = sorted
	for j, key := range keys {
		sorted[j] = targets[key.k]
	}
	copy(targets, sorted)
}

// orderKey is a target's place in the order, packed: 16 bytes where a
// target is 56, so that sorting a KV batch's 409 scattered blocks moves
// and compares a third of the bytes (the sort was a third of a batch's
// planning). k is the target's index, which follows its request's.
type orderKey struct {
	off int64
	fd  int32
	k   int32
}

// compare orders by file, offset and index. (cmp.Or of three
// cmp.Compare calls computes all three every time.)
func (a orderKey) compare(b orderKey) int {
	switch {
	case a.fd != b.fd:
		return int(a.fd) - int(b.fd)
	case a.off < b.off:
		return -1
	case a.off > b.off:
		return 1
	}
	return int(a.k) - int(b.k)
}

// limit is the largest engine transfer for a transport.
func (l *Lib) limit(staged bool) int64 {
	switch {
	case staged:
		return l.cfg.BounceSize
	case l.cfg.SplitSize > 0:
		return min(l.cfg.SplitSize, ChunkSize)
	}
	return ChunkSize
}

// piece is one contiguous part of a request: a plain request is one, a
// strided request Count of them.
type piece struct {
	fd      int
	off     int64 // file offset
	len     int64
	host    uintptr // where it lands (not staged)
	devAddr uint64  // device address (staged)
	dev     int
	staged  bool
	reg     *region
}

// pieceOf is piece j of the request of target t.
func (p *plan) pieceOf(t target, j int64) piece {
	rq := &p.reqs[t.i]
	at := j * rq.BufStride
	pc := piece{fd: rq.Fd, off: rq.FileOffset + j*rq.FileStride, len: rq.Len, dev: rq.Device, staged: t.staged, reg: t.reg}
	if t.staged {
		pc.devAddr = t.devAddr + uint64(at)
	} else {
		pc.host = t.host + uintptr(at)
	}
	return pc
}

// cut makes the xfers: a piece that follows on from the previous xfer in
// both the file and the buffer joins it, others are split at the limit. A
// staged xfer never crosses a file offset that is a multiple of the bounce
// size, so its O_DIRECT read, widened to the file's alignment, still fits
// one bounce buffer. A request's segments are its pieces' parts, in order.
func (l *Lib) cut(p *plan, targets []target) {
	// One backing array for every request's segments and one for the
	// xfers: most pieces (or runs) make one of each.
	run := l.runBytes(p, targets)
	ks := sized(p.mem.ks, len(targets)) // pieces a run, 1: no runs
	var n int64
	for i, t := range targets {
		rq := &p.reqs[t.i]
		if ks[i] = l.runPieces(p, rq, t, run); ks[i] > 1 {
			n += (rq.Count + ks[i] - 1) / ks[i]
		} else {
			n += l.xfersOf(rq, t.staged)
		}
	}
	segs := reserved(p.mem.segs, int(n))
	p.xfers = reserved(p.mem.xfers, int(n))
	for i, t := range targets {
		start := len(segs)
		rq := &p.reqs[t.i]
		if ks[i] > 1 {
			segs = cutRuns(p, t, ks[i], segs)
		} else {
			for j := int64(0); j < rq.pieces(); j++ {
				segs = l.cutPiece(p, p.pieceOf(t, j), segs)
			}
		}
		p.segs[t.i] = segs[start:len(segs):len(segs)]
	}
	p.mem.ks, p.mem.segs = ks, segs
}

// xfersOf is how many xfers the pieces of rq (not read in runs) make:
// each piece cut at the limit, and a staged one also where it crosses a
// multiple of it (cutPiece), counted exactly for a lone piece (a KV
// block); a strided piece that crosses one grows the plan's arrays, which
// are kept at that size for the next plans (planmem.go).
func (l *Lib) xfersOf(rq *Request, staged bool) int64 {
	lim := l.limit(staged)
	if staged && rq.pieces() == 1 && rq.Len > 0 {
		return (rq.FileOffset+rq.Len-1)/lim - rq.FileOffset/lim + 1
	}
	return rq.pieces() * max((rq.Len+lim-1)/lim, 1)
}

// runBytes is the size of the runs a plan's strided requests are cut into:
// an even share of the plan for each worker, so that one tensor's column
// slice still spreads over them, from 64 KiB up to one slot.
func (l *Lib) runBytes(p *plan, targets []target) int64 {
	var total int64
	for _, t := range targets {
		total += p.reqs[t.i].Bytes()
	}
	return min(max(total/int64(max(l.pool.Workers(), 1)), 64<<10), l.cfg.BounceSize)
}

// runPieces is how many pieces of request rq each run holds (up to run
// bytes), or 1 where rq is not read in runs: only a strided read through
// the staged transport whose pieces are apart in the file, one after the
// other in the buffer, and small enough to gather (the pieces of anything
// else are xfers of their own, joined where they follow on).
func (l *Lib) runPieces(p *plan, rq *Request, t target, run int64) int64 {
	if p.write || !t.staged || rq.Count <= 1 || rq.FileStride <= rq.Len || rq.BufStride != rq.Len ||
		rq.Len > l.cfg.GatherMax || rq.Len == 0 {
		return 1
	}
	return max(min(run, l.cfg.BounceSize)/rq.Len, 1)
}

// cutRuns appends the runs of k pieces of the request of target t, and
// their segments.
func cutRuns(p *plan, t target, k int64, segs []segment) []segment {
	rq := &p.reqs[t.i]
	for j := int64(0); j < rq.Count; j += k {
		n := min(k, rq.Count-j)
		x := xfer{fd: rq.Fd, off: rq.FileOffset + j*rq.FileStride, len: n * rq.Len, count: n, stride: rq.FileStride,
			dev: rq.Device, devAddr: t.devAddr + uint64(j*rq.BufStride), staged: true, result: notRun, reg: t.reg}
		segs = append(segs, segment{x: len(p.xfers), n: x.len})
		p.xfers = append(p.xfers, x)
	}
	p.staged = true
	return segs
}

// cutPiece appends pc's xfers (or joins it to the last one) and its
// segments.
func (l *Lib) cutPiece(p *plan, pc piece, segs []segment) []segment {
	if seg, ok := l.join(p, pc); ok {
		return append(segs, seg)
	}
	lim := l.limit(pc.staged)
	for done := int64(0); done < pc.len; {
		n := min(pc.len-done, lim)
		if pc.staged {
			n = min(n, lim-(pc.off+done)%lim)
		}
		x := xfer{fd: pc.fd, off: pc.off + done, len: n, staged: pc.staged, result: notRun, reg: pc.reg}
		if pc.staged {
			x.dev, x.devAddr = pc.dev, pc.devAddr+uint64(done)
			p.staged = true
		} else {
			x.host = pc.host + uintptr(done)
			p.hasHost = true
		}
		segs = append(segs, segment{x: len(p.xfers), at: 0, n: n})
		p.xfers = append(p.xfers, x)
		done += n
	}
	return segs
}

// join appends pc to the last xfer when it follows on from it in the file
// and the buffer and the sum fits the limit, and returns pc's segment.
func (l *Lib) join(p *plan, pc piece) (segment, bool) {
	n := len(p.xfers)
	if n == 0 || pc.len == 0 {
		return segment{}, false
	}
	x := &p.xfers[n-1]
	lim := l.limit(pc.staged)
	fits := x.len+pc.len <= lim && (!pc.staged || x.off/lim == (pc.off+pc.len-1)/lim)
	follows := fits && x.fd == pc.fd && x.staged == pc.staged && x.off+x.len == pc.off &&
		((pc.staged && x.dev == pc.dev && x.reg == pc.reg && x.devAddr+uint64(x.len) == pc.devAddr) ||
			(!pc.staged && x.host+uintptr(x.len) == pc.host))
	if !follows {
		return segment{}, false
	}
	seg := segment{x: n - 1, at: x.len, n: pc.len}
	x.len += pc.len
	l.stats.coalesced.Add(1)
	return seg, true
}

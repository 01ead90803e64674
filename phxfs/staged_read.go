package phxfs

import (
	"context"
	"os"
	"runtime/trace"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/defaults"
	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/ioengine"
)

// bg is the context of the trace regions that time the staged pipeline's
// steps (go tool trace; free when no trace runs).
var bg = context.Background()

// EnvStagedShare names the variable that chooses how a staged batch is
// split among workers: auto (or unset: as if it ran alone, a worker's
// least share by the size of its pieces, blockShare), spread (as if alone,
// Config.StagedShare a worker whatever the pieces), slot (as if alone, a
// bounce buffer's worth a worker: fewer driver calls a small batch) or
// load (weighing the plans beside it: Config.StagedByLoad).
const EnvStagedShare = "PHX_STAGED_SHARE"

// stagedShareFrom applies the environment's rule to what cfg leaves
// unset: slot sets a zero StagedShare to the bounce size, load sets
// StagedByLoad; it says whether a worker's share follows the pieces' size
// (auto, with no StagedShare given). Called after BounceSize has its
// default.
func stagedShareFrom(cfg *Config) (bySize bool, err error) {
	switch v := os.Getenv(EnvStagedShare); v {
	case "", "auto":
		return cfg.StagedShare == 0, nil
	case "spread":
	case "slot":
		defaults.Set(&cfg.StagedShare, cfg.BounceSize)
	case "load":
		cfg.StagedByLoad = true
	default:
		return false, errs.New(unix.EINVAL, "phxfs: %s=%q: want auto, spread, slot or load", EnvStagedShare, v)
	}
	return false, nil
}

// blockShareMin and blockShareMax bound the average piece of a batch that
// auto gives a bounce buffer's worth a worker: KV-cache blocks of 64 KiB
// to 1 MiB. Run 55 (docs/gpu-notes.md), through the mount on an H100, the
// worse of 1 and 4 client threads with 4 batches in flight each: 64 KiB
// blocks 37.1 GB/s in slot-sized shares against 30.0 in 1 MiB ones (half
// the driver calls and fence waits a batch); 16 KiB blocks 11.5 against
// 14.9 (one client's four batches on two workers each left half the pool
// idle), so smaller pieces keep the 1 MiB share. Tensors (pieces of MiBs)
// keep it too: their plans are large enough to fill the pool either way.
const (
	blockShareMin = 64 << 10
	blockShareMax = 1 << 20
)

// blockShare is a worker's least share of a staged batch of these bytes
// and pieces: a bounce buffer's worth for KV-sized blocks where the share
// follows the pieces' size (auto), else Config.StagedShare.
func (l *Lib) blockShare(bytes, pieces int64) int64 {
	share := l.cfg.StagedShare
	if l.shareBySize && pieces > 0 {
		if avg := bytes / pieces; avg >= blockShareMin && avg < blockShareMax {
			share = max(share, l.cfg.BounceSize)
		}
	}
	return share
}

// SetStagedByLoad sets whether staged batches are split by load
// (Config.StagedByLoad) and returns the previous setting; batches already
// running keep theirs.
func (l *Lib) SetStagedByLoad(on bool) bool { return l.byLoad.Swap(on) }

// StagedByLoad reports whether staged batches are split by load.
func (l *Lib) StagedByLoad() bool { return l.byLoad.Load() }

// minStagedOps is the least number of pieces a worker is given per MiB of
// Config.StagedShare (64 at the default share, 256 at a slot's 4 MiB): a read
// costs a few microseconds whatever its size, so many small ones (a column
// slice is one per row) spread over workers by count as well as by bytes.
const minStagedOps = 64

// stagedWorkers is how many workers a staged plan of these xfers uses,
// plans being how many staged plans of its device run now (this one
// included).
//
// A plan spreads: each worker gets at least Config.StagedShare bytes or
// the share's pieces (sharePieces), so that one batch's reads run in parallel. Split
// by load (Config.StagedByLoad), a plan beside others (a KV-cache client
// keeps several BATCH ioctls in flight; the mount serves several threads)
// takes no more than its fair part of the pool, workers/plans, but never
// fewer workers than its bytes need slots: every worker is busy anyway
// there, and what a worker costs a plan is fixed per share, a job handed
// to it, then a scatter and a fence per slot it fills (on a GPU three to
// four driver calls, which queue on the context's lock when sixteen
// workers reach them at once; docs/gpu-notes.md run 10). Each share then
// fills a slot, one scatter and one fence, as kv_blocks.cu moves 4 MiB
// (256 blocks of 16 KiB) per staging buffer: a 409-block batch of 16 KiB
// goes to 7 workers alone, 4 beside three others and 2 (205 blocks a
// slot) among sixteen; of 64 KiB, to 16, 7 and 7. Not the default: on
// the emulated device (2 CPUs) it cost 5-30 % against spreading, the
// larger slots no longer fitting the CPU's cache between the gather and
// the emulated copy (docs/perf-notes.md §8); a GPU run must say
// (scripts/gpu-probes/kvprof.sh).
func (l *Lib) stagedWorkers(xs []xfer, plans int) int {
	var bytes, pieces int64
	for i := range xs {
		bytes += xs[i].len
		pieces += xs[i].pieces()
	}
	if !l.byLoad.Load() {
		plans = 1
	}
	share, slot := l.blockShare(bytes, pieces), l.cfg.BounceSize
	workers := l.pool.Workers()
	ops := sharePieces(share)
	spread := max(int((bytes+share-1)/share), int((pieces+ops-1)/ops))
	fair := (workers + max(plans, 1) - 1) / max(plans, 1)
	full := int((bytes + slot - 1) / slot)
	n := max(min(spread, fair), full)
	return max(min(n, len(xs), workers), 1)
}

// sharePieces is the least number of pieces a worker is given with a
// share of this many bytes: minStagedOps a MiB, never fewer than
// minStagedOps. Scaled with the share so that a larger share means fewer
// workers for small blocks as it does for large ones: a 16 KiB batch of
// 409 blocks is 7 shares by its pieces at 1 MiB and 2 at 4 MiB.
func sharePieces(share int64) int64 {
	return max(minStagedOps*share>>20, minStagedOps)
}

// runStriped runs a plan that has staged transfers on its share of the
// workers (placement.go). Reads are handed out in order, a chunk at a time
// (claimer), so that a worker which the placement has since given to
// another device can leave the plan to its other workers (the last one
// stays), and a worker done with its own read can take chunks of this
// one (steal.go); writes are
// striped round-robin. Host transfers of the plan run through the
// worker's engine as they come.
func (l *Lib) runStriped(p *plan) {
	dev := stagedDevice(p.xfers)
	rank, k, plans := l.loading.enter(dev)
	defer l.loading.leave(dev)
	cr := l.place(rank, k, l.stagedWorkers(p.xfers, plans))
	mode := l.ODirectPolicy()
	bf := newBatchFiles(p, &l.maps)
	defer bf.close()
	c := newClaimer(p.xfers, cr.n, l.cfg.BounceSize)
	var enough <-chan struct{} // writes are striped: every worker has its own
	var o *offer
	if !p.write {
		enough = c.done
		o = &offer{p: p, c: c, bf: bf, mode: mode, dev: dev}
		// Off the list before bf closes (defers run last in, first out).
		l.offers.add(o)
		defer l.offers.remove(o)
	}
	err := l.pool.EachInUntil(enough, cr.base, cr.size, cr.start, cr.n, func(w int, eng ioengine.Engine) {
		if !p.write {
			// A worker that starts after the plan is done (its chunks taken
			// by the others) claims nothing and touches nothing of it.
			l.readShare(w, eng, o, func() bool { return l.leaves(c, dev, w, cr) }, false)
			l.steal(w, eng, dev) // then the other reads' chunks (steal.go)
			return
		}
		var mine []int
		for i := cr.index(w); i < len(p.xfers); i += cr.n {
			mine = append(mine, i)
		}
		l.stagedWrite(w, eng, p.xfers, l.hostFirst(eng, p, mine))
	})
	if !p.write {
		// Every job of the crew may have run while a worker outside it
		// still reads a chunk it stole (or the pool refused the jobs).
		c.drain()
	}
	if err != nil {
		for i := range p.xfers {
			p.xfers[i].result = -int64(errs.Errno(err))
		}
	}
}

// hostFirst runs the host transfers of idx (a plan may mix host buffers
// with device memory) and returns the staged ones.
func (l *Lib) hostFirst(eng ioengine.Engine, p *plan, idx []int) []int {
	if !p.hasHost {
		return idx // all staged: nothing to run here, nothing to copy
	}
	var host []ioengine.Op
	var hostIdx, staged []int
	for _, i := range idx {
		x := &p.xfers[i]
		if x.staged {
			staged = append(staged, i)
			continue
		}
		host = append(host, ioengine.Op{Fd: x.fd, Write: p.write, Addr: x.host, Len: x.len, Off: x.off})
		hostIdx = append(hostIdx, i)
	}
	l.runOps(eng, p.xfers, host, hostIdx)
	if len(staged) == 0 && len(idx) > 0 {
		return []int{} // not nil: a chunk of host transfers only is no end
	}
	return staged
}

// runOps runs ops, whose xfers are idx, in one engine run.
func (l *Lib) runOps(eng ioengine.Engine, xfers []xfer, ops []ioengine.Op, idx []int) {
	if len(ops) == 0 {
		return
	}
	if err := eng.Run(ops); err != nil {
		fail(xfers, idx, err)
		return
	}
	for k, i := range idx {
		xfers[i].result = ops[k].Result
	}
}

// stagedRead reads, through worker w's slots, the xfers that src hands
// out, a chunk at a time (nil: no more), keeping the slots' copies in
// flight across chunks.
func (l *Lib) stagedRead(w int, eng ioengine.Engine, xfers []xfer, src func() []int, bf batchFiles, mode ODirect) {
	slots := l.staged.slots[w]
	r := stagedReader{l: l, w: w, eng: eng, xfers: xfers, bf: bf, mode: mode, slots: slots}
	sc := &l.staged.scratch[w] // a worker runs one plan at a time
	r.readScratch = *sc
	if len(r.sf) != len(slots) {
		r.sf = make(slotFences, len(slots))
	}
	defer func() { *sc = r.readScratch }()
	for idx := src(); idx != nil; idx = src() {
		for k := 0; k < len(idx); {
			k = r.group(idx, k)
		}
	}
	trace.WithRegion(bg, "phxfs.await", func() {
		for slot := range slots {
			r.sf.await(slot, slots[slot], xfers)
		}
	})
}

// stagedReader is one worker's staged read of its share of a plan.
type stagedReader struct {
	l     *Lib
	w     int
	eng   ioengine.Engine
	xfers []xfer
	bf    batchFiles
	mode  ODirect
	slots [][]byte
	next  int // the slot to fill next

	gathers int // reads of the group gathered from a mapping
	readScratch
}

// readScratch is a worker's reusable slices: a staged read's groups fill
// them anew, and the next plan on the worker starts from their arrays. A
// small batch is a few slots' worth per worker, so what a plan allocates
// per worker (the slots' flights and their piece lists among it) is most
// of what it allocates at all.
type readScratch struct {
	// sf is the worker's slots in flight; every slot is waited for when
	// a read ends, so the next plan finds them idle.
	sf      slotFences
	reads   []slotRead // this group's reads, slot by slot
	ops     []ioengine.Op
	filled  []int             // this group's slots, in order
	pieces  []connector.Piece // a slot's scatter (start copies what it keeps)
	landing []int
}

// slotRead is one read of a group: the xfer, and where and how it is
// read into its slot: an engine operation (op; O_DIRECT or buffered) or a
// gather from the file's mapping.
type slotRead struct {
	i      int // the xfer
	slot   int
	at     int64      // where its bytes go in the slot (O_DIRECT: the span's start)
	bf     *batchFile // O_DIRECT or gather: the file; O_DIRECT: x's bytes begin at head
	head   int64
	span   int64
	direct bool
	gather bool
	op     int   // the first engine operation (not gathered)
	ops    int   // and how many: one a piece
	res    int64 // a gather's result
}

// group fills up to half the slots (at least one) with the next xfers of
// one device, reads them all in one engine run, and queues each slot's
// scatter. It returns where the next group starts.
func (r *stagedReader) group(idx []int, k int) int {
	dev := r.xfers[idx[k]].dev
	ss, err := r.l.stagedStreams(dev)
	if err != nil {
		fail(r.xfers, idx[k:k+1], err)
		return k + 1
	}
	r.reads, r.ops, r.filled, r.gathers = r.reads[:0], r.ops[:0], r.filled[:0], 0
	for g := max(len(r.slots)/2, 1); g > 0 && k < len(idx) && r.xfers[idx[k]].dev == dev; g-- {
		slot := r.next
		r.next = (r.next + 1) % len(r.slots)
		trace.WithRegion(bg, "phxfs.await", func() { r.sf.await(slot, r.slots[slot], r.xfers) })
		k = r.pack(slot, idx, k, dev)
		r.filled = append(r.filled, slot)
	}
	var runErr error
	trace.WithRegion(bg, "phxfs.gather", r.gatherGroup)
	if len(r.ops) > 0 {
		trace.WithRegion(bg, "phxfs.read", func() { runErr = r.eng.Run(r.ops) })
	}
	n := 0
	for _, slot := range r.filled {
		m := n
		for m < len(r.reads) && r.reads[m].slot == slot {
			m++
		}
		trace.WithRegion(bg, "phxfs.scatter", func() { r.scatter(ss[r.w], slot, n, m, runErr) })
		n = m
	}
	return k
}

// pack lays out the next xfers of dev in slot: each O_DIRECT read's span
// at a page-aligned place, each buffered read at a packAlign-ed one, until
// the slot is full. It returns the first xfer left out.
func (r *stagedReader) pack(slot int, idx []int, k, dev int) int {
	buf := r.slots[slot]
	size := int64(len(buf))
	var pos int64
	for first := true; k < len(idx) && r.xfers[idx[k]].dev == dev; first = false {
		x := &r.xfers[idx[k]]
		rd := slotRead{i: idx[k], slot: slot}
		// Whether x is read around the page cache is decided for a whole
		// slot: a cold range that does not fit what is left of this slot
		// goes to the next one, never through the page cache.
		// Whether the page cache holds x is asked once, and only where
		// the answer picks the path.
		res, known := false, false
		if r.mode == ODirectAuto || x.pieceLen() <= r.l.cfg.GatherMax {
			res, known = r.bf.resident(x)
		}
		if t, start, head, span, ok := r.bf.directSpan(x, r.mode, res || !known, addrOf(buf), size); ok {
			rd.at = alignUp(pos, 4096)
			if rd.at+span > size && !first {
				return k
			}
			rd.bf, rd.head, rd.span, rd.direct, rd.op, rd.ops = t, head, span, true, len(r.ops), 1
			r.ops = append(r.ops, ioengine.Op{Fd: t.fd, Addr: addrOf(buf[rd.at:]), Len: span, Off: start})
		} else {
			rd.at = alignUp(pos, packAlign)
			if rd.at+x.len > size && !first {
				return k
			}
			if t := r.bf.gatherable(x, res && known, r.l.cfg.GatherMax); t != nil {
				rd.bf, rd.gather = t, true
				r.gathers++
			} else {
				rd.op, rd.ops = len(r.ops), int(x.pieces())
				r.ops = appendPieceOps(r.ops, x, buf[rd.at:])
			}
		}
		pos = rd.at + max(rd.span, x.len)
		r.reads = append(r.reads, rd)
		k++
	}
	return k
}

// scatter takes the results of a slot's reads, reads[n:m] (or the run's
// error), and queues the copy of every byte read to the device, ended by
// the slot's fence.
func (r *stagedReader) scatter(s connector.Stream, slot, n, m int, runErr error) {
	pieces, landing := r.pieces[:0], r.landing[:0]
	defer func() { r.pieces, r.landing = pieces, landing }()
	for j := n; j < m; j++ {
		rd := &r.reads[j]
		var off, got int64
		if rd.gather {
			off, got = rd.at, rd.res
			r.xfers[rd.i].result = got
		} else {
			off, got = r.land(rd, piecesResult(r.ops[rd.op:rd.op+rd.ops]), runErr)
		}
		if got > 0 {
			pieces = append(pieces, connector.Piece{Off: off, Dev: r.xfers[rd.i].devAddr, Len: got})
			landing = append(landing, rd.i)
		}
	}
	if len(pieces) > 0 {
		r.sf.start(slot, s, r.slots[slot], pieces, landing, false, r.xfers)
	}
}

// land takes a read's result (got bytes, or the run's error), redoes a
// failed or short O_DIRECT read through the page cache, sets the xfer's
// result and returns where its bytes are in the slot and how many.
func (r *stagedReader) land(rd *slotRead, got int64, runErr error) (int64, int64) {
	l, x := r.l, &r.xfers[rd.i]
	off := rd.at
	switch {
	case runErr != nil:
		got = -int64(errs.Errno(runErr))
	case rd.direct && got == rd.span:
		l.stagedStats.directReads.Add(1)
		l.stagedStats.directBytes.Add(x.len)
		off, got = rd.at+rd.head, x.len
	case rd.direct:
		// Failed or short (the file shrank, the file system changed its
		// mind): redo it buffered, and stop trying on an error.
		if got < 0 {
			rd.bf.broken.Store(true)
		}
		l.stagedStats.fallback(x.off, rd.span, got)
		got = l.readBuffered(r.eng, x, r.slots[rd.slot][rd.at:])
	case got > 0:
		l.stagedStats.bufferedReads.Add(1)
		l.stagedStats.bufferedBytes.Add(got)
	}
	x.result = got
	return off, got
}

// readBuffered reads x through the page cache into buf.
func (l *Lib) readBuffered(eng ioengine.Engine, x *xfer, buf []byte) int64 {
	ops := appendPieceOps(nil, x, buf)
	if err := eng.Run(ops); err != nil {
		return -int64(errs.Errno(err))
	}
	got := piecesResult(ops)
	if got > 0 {
		l.stagedStats.bufferedReads.Add(1)
		l.stagedStats.bufferedBytes.Add(got)
	}
	return got
}

// appendPieceOps appends an engine read of each piece of x, landing one
// after the other in buf.
func appendPieceOps(ops []ioengine.Op, x *xfer, buf []byte) []ioengine.Op {
	n := x.pieceLen()
	for j := range x.pieces() {
		ops = append(ops, ioengine.Op{Fd: x.fd, Addr: addrOf(buf[j*n:]), Len: n, Off: x.pieceOff(j)})
	}
	return ops
}

// piecesResult is the result of an xfer read piece by piece (ops, in
// order), as one read of it would say: the bytes up to the first short
// piece (end of file), or the errno of a first piece that failed.
func piecesResult(ops []ioengine.Op) int64 {
	var got int64
	for _, op := range ops {
		if op.Result < 0 {
			if got == 0 {
				return op.Result
			}
			break
		}
		got += op.Result
		if op.Result < op.Len {
			break
		}
	}
	return got
}

// addrOf is where a slot's (or any buffer's) bytes start, for the engine.
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

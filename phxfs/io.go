package phxfs

import (
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/ioengine"
)

// Request is one transfer between a file and a buffer.
type Request struct {
	Fd int
	// Device >= 0: the buffer is device memory at DevAddr, inside a
	// registration on that device. Device < 0: the buffer is plain host
	// memory at HostAddr, which the caller keeps alive.
	Device     int
	DevAddr    uint64
	HostAddr   uintptr
	BufOffset  int64
	Len        int64
	FileOffset int64
	// Count > 1 makes the request strided: Count pieces of Len bytes, piece
	// j at FileOffset + j*FileStride in the file and BufOffset +
	// j*BufStride in the buffer (strides no shorter than Len). 0 and 1 are
	// one piece.
	Count      int64
	FileStride int64
	BufStride  int64
	// Result is filled in: bytes transferred or a negative errno. A strided
	// request's result counts its pieces' bytes in order, up to the first
	// one that fell short.
	Result int64
}

// pieces is the number of pieces the request moves.
func (rq *Request) pieces() int64 { return max(rq.Count, 1) }

// Bytes is what the request moves when nothing falls short.
func (rq *Request) Bytes() int64 { return rq.Len * rq.pieces() }

// span is how many bytes of the buffer, from BufOffset, the request spans.
func (rq *Request) span() int64 { return (rq.pieces()-1)*rq.BufStride + rq.Len }

// badShape reports a strided request whose numbers do not hold together:
// a negative count or stride, empty pieces, pieces that overlap, or an
// end past 2^63.
func (rq *Request) badShape() bool {
	if rq.Count < 0 || rq.pieces() == 1 {
		return rq.Count < 0
	}
	n := rq.pieces() - 1
	return rq.Len == 0 || rq.FileStride < rq.Len || rq.BufStride < rq.Len ||
		rq.FileStride > (maxOffset-rq.FileOffset-rq.Len)/n || rq.BufStride > (maxOffset-rq.BufOffset-rq.Len)/n
}

// maxOffset is the largest file or buffer offset a request may reach.
const maxOffset = 1<<63 - 1

// MaxBatchPieces is the most pieces one batch may move: its requests'
// pieces (Count, or 1), summed; a batch past it fails as a whole with
// E2BIG before anything is planned. A plan keeps about 110 bytes a piece
// (an engine transfer and a segment, where pieces do not join), so a
// batch costs the library at most about 110 MiB however its numbers were
// made up; the daemon's ioctls carry at most client.MaxPieces.
const MaxBatchPieces = 1 << 20

// batchPieces is the pieces of reqs, summed; past MaxBatchPieces it stops
// at MaxBatchPieces + 1.
func batchPieces(reqs []Request) int64 {
	var n int64
	for i := range reqs {
		k := max(reqs[i].Count, 1)
		if k > MaxBatchPieces-n {
			return MaxBatchPieces + 1
		}
		n += k
	}
	return n
}

// Read transfers up to n bytes at fileOff of fd into buf+bufOff. dev >= 0
// names a registration holding buf on that device; dev < 0 makes buf a host
// address. The registration is held for the transfer, so a concurrent
// DeregMem waits for it. Transfers are cut at ChunkSize.
func (l *Lib) Read(fd, dev int, buf uint64, bufOff, n, fileOff int64) (int64, error) {
	return l.single(false, fd, dev, buf, bufOff, n, fileOff)
}

// Write transfers n bytes from buf+bufOff to fd at fileOff; see Read.
func (l *Lib) Write(fd, dev int, buf uint64, bufOff, n, fileOff int64) (int64, error) {
	return l.single(true, fd, dev, buf, bufOff, n, fileOff)
}

func (l *Lib) single(write bool, fd, dev int, buf uint64, bufOff, n, fileOff int64) (int64, error) {
	reqs := []Request{{Fd: fd, Device: dev, BufOffset: bufOff, Len: n, FileOffset: fileOff}}
	if dev < 0 {
		reqs[0].HostAddr = uintptr(buf)
	} else {
		reqs[0].DevAddr = buf
	}
	p, err := l.prepare(write, reqs)
	if err != nil {
		return 0, err
	}
	l.execute(p)
	verb := p.verb()
	p.recycle()
	if r := reqs[0].Result; r < 0 {
		return 0, errs.New(unix.Errno(-r), "phxfs: %s %d bytes at %d", verb, n, fileOff)
	}
	return reqs[0].Result, nil
}

// execute runs a prepared plan on the worker pool, fills every request's
// Result and releases the plan's holds. A large plan runs in rounds: each
// round queues one job per worker, so other batches (other devices, other
// clients) interleave with it instead of waiting for all of it.
func (l *Lib) execute(p *plan) {
	for lo := 0; lo < len(p.xfers); {
		hi := l.roundEnd(p.xfers, lo)
		round := *p
		round.xfers = p.xfers[lo:hi] // shares the results with p
		if p.staged {
			l.runStriped(&round)
		} else {
			l.runHost(&round)
		}
		lo = hi
	}
	l.finish(p)
}

// roundEnd ends a round at four queue depths' worth of operations per
// worker (each round ends with the rings drained, so a round holds several
// ring-fulls), or Config.RoundBytes per worker.
func (l *Lib) roundEnd(xs []xfer, lo int) int {
	if l.cfg.RoundBytes < 0 {
		return len(xs)
	}
	maxOps := 4 * l.pool.Workers() * l.cfg.QueueDepth
	maxBytes := int64(l.pool.Workers()) * l.cfg.RoundBytes
	var bytes int64
	hi := lo
	for hi < len(xs) && hi-lo < maxOps && (hi == lo || bytes+xs[hi].len <= maxBytes) {
		bytes += xs[hi].len
		hi++
	}
	return hi
}

// runHost runs transfers that land in host-addressable memory.
func (l *Lib) runHost(p *plan) {
	ops := make([]ioengine.Op, len(p.xfers))
	for i, x := range p.xfers {
		ops[i] = ioengine.Op{Fd: x.fd, Write: p.write, Addr: x.host, Len: x.len, Off: x.off}
	}
	if err := l.pool.Run(ops); err != nil {
		for i := range p.xfers {
			p.xfers[i].result = -int64(errs.Errno(err))
		}
		return
	}
	for i := range ops {
		p.xfers[i].result = ops[i].Result
	}
}

// finish turns xfer results into request results and drops the holds.
func (l *Lib) finish(p *plan) {
	var moved, failed int64
	var byTransport transportBytes
	for i := range p.reqs {
		rq := &p.reqs[i]
		if rq.Result < 0 {
			failed++
			continue
		}
		total := p.requestResult(i)
		rq.Result = total
		if total != rq.Bytes() {
			failed++
		}
		if total > 0 {
			moved += total
			byTransport.add(p.trans[i], total)
		}
	}
	l.xportStats.add(p.write, &byTransport)
	if p.write {
		l.stats.bytesWritten.Add(moved)
	} else {
		l.stats.bytesRead.Add(moved)
	}
	l.stats.failed.Add(failed)

	l.mu.Lock()
	for _, r := range p.held {
		l.release(r)
	}
	l.mu.Unlock()
	clear(p.held)
	p.held = p.held[:0]
}

// requestResult is request i's result from its xfers': the bytes up to
// the first short segment (end of file), or the errno of a segment that
// failed before any byte moved, as pread(2) reports. A segment that never
// ran fails the whole request with EIO: its bytes are missing, not past
// the end of the file.
func (p *plan) requestResult(i int) int64 {
	for _, s := range p.segs[i] {
		if p.xfers[s.x].result == notRun {
			return -int64(unix.EIO)
		}
	}
	var total int64
	for _, s := range p.segs[i] {
		r := p.xfers[s.x].result
		if r < 0 {
			if total == 0 {
				total = r
			}
			break
		}
		got := min(max(r-s.at, 0), s.n)
		total += got
		if got < s.n {
			break
		}
	}
	return total
}

// failures counts the requests that did not transfer exactly their bytes.
func failures(reqs []Request) int {
	n := 0
	for i := range reqs {
		if reqs[i].Result != reqs[i].Bytes() {
			n++
		}
	}
	return n
}

package phxfs

import (
	"maps"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
)

// The staged transport reads into pinned host memory and lets the
// connector copy the bytes to the device. Each pool worker owns
// Config.StagedBuffers slots (bounce buffers of BounceSize bytes) and, per
// device, one copy stream. A slot holds one large transfer or many small
// ones packed together: the worker reads them in one engine run, then
// moves the whole slot with one scatter (one copy and a kernel, or one
// batched copy: the connector's choice) and a fence. While one slot's
// copies run, the worker fills the next; a slot is refilled only after its
// fence.
//
// Everything the pipeline needs is made once per library, before the first
// transfer: registering staged memory calls warm, which allocates every
// worker's slots as one pinned allocation and creates every worker's
// stream on the device. Pinning and stream creation take the driver's
// locks; done lazily inside a load they stalled every other worker's
// copies.

// stagedState is the library's staged-transport resources.
type stagedState struct {
	mu      sync.Mutex
	host    connector.HostMemory                       // every worker's slots, one pinned allocation
	slots   [][][]byte                                 // [worker][slot]
	scratch []readScratch                              // [worker]: a staged read's slices, kept between plans
	claims  [][]int                                    // [worker]: the array a read's claims reuse
	streams atomic.Pointer[map[int][]connector.Stream] // device -> stream per worker
	closed  bool
}

// stagedStreams returns the per-worker streams of dev, warming the
// transport on first use.
func (l *Lib) stagedStreams(dev int) ([]connector.Stream, error) {
	if m := l.staged.streams.Load(); m != nil {
		if ss := (*m)[dev]; ss != nil {
			return ss, nil
		}
	}
	return l.warm(dev)
}

// Warm makes, ahead of any transfer, what the staged transport needs on
// device dev: every worker's bounce buffers (once per library) and copy
// stream on dev, which also makes the device's context. Registering staged
// memory does it too; a daemon calls Warm when it starts, so that no
// client's first load pays for it.
func (l *Lib) Warm(dev int) error {
	_, err := l.warm(dev)
	return err
}

// Warmed reports whether the staged transport is ready on dev (Warm, or a
// staged registration, made its streams).
func (l *Lib) Warmed(dev int) bool {
	m := l.staged.streams.Load()
	return m != nil && (*m)[dev] != nil
}

// warm allocates the slots (once) and creates one stream per worker on
// dev (once per device).
func (l *Lib) warm(dev int) ([]connector.Stream, error) {
	st := &l.staged
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil, errs.New(unix.EINVAL, "phxfs: library closed")
	}
	if err := l.allocSlots(); err != nil {
		return nil, err
	}
	old := map[int][]connector.Stream{}
	if m := st.streams.Load(); m != nil {
		if ss := (*m)[dev]; ss != nil {
			return ss, nil
		}
		old = *m
	}
	ss := make([]connector.Stream, l.pool.Workers())
	for i := range ss {
		s, err := l.conn.NewStream(dev)
		if err != nil {
			for _, o := range ss[:i] {
				o.Close()
			}
			return nil, errs.Wrapf(err, "phxfs: create copy stream on device %d", dev)
		}
		ss[i] = s
	}
	m := maps.Clone(old)
	m[dev] = ss
	st.streams.Store(&m)
	return ss, nil
}

// allocSlots makes every worker's slots from one pinned allocation;
// caller holds staged.mu.
func (l *Lib) allocSlots() error {
	st := &l.staged
	if st.host != nil {
		return nil
	}
	workers, per, size := l.pool.Workers(), l.cfg.StagedBuffers, l.cfg.BounceSize
	h, err := l.conn.AllocHost(int64(workers*per) * size)
	if err != nil {
		return errs.Wrapf(err, "phxfs: allocate %d bounce buffers of %d bytes", workers*per, size)
	}
	b := h.Bytes()
	st.slots = make([][][]byte, workers)
	st.scratch = make([]readScratch, workers)
	st.claims = make([][]int, workers)
	for w := range st.slots {
		st.slots[w] = make([][]byte, per)
		for i := range per {
			at := int64(w*per+i) * size
			st.slots[w][i] = b[at : at+size : at+size]
		}
	}
	st.host = h
	return nil
}

// closeStaged frees the streams and slots; the pool is idle.
func (l *Lib) closeStaged() error {
	st := &l.staged
	st.mu.Lock()
	defer st.mu.Unlock()
	st.closed = true
	var first error
	if m := st.streams.Swap(nil); m != nil {
		for _, ss := range *m {
			for _, s := range ss {
				if err := s.Close(); err != nil && first == nil {
					first = err
				}
			}
		}
	}
	if st.host != nil {
		if err := st.host.Close(); err != nil && first == nil {
			first = err
		}
		st.host, st.slots = nil, nil
	}
	return first
}

// slotFlight is one slot's copies in flight: queued on stream, ended by
// fence, carrying pieces, one per xfer.
type slotFlight struct {
	stream connector.Stream
	fence  connector.Fence
	pieces []connector.Piece
	merged []connector.Piece // pieces, those that follow on joined: what was queued
	xfers  []int
	gather bool
}

// slotFences is one worker's slots in flight.
type slotFences []slotFlight

// start queues the move of pieces (one per xfer of idx) between slot's
// buffer buf and the device on s, and the fence that ends it. A move that
// fails to enqueue leaves nothing in flight (connector.Stream): its pieces
// are moved again one by one, so that only the xfers whose own bytes
// cannot move fail.
func (sf slotFences) start(slot int, s connector.Stream, buf []byte, pieces []connector.Piece, idx []int, gather bool, xfers []xfer) {
	fl := &sf[slot]
	fl.merged = mergePieces(fl.merged[:0], pieces, idx, xfers)
	if err := move(s, buf, fl.merged, gather); err != nil {
		oneByOne(s, buf, pieces, idx, gather, xfers, err)
		return
	}
	f, err := s.Fence()
	if err != nil {
		// Queued with no fence: wait for the whole stream, so that nothing
		// of the slot is in flight when it is refilled.
		if err := s.Synchronize(); err != nil {
			fail(xfers, idx, err)
		}
		return
	}
	fl.stream, fl.fence, fl.gather = s, f, gather
	fl.pieces = append(fl.pieces[:0], pieces...)
	fl.xfers = append(fl.xfers[:0], idx...)
}

// await waits for slot's copies. When they failed, it moves the pieces
// again one by one.
func (sf slotFences) await(slot int, buf []byte, xfers []xfer) {
	fl := &sf[slot]
	if fl.fence == nil {
		return
	}
	err := fl.fence.Wait()
	fl.fence = nil
	if err != nil {
		oneByOne(fl.stream, buf, fl.pieces, fl.xfers, fl.gather, xfers, err)
	}
}

// oneByOne moves pieces (one per xfer of idx) again, one at a time, after
// their move together failed with err, and fails each xfer whose own move
// fails: emu and pcibar fault page by page, an enqueue refuses one bad
// piece; after a GPU error every retry fails too. A lone piece is not
// tried again.
func oneByOne(s connector.Stream, buf []byte, pieces []connector.Piece, idx []int, gather bool, xfers []xfer, err error) {
	if len(pieces) == 1 {
		fail(xfers, idx, err)
		return
	}
	for j := range pieces {
		if err := moveAndWait(s, buf, pieces[j:j+1], gather); err != nil {
			fail(xfers, idx[j:j+1], err)
		}
	}
}

// move queues a gather of pieces into buf, or their scatter from it.
func move(s connector.Stream, buf []byte, pieces []connector.Piece, gather bool) error {
	if gather {
		return s.GatherFromDevice(buf, pieces)
	}
	return s.ScatterToDevice(buf, pieces)
}

// moveAndWait moves pieces and waits until they have moved.
func moveAndWait(s connector.Stream, buf []byte, pieces []connector.Piece, gather bool) error {
	if err := move(s, buf, pieces, gather); err != nil {
		return err
	}
	f, err := s.Fence()
	if err != nil {
		return s.Synchronize()
	}
	return f.Wait()
}

// mergePieces appends to out the pieces (piece j moves xfer idx[j]), each
// joined to the one before it when they follow on in both the slot and the
// device and land in the same registration (the rows of a column slice,
// packed one after the other): one copy instead of many. A copy never
// spans two registrations (xfer.reg). The pieces themselves stay apart for
// a retry one by one.
func mergePieces(out, ps []connector.Piece, idx []int, xfers []xfer) []connector.Piece {
	for j, p := range ps {
		if n := len(out); n > 0 && xfers[idx[j]].reg == xfers[idx[j-1]].reg {
			last := &out[n-1]
			if last.Off+last.Len == p.Off && last.Dev+uint64(last.Len) == p.Dev {
				last.Len += p.Len
				continue
			}
		}
		out = append(out, p)
	}
	return out
}

// fail gives every xfer of idx err's errno.
func fail(xfers []xfer, idx []int, err error) {
	for _, i := range idx {
		xfers[i].result = -int64(errs.Errno(err))
	}
}

// packAlign aligns buffered pieces in a slot: a cache line, and the 16
// bytes the copy kernel moves at a time.
const packAlign = 64

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

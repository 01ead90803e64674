package phxfs

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
)

// countingConn counts the scatters and gathers its streams are asked for,
// and the pieces in them: packing shows as far fewer calls than blocks.
type countingConn struct {
	connector.Connector
	calls, pieces, fences atomic.Int64
}

type countingStream struct {
	connector.Stream
	c *countingConn
}

func (c *countingConn) NewStream(dev int) (connector.Stream, error) {
	s, err := c.Connector.NewStream(dev)
	if err != nil {
		return nil, err
	}
	return countingStream{s, c}, nil
}

func (s countingStream) ScatterToDevice(src []byte, ps []connector.Piece) error {
	s.c.calls.Add(1)
	s.c.pieces.Add(int64(len(ps)))
	return s.Stream.ScatterToDevice(src, ps)
}

func (s countingStream) Fence() (connector.Fence, error) {
	s.c.fences.Add(1)
	return s.Stream.Fence()
}

func (s countingStream) GatherFromDevice(dst []byte, ps []connector.Piece) error {
	s.c.calls.Add(1)
	s.c.pieces.Add(int64(len(ps)))
	return s.Stream.GatherFromDevice(dst, ps)
}

// kvBlocks makes n requests for blocks of the KV-cache pattern: random
// file blocks (mostly 4 KiB and 16 KiB, some odd lengths at odd offsets)
// into shuffled slots of a buffer of slotSize-byte slots.
func kvBlocks(rng *rand.Rand, n int, fileSize, slotSize int64) []Request {
	slots := rng.Perm(n)
	reqs := make([]Request, n)
	for i := range reqs {
		ln := []int64{4096, 16384, 1000, 16384}[i%4]
		off := rng.Int64N((fileSize-ln)/4096) * 4096
		if ln == 1000 {
			off += 8 // not page-aligned
		}
		reqs[i] = Request{Device: 0, BufOffset: int64(slots[i]) * slotSize, Len: ln, FileOffset: off}
	}
	return reqs
}

// TestScatteredBlocks reads hundreds of scattered blocks in one batch and
// writes them back elsewhere, with 2 and 4 slots per worker, through the
// page cache and around it; every byte is checked. On the staged transport
// the blocks travel packed: far fewer scatters than blocks.
func TestScatteredBlocks(t *testing.T) {
	const fileSize, slot, n = 8 * mib, 16 << 10, 400
	name := patternFile(t, fileSize)
	for _, s := range setups() {
		for _, buffers := range []int{2, 4} {
			mode := []ODirect{ODirectNever, ODirectAlways}[buffers/4]
			t.Run(fmt.Sprintf("%s/%d-slots", s, buffers), func(t *testing.T) {
				cc := &countingConn{Connector: newConnector(t, s, 1)}
				l, _ := newLib(t, s, 1, func(c *Config) { c.Connector, c.StagedBuffers, c.ODirect = cc, buffers, mode })
				m := alloc(t, cc, 0, n*slot)
				r := register(t, l, m)
				fd := openFile(t, name, unix.O_RDONLY)
				reqs := kvBlocks(rand.New(rand.NewPCG(1, uint64(buffers))), n, fileSize, slot)
				for i := range reqs {
					reqs[i].Fd, reqs[i].DevAddr = fd, r.Addr()
				}
				if failed, err := l.ReadBatch(reqs); failed != 0 || err != nil {
					t.Fatalf("read: %d failed, %v: %s", failed, err, describe(reqs))
				}
				dev := deviceBytes(t, cc, m, 0, n*slot)
				for _, rq := range reqs {
					checkPattern(t, dev[rq.BufOffset:rq.BufOffset+rq.Len], rq.FileOffset)
				}
				if r.Transport() == Staged && cc.calls.Load() > n/10 {
					t.Errorf("%d blocks took %d scatters: not packed", n, cc.calls.Load())
				}
				writeBack(t, l, reqs, name)
			})
		}
	}
}

// writeBack writes the blocks of reqs, in their order, end to end into a
// new file, and checks every block there against the file it came from.
func writeBack(t *testing.T, l *Lib, reqs []Request, name string) {
	t.Helper()
	out := openFile(t, name+".blocks", unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC)
	from := make([]int64, len(reqs))
	var at int64
	for i := range reqs {
		from[i] = reqs[i].FileOffset
		reqs[i].Fd, reqs[i].FileOffset = out, at
		at += reqs[i].Len
	}
	if failed, err := l.WriteBatch(reqs); failed != 0 || err != nil {
		t.Fatalf("write: %d failed, %v: %s", failed, err, describe(reqs))
	}
	got := make([]byte, at)
	if n, err := unix.Pread(out, got, 0); err != nil || int64(n) != at {
		t.Fatalf("read back %d of %d bytes: %v", n, at, err)
	}
	for i, rq := range reqs {
		checkPattern(t, got[rq.FileOffset:rq.FileOffset+rq.Len], from[i])
	}
}

// TestConcurrentSmallBatches: client threads each keep small batches in
// flight; each batch runs on a few workers, so they proceed side by side,
// and every block lands.
func TestConcurrentSmallBatches(t *testing.T) {
	const fileSize, slot, n, threads = 4 * mib, 16 << 10, 64, 4
	name := patternFile(t, fileSize)
	forEach(t, func(t *testing.T, s setup) {
		l, c := newLib(t, s, 1, func(c *Config) { c.Workers = 4 })
		m := alloc(t, c, 0, threads*n*slot)
		r := register(t, l, m)
		fd := openFile(t, name, unix.O_RDONLY)
		var wg sync.WaitGroup
		last := make([][]Request, threads) // each thread's last batch: what its slots hold
		errc := make(chan string, threads)
		for th := range threads {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(7, uint64(th)))
				for range 8 {
					reqs := kvBlocks(rng, n, fileSize, slot)
					for i := range reqs {
						reqs[i].Fd, reqs[i].DevAddr = fd, r.Addr()
						reqs[i].BufOffset += int64(th) * n * slot
					}
					if failed, err := l.ReadBatch(reqs); failed != 0 || err != nil {
						errc <- describe(reqs)
						return
					}
					last[th] = reqs
				}
			})
		}
		wg.Wait()
		close(errc)
		for e := range errc {
			t.Fatalf("a batch failed: %s", e)
		}
		dev := deviceBytes(t, c, m, 0, threads*n*slot)
		for _, reqs := range last {
			for _, rq := range reqs {
				checkPattern(t, dev[rq.BufOffset:rq.BufOffset+rq.Len], rq.FileOffset)
			}
		}
		if got := l.stagedWorkers(make([]xfer, 3), 1); s.transport == Staged && got != 1 {
			t.Errorf("3 empty xfers get %d workers, want 1", got)
		}
	})
}

// refusingConn's streams refuse to enqueue any scatter or gather with a
// piece over device address bad, as a driver refuses a bad argument.
type refusingConn struct {
	connector.Connector
	bad uint64
}

type refusingStream struct {
	connector.Stream
	bad uint64
}

func (c refusingConn) NewStream(dev int) (connector.Stream, error) {
	s, err := c.Connector.NewStream(dev)
	if err != nil {
		return nil, err
	}
	return refusingStream{s, c.bad}, nil
}

func (s refusingStream) refuses(ps []connector.Piece) error {
	for _, p := range ps {
		if s.bad >= p.Dev && s.bad < p.Dev+uint64(p.Len) {
			return errs.New(unix.EINVAL, "refusingStream: piece over %#x", s.bad)
		}
	}
	return nil
}

func (s refusingStream) ScatterToDevice(src []byte, ps []connector.Piece) error {
	if err := s.refuses(ps); err != nil {
		return err
	}
	return s.Stream.ScatterToDevice(src, ps)
}

func (s refusingStream) GatherFromDevice(dst []byte, ps []connector.Piece) error {
	if err := s.refuses(ps); err != nil {
		return err
	}
	return s.Stream.GatherFromDevice(dst, ps)
}

// TestEnqueueErrorFailsItsOwnTransfer: blocks packed in one slot go to the
// device in one scatter; when the connector refuses that scatter because
// of one block, that block's request fails and the others still land, and
// the next batch on the same worker's stream moves every byte (issue 18,
// item 6: an error belongs to the transfer that caused it).
func TestEnqueueErrorFailsItsOwnTransfer(t *testing.T) {
	const block, n = 16 << 10, 8
	c := emuStaged(t, 1)
	m := alloc(t, c, 0, 2*n*block)
	bad := m.Addr() + 3*block + 100
	l := newLibOn(t, refusingConn{c, bad}, setup{"sync", Staged}, 1, func(cfg *Config) { cfg.Workers = 1 })
	register(t, l, m)
	fd := openFile(t, patternFile(t, 4*n*block), unix.O_RDONLY)
	// n blocks into consecutive slots from base, from the file in reverse
	// (so that none follows on from another: one piece each).
	batch := func(base int64, fileOff int64) []Request {
		reqs := make([]Request, n)
		for k := range reqs {
			reqs[k] = Request{Fd: fd, Device: 0, DevAddr: m.Addr(), BufOffset: base + int64(k)*block, Len: block,
				FileOffset: fileOff + int64(n-1-k)*block}
		}
		return reqs
	}
	check := func(reqs []Request, skip int) {
		t.Helper()
		got := deviceBytes(t, c, m, reqs[0].BufOffset, n*block)
		for k, rq := range reqs {
			if k != skip {
				checkPattern(t, got[k*block:(k+1)*block], rq.FileOffset)
			}
		}
	}
	first := batch(0, 0)
	if failed, err := l.ReadBatch(first); failed != 1 || err != nil {
		t.Fatalf("%d failed, %v, want the refused block alone: %s", failed, err, describe(first))
	}
	if first[3].Result != errnoResult(unix.EINVAL) {
		t.Fatalf("the refused block: result %d, want -EINVAL", first[3].Result)
	}
	check(first, 3)
	second := batch(n*block, 2*n*block)
	if failed, err := l.ReadBatch(second); failed != 0 || err != nil {
		t.Fatalf("the next batch: %d failed, %v: %s", failed, err, describe(second))
	}
	check(second, -1)
}

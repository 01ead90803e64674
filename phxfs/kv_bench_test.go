package phxfs

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
)

// BenchmarkKVBlocks is issue 27's small KV-block row on the emulated
// staged device: 409 random blocks of a hot file per ReadBatch (one
// BATCH ioctl's worth) into shuffled slots, from 1, 4 and 16 client
// goroutines, each with one batch in flight (phxbench-gpu kv's one
// thread; a client thread keeping four ioctls in flight; four such
// threads), on 16 workers of 2 slots of 4 MiB, as the daemon runs on the
// GPU machine. Its baseline, timed in the same run over the same blocks,
// is kv_blocks.cu's method B in Go on the same connector: 16 threads
// pread blocks into a 4 MiB pinned staging buffer each (two per thread,
// 256 blocks of 16 KiB a buffer) and move each buffer with one scatter
// and a fence. Both sides pay the same two copies here (the file's bytes
// into a staging buffer, and the emulated device's copy out of it), so
// what the ratio loses is the library's per-batch cost.
//
//	go test ./phxfs -run '^$' -bench KVBlocks -benchtime 3x
//
// The library runs twice, its batches spread over workers as if each ran
// alone (the default: spread) and split by load (StagedByLoad: load), so
// both rules meet the same baseline in one run. It
// reports GB/s, each side's ratio to the reference, and each side's CPU
// time per batch of 409 blocks (the whole process's, the emulated copies
// included). The emu+driver rows add a model of the driver's per-call
// cost (kvDriverCost, or PHX_KV_DRIVER_US) to every side.
func BenchmarkKVBlocks(b *testing.B) {
	const fileSize, total = 256 * mib, 128 * mib
	name := patternFile(b, fileSize)
	cost := kvDriverCost
	if v, err := strconv.Atoi(os.Getenv("PHX_KV_DRIVER_US")); err == nil && v > 0 {
		cost = time.Duration(v) * time.Microsecond
	}
	for _, drv := range []time.Duration{0, cost} {
		for _, bs := range []int64{16 << 10, 64 << 10} {
			for _, clients := range []int{1, 4, 16} {
				what := "emu"
				if drv > 0 {
					what = "emu+driver"
				}
				b.Run(fmt.Sprintf("%s/%dKiB/%dclients", what, bs>>10, clients), func(b *testing.B) {
					k := newKVRig(b, name, fileSize, total, bs, drv)
					var ref, load, spread kvSide
					for range b.N {
						ref.add(func() { k.reference() })
						k.l.SetStagedByLoad(false)
						spread.add(func() { k.library(b, clients) })
						k.l.SetStagedByLoad(true)
						load.add(func() { k.library(b, clients) })
					}
					k.verify(b, clients)
					batches := float64(b.N) * float64((len(k.reqs)+kvBatchLen-1)/kvBatchLen)
					gbs := func(d time.Duration) float64 { return float64(total) * float64(b.N) / d.Seconds() / 1e9 }
					b.ReportMetric(gbs(ref.wall), "ref-GB/s")
					b.ReportMetric(gbs(load.wall), "load-GB/s")
					b.ReportMetric(ref.wall.Seconds()/load.wall.Seconds(), "load/ref")
					b.ReportMetric(gbs(spread.wall), "spread-GB/s")
					b.ReportMetric(ref.wall.Seconds()/spread.wall.Seconds(), "spread/ref")
					b.ReportMetric(float64(spread.cpu.Microseconds())/batches, "spread-cpu-us/batch")
					b.ReportMetric(float64(ref.cpu.Microseconds())/batches, "ref-cpu-us/batch")
					b.ReportMetric(float64(load.cpu.Microseconds())/batches, "load-cpu-us/batch")
					b.ReportMetric(0, "ns/op")
				})
			}
		}
	}
}

// kvDriverCost is the driver model's cost of a call (emu+driver rows):
// every scatter, fence and fence wait holds one lock that all streams
// share and keeps its CPU busy this long, standing in for the CUDA
// driver's calls and its context lock, which the emulated device does not
// have. A model, not a measurement: it shows what a fixed cost per call
// does to each side, the reference paying it per 4 MiB staging buffer.
const kvDriverCost = 5 * time.Microsecond

// kvSide sums one side's wall and CPU (user and system, the whole
// process) time.
type kvSide struct{ wall, cpu time.Duration }

func (s *kvSide) add(f func()) {
	c0, t0 := cpuTime(), time.Now()
	f()
	s.wall += time.Since(t0)
	s.cpu += cpuTime() - c0
}

func cpuTime() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// driverConn is the driver model (kvDriverCost) around a connector.
type driverConn struct {
	connector.Connector
	mu   *sync.Mutex
	cost time.Duration
}

type driverStream struct {
	connector.Stream
	c *driverConn
}

type driverFence struct {
	connector.Fence
	c *driverConn
}

// call holds the model's lock for its cost, spinning.
func (c *driverConn) call() {
	c.mu.Lock()
	for t := time.Now(); time.Since(t) < c.cost; {
	}
	c.mu.Unlock()
}

func (c *driverConn) NewStream(dev int) (connector.Stream, error) {
	s, err := c.Connector.NewStream(dev)
	if err != nil {
		return nil, err
	}
	return driverStream{s, c}, nil
}

func (s driverStream) ScatterToDevice(src []byte, ps []connector.Piece) error {
	s.c.call()
	return s.Stream.ScatterToDevice(src, ps)
}

func (s driverStream) Fence() (connector.Fence, error) {
	s.c.call()
	f, err := s.Stream.Fence()
	if err != nil {
		return nil, err
	}
	return driverFence{f, s.c}, nil
}

func (f driverFence) Wait() error {
	f.c.call()
	return f.Fence.Wait()
}

// kvRig is one block size's blocks, file, device buffer and library.
type kvRig struct {
	l    *Lib
	c    connector.Connector
	m    connector.Memory
	fd   int
	bs   int64
	reqs []Request
	host connector.HostMemory // the reference's staging buffers
}

const (
	kvRefThreads = 16
	kvRefStage   = 4 * mib
	kvBatchLen   = 409
)

func newKVRig(b *testing.B, name string, fileSize, total, bs int64, drv time.Duration) *kvRig {
	var c connector.Connector = emuStaged(b, 1)
	if drv > 0 {
		c = &driverConn{Connector: c, mu: &sync.Mutex{}, cost: drv}
	}
	l := newLibOn(b, c, setup{"io_uring", Staged}, 1, func(cfg *Config) {
		cfg.Workers, cfg.BounceSize, cfg.SplitSize, cfg.QueueDepth = 16, kvRefStage, 0, 1024
	})
	k := &kvRig{l: l, c: c, m: alloc(b, c, 0, total), fd: openFile(b, name, unix.O_RDONLY), bs: bs}
	register(b, l, k.m)
	rng := rand.New(rand.NewPCG(42, uint64(bs)))
	n := int(total / bs)
	slots := rng.Perm(n)
	k.reqs = make([]Request, n)
	for i := range k.reqs {
		k.reqs[i] = Request{Fd: k.fd, Device: 0, DevAddr: k.m.Addr(), BufOffset: int64(slots[i]) * bs, Len: bs,
			FileOffset: rng.Int64N(fileSize/bs) * bs}
	}
	h, err := c.AllocHost(2 * kvRefThreads * kvRefStage)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Close() })
	k.host = h
	// Hot, and the library's mapping and streams made before the clock.
	buf := make([]byte, 4*mib)
	for off := int64(0); off < fileSize; off += int64(len(buf)) {
		unix.Pread(k.fd, buf, off)
	}
	k.library(b, 1)
	k.reference()
	return k
}

// library reads every block through ReadBatch, clients batches at a time.
func (k *kvRig) library(b testing.TB, clients int) time.Duration {
	var mu sync.Mutex
	at := 0
	t0 := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			batch := make([]Request, kvBatchLen)
			for {
				mu.Lock()
				lo := at
				at = min(at+kvBatchLen, len(k.reqs))
				mu.Unlock()
				if lo >= len(k.reqs) {
					return
				}
				batch = append(batch[:0], k.reqs[lo:min(lo+kvBatchLen, len(k.reqs))]...)
				if n, err := k.l.ReadBatch(batch); err != nil || n != 0 {
					b.Errorf("%d of %d blocks failed (%v)", n, len(batch), err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(t0)
}

// reference is kv_blocks.cu's method B on the connector: thread t takes
// blocks t, t+16, ...; a group of a staging buffer's blocks is pread into
// it and moved with one scatter and a fence; a buffer is refilled after
// its fence.
func (k *kvRig) reference() time.Duration {
	g := int(kvRefStage / k.bs)
	t0 := time.Now()
	var wg sync.WaitGroup
	for t := range kvRefThreads {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			s, err := k.c.NewStream(0)
			if err != nil {
				panic(err)
			}
			defer s.Close()
			var fences [2]connector.Fence
			pieces := make([]connector.Piece, 0, g)
			j := 0
			for i := t; i < len(k.reqs); j ^= 1 {
				if fences[j] != nil {
					if err := fences[j].Wait(); err != nil {
						panic(err)
					}
				}
				at := int64(2*t+j) * kvRefStage
				buf := k.host.Bytes()[at : at+kvRefStage]
				pieces = pieces[:0]
				for q := 0; q < g && i < len(k.reqs); q, i = q+1, i+kvRefThreads {
					r := &k.reqs[i]
					if n, err := unix.Pread(k.fd, buf[int64(q)*k.bs:int64(q+1)*k.bs], r.FileOffset); err != nil || int64(n) != k.bs {
						panic(fmt.Sprint("pread ", n, err))
					}
					pieces = append(pieces, connector.Piece{Off: int64(q) * k.bs, Dev: r.DevAddr + uint64(r.BufOffset), Len: k.bs})
				}
				if err := s.ScatterToDevice(buf, pieces); err != nil {
					panic(err)
				}
				if fences[j], err = s.Fence(); err != nil {
					panic(err)
				}
			}
			for _, f := range fences {
				if f != nil {
					f.Wait()
				}
			}
		})
	}
	wg.Wait()
	return time.Since(t0)
}

// verify clears the device buffer, reads every block through the
// library again and checks each one (the reference lands the same bytes).
func (k *kvRig) verify(b testing.TB, clients int) {
	fillDevice(b, k.c, k.m, 0, make([]byte, k.m.Size()))
	k.library(b, clients)
	got := deviceBytes(b, k.c, k.m, 0, k.m.Size())
	for _, r := range k.reqs {
		checkPattern(b, got[r.BufOffset:r.BufOffset+k.bs], r.FileOffset)
	}
}

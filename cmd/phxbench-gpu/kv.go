package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"sync"
	"time"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/nvidia"
	"github.com/phxmount/phxmount/phxfs"
)

// kv is the KV-cache restore shape of kv_blocks.cu, through the phxfs
// library in-process (no mount): random fixed-size blocks of a hot file
// into shuffled slots of one registered 2 GiB buffer, in batches of 409
// requests (the ioctl's most), from 1 and 4 client threads, each keeping
// -inflight batches in flight (one goroutine a batch: ReadBatch waits),
// once per scatter method and per rule splitting a batch among workers
// (-rules: spread as if alone, or by load: phxfs Config.StagedByLoad).
// Each run prints its per-batch figures: wall time a batch, the
// library's batches and scatters a batch. The mount's figure is
// python/tools/gpu_kv.py's; this one tells the daemon's share of it.

const (
	kvTotal = 2 * gib // bytes moved per run, and the buffer
	kvBatch = 409
)

type kvOpts struct {
	common
	scatter, blocks, threads, trace string
	rules, inflight                 string
	share                           int64
}

func kvMain(args []string) error {
	var o kvOpts
	fs := flag.NewFlagSet("kv", flag.ExitOnError)
	o.register(fs, "the blocks' file (hot: it is read once first)")
	fs.StringVar(&o.scatter, "scatter", "auto,kernel,batch,copies", "PHX_SCATTER methods to compare")
	fs.StringVar(&o.blocks, "blocks", "16,64,256,1024", "block sizes in KiB")
	fs.StringVar(&o.threads, "threads", "1,4", "client threads")
	fs.StringVar(&o.inflight, "inflight", "1", "batches each client thread keeps in flight (the mount's loaders: 4)")
	fs.StringVar(&o.rules, "rules", "spread", "how a batch is split among workers: spread (as if alone), load (by the plans beside it)")
	fs.Int64Var(&o.share, "share", 0, "least KiB of a batch per worker (0: the library's default)")
	fs.StringVar(&o.trace, "trace", "", "write a runtime trace of the runs here")
	fs.Parse(args)
	if o.file == "" || o.out == "" {
		return fmt.Errorf("kv: -file and -out please")
	}
	k, err := newKV(o)
	if err != nil {
		return err
	}
	defer k.close()
	defer k.rep.write(o.out)
	stop, err := profile(o.trace, o.cpuprofile)
	if err != nil {
		return err
	}
	defer stop()
	return k.run()
}

// profile starts a runtime trace and a CPU profile where asked; stop ends
// them.
func profile(tracePath, cpuPath string) (stop func(), err error) {
	var files []*os.File
	stop = func() {
		trace.Stop()
		pprof.StopCPUProfile()
		for _, f := range files {
			f.Close()
		}
	}
	for _, p := range []struct {
		path  string
		start func(io.Writer) error
	}{{tracePath, trace.Start}, {cpuPath, pprof.StartCPUProfile}} {
		if p.path == "" {
			continue
		}
		f, err := os.Create(p.path)
		if err != nil {
			stop()
			return nil, err
		}
		files = append(files, f)
		if err := p.start(f); err != nil {
			stop()
			return nil, err
		}
	}
	return stop, nil
}

// kvBench is one kv run: the connector, the library, the registered
// buffer and the file.
type kvBench struct {
	o    kvOpts
	conn *nvidia.Connector
	lib  *phxfs.Lib
	mem  connector.Memory
	f    *os.File
	rep  *report
}

func newKV(o kvOpts) (*kvBench, error) {
	k := &kvBench{o: o}
	var err error
	if k.conn, err = nvidia.Open(); err != nil {
		return nil, err
	}
	if k.mem, err = k.conn.Alloc(0, kvTotal); err != nil {
		return k, err
	}
	k.lib, err = phxfs.New(phxfs.Config{Connector: k.conn, Workers: o.workers, BounceSize: o.bounce * mib, StagedShare: o.share << 10,
		Transport: phxfs.Staged})
	if err != nil {
		return k, err
	}
	if err := k.lib.OpenDevice(0); err != nil {
		return k, err
	}
	if _, err := k.lib.RegMem(0, k.mem.Addr(), kvTotal); err != nil {
		return k, err
	}
	if k.f, err = os.Open(o.file); err != nil {
		return k, err
	}
	st, _ := k.f.Stat()
	k.rep = &report{File: o.file, FileBytes: st.Size(), DataBytes: kvTotal, Chosen: map[string]int64{}, Env: map[string]string{}}
	return k, readAll(k.f)
}

func (k *kvBench) close() {
	if k.lib != nil {
		k.lib.Close()
	}
	if k.mem != nil {
		k.mem.Close()
	}
	if k.f != nil {
		k.f.Close()
	}
	if k.conn != nil {
		k.conn.Close()
	}
}

// readAll reads f once, so its pages are cached: the runs are hot.
func readAll(f *os.File) error {
	buf := make([]byte, 64*mib)
	for off := int64(0); ; off += int64(len(buf)) {
		n, err := f.ReadAt(buf, off)
		if n < len(buf) || err != nil {
			return nil
		}
	}
}

// run measures every block size × threads × method, and checks the bytes
// of the last run of each block size: every block, copied back.
func (k *kvBench) run() error {
	for _, bk := range parseList(k.o.blocks, parseInt64) {
		bs := bk << 10
		reqs := kvRequests(k.f, bs, k.mem.Addr())
		for _, th := range parseList(k.o.threads, parseInt64) {
			for _, fl := range parseList(k.o.inflight, parseInt64) {
				for _, rule := range parseList(k.o.rules, nonEmpty) {
					if rule != "spread" && rule != "load" {
						return fmt.Errorf("kv: -rules: spread or load, not %q", rule)
					}
					k.lib.SetStagedByLoad(rule == "load")
					for _, m := range parseList(k.o.scatter, nonEmpty) {
						if err := k.conn.SetScatter(m); err != nil {
							fmt.Printf("kv %d KiB, %s: not run (%v)\n", bk, m, err)
							continue
						}
						if err := k.one(reqs, bk, int(th), int(fl), rule, m); err != nil {
							return err
						}
					}
				}
			}
		}
		if err := k.verify(reqs, bs); err != nil {
			return err
		}
		fmt.Printf("verify: kv %d KiB: every block equals the file\n", bk)
	}
	k.rep.Notes = append(k.rep.Notes, k.conn.ScatterReport())
	return nil
}

// one is one run: its row, named as before for one batch in flight and
// the spread rule (the rows gpu_report.py knows), and its per-batch
// figures.
func (k *kvBench) one(reqs []phxfs.Request, bk int64, threads, inflight int, rule, method string) error {
	st0 := k.lib.Stats()
	c0, b0, k0 := k.conn.PieceOps()
	d, err := k.restore(reqs, threads*inflight)
	if err != nil {
		return fmt.Errorf("kv %d KiB, %d threads x %d in flight, %s, %s: %w", bk, threads, inflight, rule, method, err)
	}
	name := fmt.Sprintf("kv in-process %4d KiB blocks, %d thread(s), scatter %s, share %d KiB", bk, threads, method, k.o.share)
	if inflight != 1 || rule != "spread" {
		name += fmt.Sprintf(", %d in flight, %s", inflight, rule)
	}
	k.rep.add(name, kvTotal, d, "409 requests per batch, hot file, registered before the clock")
	st := k.lib.Stats()
	c1, b1, k1 := k.conn.PieceOps()
	batches := st.Batches - st0.Batches
	moves := (c1 - c0) + (b1 - b0) + (k1 - k0)
	if batches > 0 {
		fmt.Printf("  per batch: %d batches, %.0f us wall each (%d in flight), %.2f scatters (kernel %d, batch %d, copies %d), %.1f blocks a scatter\n",
			batches, float64(d.Microseconds())*float64(threads*inflight)/float64(batches), threads*inflight,
			float64(moves)/float64(batches), k1-k0, b1-b0, c1-c0, float64(st.Requests-st0.Requests)/float64(max(moves, 1)))
	}
	return nil
}

// kvRequests draws the blocks: random file blocks (seeded), shuffled slots.
func kvRequests(f *os.File, bs int64, addr uint64) []phxfs.Request {
	st, _ := f.Stat()
	n := int(kvTotal / bs)
	rng := rand.New(rand.NewPCG(42, uint64(bs)))
	slots := rng.Perm(n)
	reqs := make([]phxfs.Request, n)
	for i := range reqs {
		reqs[i] = phxfs.Request{Fd: int(f.Fd()), Device: 0, DevAddr: addr, BufOffset: int64(slots[i]) * bs,
			Len: bs, FileOffset: rng.Int64N(st.Size()/bs) * bs}
	}
	return reqs
}

// restore runs reqs in batches of kvBatch, threads batches at a time
// (one goroutine each).
func (k *kvBench) restore(reqs []phxfs.Request, threads int) (time.Duration, error) {
	var next sync.Mutex
	at := 0
	errc := make(chan error, threads)
	t0 := time.Now()
	var wg sync.WaitGroup
	for range threads {
		wg.Go(func() {
			for {
				next.Lock()
				lo := at
				at = min(at+kvBatch, len(reqs))
				next.Unlock()
				if lo >= len(reqs) {
					return
				}
				batch := append([]phxfs.Request(nil), reqs[lo:min(lo+kvBatch, len(reqs))]...)
				var n int
				var err error
				trace.WithRegion(context.Background(), "kv.batch", func() { n, err = k.lib.ReadBatch(batch) })
				if err != nil || n != 0 {
					errc <- fmt.Errorf("%d of %d failed (%v)", n, len(batch), err)
					return
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(t0)
	close(errc)
	return d, <-errc
}

// verify copies the buffer back and compares every block with the file.
func (k *kvBench) verify(reqs []phxfs.Request, bs int64) error {
	got := make([]byte, kvTotal)
	if err := k.conn.CopyToHost(got, k.mem.Addr(), 0); err != nil {
		return err
	}
	want := make([]byte, bs)
	for i, r := range reqs {
		if _, err := k.f.ReadAt(want, r.FileOffset); err != nil {
			return err
		}
		if !bytes.Equal(got[r.BufOffset:r.BufOffset+bs], want) {
			return fmt.Errorf("kv %d KiB: block %d (file offset %d, slot %d) differs on the GPU", bs>>10, i, r.FileOffset, r.BufOffset/bs)
		}
	}
	return nil
}

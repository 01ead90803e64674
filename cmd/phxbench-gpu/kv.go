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
// requests (the ioctl's most), from 1 and 4 client goroutines, once per
// scatter method. The mount's figure is python/tools/gpu_kv.py's; this one
// tells the daemon's share of it.

const (
	kvTotal = 2 * gib // bytes moved per run, and the buffer
	kvBatch = 409
)

type kvOpts struct {
	common
	scatter, blocks, threads, trace string
	share                           int64
}

func kvMain(args []string) error {
	var o kvOpts
	fs := flag.NewFlagSet("kv", flag.ExitOnError)
	o.register(fs, "the blocks' file (hot: it is read once first)")
	fs.StringVar(&o.scatter, "scatter", "auto,kernel,batch,copies", "PHX_SCATTER methods to compare")
	fs.StringVar(&o.blocks, "blocks", "16,64,256,1024", "block sizes in KiB")
	fs.StringVar(&o.threads, "threads", "1,4", "client goroutines")
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
			for _, m := range parseList(k.o.scatter, nonEmpty) {
				if err := k.conn.SetScatter(m); err != nil {
					fmt.Printf("kv %d KiB, %s: not run (%v)\n", bk, m, err)
					continue
				}
				d, err := k.restore(reqs, int(th))
				if err != nil {
					return fmt.Errorf("kv %d KiB, %d threads, %s: %w", bk, th, m, err)
				}
				k.rep.add(fmt.Sprintf("kv in-process %4d KiB blocks, %d thread(s), scatter %s, share %d KiB", bk, th, m, k.o.share), kvTotal, d,
					"409 requests per batch, hot file, registered before the clock")
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

// restore runs reqs in batches of kvBatch, threads batches at a time.
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

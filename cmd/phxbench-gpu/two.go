package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/nvidia"
	"github.com/phxmount/phxmount/phxfs"
)

// two loads the two halves of a hot file onto two GPUs at once through the
// library in-process, with one shared worker pool and with one pool per
// GPU: which placement keeps both copy engines busy (two_gpu.cu's
// two-GPU bounce figure is the yardstick; host memory bandwidth, not PCIe,
// is the limit there).

func twoMain(args []string) error {
	var c common
	fs := flag.NewFlagSet("two", flag.ExitOnError)
	c.register(fs, "the file (hot: it is read once first)")
	fs.Parse(args)
	if c.file == "" || c.out == "" {
		return fmt.Errorf("two: -file and -out please")
	}
	conn, err := nvidia.Open()
	if err != nil {
		return err
	}
	defer conn.Close()
	devs, _ := conn.Devices()
	if len(devs) < 2 {
		return fmt.Errorf("two: %d GPU(s), need 2", len(devs))
	}
	t, err := newTwo(conn, c)
	if err != nil {
		return err
	}
	defer t.close()
	rep := &report{File: c.file, FileBytes: 2 * t.half, DataBytes: 2 * t.half, Chosen: map[string]int64{}, Env: map[string]string{}}
	defer rep.write(c.out)
	for _, p := range []struct {
		name    string
		pools   int
		workers int
	}{{"one shared pool", 1, c.workers}, {"one pool per GPU", 2, c.workers / 2}, {"one pool per GPU, each full size", 2, c.workers}} {
		d, err := bestOf(3, func() (time.Duration, error) { return t.load(p.pools, p.workers, c.bounce*mib) })
		if err != nil {
			return fmt.Errorf("two: %s: %w", p.name, err)
		}
		rep.add(fmt.Sprintf("two GPUs in-process, %s, %d workers each", p.name, p.workers), 2*t.half, d,
			"each GPU loads half the hot file, registered before the clock, best of 3")
		if err := t.verify(); err != nil {
			return fmt.Errorf("two: %s: %w", p.name, err)
		}
	}
	fmt.Println("verify: both GPUs hold their halves (sampled MiBs)")
	return nil
}

// twoLoad is the file, its halves' requests and one buffer per GPU.
type twoLoad struct {
	conn *nvidia.Connector
	f    *fileHalves
	mem  [2]connector.Memory
	half int64
}

func newTwo(conn *nvidia.Connector, c common) (*twoLoad, error) {
	f, err := openHalves(c.file)
	if err != nil {
		return nil, err
	}
	t := &twoLoad{conn: conn, f: f, half: f.half}
	for d := range 2 {
		if t.mem[d], err = conn.Alloc(d, f.half); err != nil {
			t.close()
			return nil, err
		}
	}
	return t, nil
}

func (t *twoLoad) close() {
	for _, m := range t.mem {
		if m != nil {
			m.Close()
		}
	}
	t.f.close()
}

// load times both halves loading at once, through one library (pools 1)
// or one per GPU (pools 2) of workers each.
func (t *twoLoad) load(pools, workers int, bounce int64) (time.Duration, error) {
	libs := make([]*phxfs.Lib, pools)
	for i := range libs {
		l, err := phxfs.New(phxfs.Config{Connector: t.conn, Workers: workers, BounceSize: bounce, Transport: phxfs.Staged})
		if err != nil {
			return 0, err
		}
		defer l.Close()
		libs[i] = l
	}
	for d := range 2 {
		l := libs[d%pools]
		if err := l.OpenDevice(d); err != nil {
			return 0, err
		}
		if _, err := l.RegMem(d, t.mem[d].Addr(), t.half); err != nil {
			return 0, err
		}
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	t0 := time.Now()
	for d := range 2 {
		wg.Go(func() {
			reqs := t.f.requests(d, t.mem[d].Addr())
			if n, err := libs[d%pools].ReadBatch(reqs); err != nil || n != 0 {
				errs[d] = fmt.Errorf("GPU %d: %d requests failed (%v)", d, n, err)
			}
		})
	}
	wg.Wait()
	dt := time.Since(t0)
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	return dt, nil
}

// fileHalves is a hot file cut in two halves of a 64 KiB multiple each.
type fileHalves struct {
	f    *os.File
	half int64
}

func openHalves(name string) (*fileHalves, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	st, _ := f.Stat()
	readAll(f)
	return &fileHalves{f: f, half: st.Size() / 2 / (64 << 10) * (64 << 10)}, nil
}

func (h *fileHalves) close() { h.f.Close() }

// requests reads half d into the buffer at addr in 128 MiB extents.
func (h *fileHalves) requests(d int, addr uint64) []phxfs.Request {
	var rs []phxfs.Request
	for o := int64(0); o < h.half; o += chunk {
		rs = append(rs, phxfs.Request{Fd: int(h.f.Fd()), Device: d, DevAddr: addr, BufOffset: o,
			Len: min(chunk, h.half-o), FileOffset: int64(d)*h.half + o})
	}
	return rs
}

// verify compares the first, a middle and the last MiB of each GPU's
// buffer with the file.
func (t *twoLoad) verify() error {
	got, want := make([]byte, mib), make([]byte, mib)
	for d := range 2 {
		for _, off := range []int64{0, t.half / 2 / mib * mib, t.half - mib} {
			if err := t.conn.CopyToHost(got, t.mem[d].Addr()+uint64(off), d); err != nil {
				return err
			}
			if _, err := t.f.f.ReadAt(want, int64(d)*t.half+off); err != nil {
				return err
			}
			if !bytes.Equal(got, want) {
				return fmt.Errorf("GPU %d: the MiB at %d differs from the file", d, off)
			}
		}
	}
	return nil
}

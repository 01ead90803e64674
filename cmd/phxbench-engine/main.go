// Command phxbench-engine measures the phxfs batch API reading a file into
// registered emulated-device buffers, for one engine, transport and request
// plan (plan.go), and prints one JSON line. scripts/bench-engine.sh runs it
// beside fio on the same file and prints the ratios.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/emu"
	"github.com/phxmount/phxmount/phxfs"
)

type result struct {
	Engine    string  `json:"engine"`
	Transport string  `json:"transport"`
	Pattern   string  `json:"pattern"`
	Block     int64   `json:"block"`
	QD        int     `json:"qd"`
	Workers   int     `json:"workers"`
	Seconds   float64 `json:"seconds"`
	Bytes     int64   `json:"bytes"`
	IOPS      float64 `json:"iops"`
	MBps      float64 `json:"mb_per_s"`
	// What reached the engine (phxfs.Stats): requests, engine ops after
	// coalescing, requests merged into a neighbour's op, batches.
	Requests  int64 `json:"requests"`
	Ops       int64 `json:"ops"`
	Coalesced int64 `json:"coalesced"`
	Batches   int64 `json:"batches"`
}

// opts are the command's flags.
type opts struct {
	file, pattern, engine, transport string
	block                            int64
	qd, workers                      int
	seconds                          float64
}

func main() {
	var o opts
	flag.StringVar(&o.file, "file", "", "file to read (O_DIRECT)")
	flag.StringVar(&o.pattern, "pattern", planRand, "request plan: rand, seq or seq-contig (plan.go)")
	flag.Int64Var(&o.block, "bs", 4096, "request size in bytes")
	flag.StringVar(&o.engine, "engine", "io_uring", "io_uring or sync")
	flag.StringVar(&o.transport, "transport", "host", "host or staged")
	flag.IntVar(&o.qd, "qd", 64, "requests in flight per worker")
	flag.IntVar(&o.workers, "workers", 1, "worker pool size")
	flag.Float64Var(&o.seconds, "seconds", 8, "how long to read")
	flag.Parse()
	res, err := run(o)
	if err == nil {
		err = json.NewEncoder(os.Stdout).Encode(res)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "phxbench-engine:", err)
		os.Exit(2)
	}
}

func run(o opts) (*result, error) {
	if o.file == "" || o.block <= 0 || o.block%4096 != 0 || o.qd <= 0 || o.workers <= 0 {
		return nil, fmt.Errorf("need -file, -bs a multiple of 4096, -qd and -workers")
	}
	fd, err := unix.Open(o.file, unix.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Size < o.block {
		return nil, fmt.Errorf("%s is smaller than one block", o.file)
	}
	// The batch holds as many requests as keep every worker's queue full
	// several times over; the landing buffer has a slot per request.
	batch := o.qd * o.workers * 4
	b, err := newBench(o, batch)
	if err != nil {
		return nil, err
	}
	defer b.close()
	fds, err := dupFds(fd, batch)
	if err != nil {
		return nil, err
	}
	defer closeFds(fds)
	pl, err := newPlanner(o.pattern, o.block, st.Size/o.block, fds, b.mem.Addr())
	if err != nil {
		return nil, err
	}
	return b.measure(pl, batch, o)
}

// bench is a library with one registered emulated-device buffer.
type bench struct {
	lib *phxfs.Lib
	mem connector.Memory
}

func newBench(o opts, batch int) (*bench, error) {
	conn, err := emu.New(emu.Config{Staged: o.transport == "staged"})
	if err != nil {
		return nil, err
	}
	lib, err := phxfs.New(phxfs.Config{Connector: conn, Engine: o.engine, Workers: o.workers, QueueDepth: o.qd,
		BounceSize: max(o.block, 1<<20), SplitSize: -1})
	if err != nil {
		return nil, err
	}
	b := &bench{lib: lib}
	if err := lib.OpenDevice(0); err != nil {
		b.close()
		return nil, err
	}
	size := (int64(batch)*o.block + emu.PageSize - 1) / emu.PageSize * emu.PageSize
	if b.mem, err = conn.Alloc(0, size); err != nil {
		b.close()
		return nil, err
	}
	reg, err := lib.RegMem(0, b.mem.Addr(), b.mem.Size())
	if err == nil && string(reg.Transport()) != o.transport {
		err = fmt.Errorf("registration got transport %s, want %s", reg.Transport(), o.transport)
	}
	if err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *bench) close() {
	if b.mem != nil {
		b.mem.Close()
	}
	b.lib.Close()
}

// measure reads batches built by pl until the time is up, then checks that
// the engine saw the shape the plan promises.
func (b *bench) measure(pl *planner, batch int, o opts) (*result, error) {
	reqs := make([]phxfs.Request, batch)
	var moved int64
	start := time.Now()
	deadline := start.Add(time.Duration(o.seconds * float64(time.Second)))
	for time.Now().Before(deadline) {
		pl.fill(reqs)
		if err := readBatch(b.lib, reqs); err != nil {
			return nil, err
		}
		moved += int64(batch) * o.block
	}
	el := time.Since(start).Seconds()
	st := b.lib.Stats()
	if err := checkShape(o.pattern, st); err != nil {
		return nil, err
	}
	return &result{
		Engine: b.lib.EngineName(), Transport: o.transport, Pattern: o.pattern, Block: o.block, QD: o.qd,
		Workers: o.workers, Seconds: el, Bytes: moved, IOPS: float64(moved/o.block) / el, MBps: float64(moved) / el / 1e6,
		Requests: st.Requests, Ops: st.Ops, Coalesced: st.Coalesced, Batches: st.Batches,
	}, nil
}

// readBatch runs one batch and fails unless every request read in full.
func readBatch(lib *phxfs.Lib, reqs []phxfs.Request) error {
	failed, err := lib.ReadBatch(reqs)
	if err != nil || failed == 0 {
		return err
	}
	for _, r := range reqs {
		if r.Result != r.Len {
			return fmt.Errorf("%d requests failed, e.g. result %d at offset %d", failed, r.Result, r.FileOffset)
		}
	}
	return nil
}

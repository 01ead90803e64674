// Command phxbench-engine measures the phxfs batch API reading a file into
// registered emulated-device buffers, for one engine, transport and access
// pattern, and prints one JSON line. scripts/bench-engine.sh runs it beside
// fio on the same file and prints the ratios.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"phxmount/connector/emu"
	"phxmount/phxfs"
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
}

func main() {
	file := flag.String("file", "", "file to read (O_DIRECT)")
	pattern := flag.String("pattern", "rand", "rand or seq")
	block := flag.Int64("bs", 4096, "request size in bytes")
	engine := flag.String("engine", "io_uring", "io_uring or sync")
	transport := flag.String("transport", "host", "host or staged")
	qd := flag.Int("qd", 64, "requests in flight per worker")
	workers := flag.Int("workers", 1, "worker pool size")
	seconds := flag.Float64("seconds", 8, "how long to read")
	flag.Parse()
	if err := run(*file, *pattern, *block, *engine, *transport, *qd, *workers, *seconds); err != nil {
		fmt.Fprintln(os.Stderr, "phxbench-engine:", err)
		os.Exit(2)
	}
}

func run(file, pattern string, block int64, engine, transport string, qd, workers int, seconds float64) error {
	if file == "" || block <= 0 || block%4096 != 0 || (pattern != "rand" && pattern != "seq") {
		return fmt.Errorf("need -file, -bs a multiple of 4096 and -pattern rand|seq")
	}
	fd, err := unix.Open(file, unix.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	blocks := st.Size / block
	if blocks < 1 {
		return fmt.Errorf("%s is smaller than one block", file)
	}
	conn, err := emu.New(emu.Config{Staged: transport == "staged"})
	if err != nil {
		return err
	}
	bounce := max(block, 1<<20)
	lib, err := phxfs.New(phxfs.Config{Connector: conn, Engine: engine, Workers: workers, QueueDepth: qd, BounceSize: bounce, SplitSize: -1})
	if err != nil {
		return err
	}
	defer lib.Close()
	if err := lib.OpenDevice(0); err != nil {
		return err
	}
	// The batch holds as many requests as keep every worker's queue full
	// several times over; the landing buffer has a slot per request.
	batch := qd * workers * 4
	bufSize := (int64(batch)*block + emu.PageSize - 1) / emu.PageSize * emu.PageSize
	mem, err := conn.Alloc(0, bufSize)
	if err != nil {
		return err
	}
	defer mem.Close()
	reg, err := lib.RegMem(0, mem.Addr(), mem.Size())
	if err != nil {
		return err
	}
	if string(reg.Transport) != transport {
		return fmt.Errorf("registration got transport %s, want %s", reg.Transport, transport)
	}
	reqs := make([]phxfs.Request, batch)
	rng := rand.New(rand.NewPCG(1, 2))
	next := int64(0)
	var moved int64
	start := time.Now()
	deadline := start.Add(time.Duration(seconds * float64(time.Second)))
	for time.Now().Before(deadline) {
		for i := range reqs {
			var b int64
			if pattern == "rand" {
				b = rng.Int64N(blocks)
			} else {
				b, next = next, (next+1)%blocks
			}
			reqs[i] = phxfs.Request{Fd: fd, Device: 0, Buf: mem.Addr(), BufOffset: int64(i) * block, Len: block, FileOffset: b * block}
		}
		failed, err := lib.ReadBatch(reqs)
		if err != nil {
			return err
		}
		if failed != 0 {
			for _, r := range reqs {
				if r.Result != r.Len {
					return fmt.Errorf("%d requests failed, e.g. result %d at offset %d", failed, r.Result, r.FileOffset)
				}
			}
		}
		moved += int64(batch) * block
	}
	el := time.Since(start).Seconds()
	return json.NewEncoder(os.Stdout).Encode(result{
		Engine: lib.EngineName(), Transport: transport, Pattern: pattern, Block: block, QD: qd, Workers: workers,
		Seconds: el, Bytes: moved, IOPS: float64(moved/block) / el, MBps: float64(moved) / el / 1e6,
	})
}

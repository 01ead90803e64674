// Command phxbench-gpu is the Go half of the GPU benchmark (scripts/gpu-test.sh
// runs it on the GPU machine):
//
//	phxbench-gpu gen -out FILE -size BYTES     write a safetensors file of
//	                                            random tensors (finite floats,
//	                                            mixed dtypes, odd offsets)
//	phxbench-gpu bench -file FILE -out JSON    ceilings (pinned host-to-device
//	                                            copies, page-cache and O_DIRECT
//	                                            reads) and the phxfs library
//	                                            called in-process: a
//	                                            worker/bounce sweep hot, and
//	                                            hot/cold loads
//	phxbench-gpu kv -file FILE -out JSON       KV-cache blocks (kv_blocks.cu's
//	                                            shape) through the library,
//	                                            per block size, client
//	                                            threads and scatter method
//	phxbench-gpu two -file FILE -out JSON      the file's halves onto two
//	                                            GPUs at once: one shared
//	                                            pool, or one per GPU
//
// Cold runs write 3 to /proc/sys/vm/drop_caches (root) and check with
// mincore(2) that none of the data section is still cached; a cold row that
// cannot be made so is printed "not run", with the reason. Every phxfs load is
// checked against the file (sampled ranges and every tensor's first and last
// bytes, copied back from the GPU).
//
// This file holds the flags and bench's steps in order; gen.go the generator
// and the header parser, ceilings.go the ceilings, sweep.go the phxfs loads,
// verify.go the check, report.go the printed rows and the JSON, kv.go the
// KV-cache blocks.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/emu"
	"github.com/phxmount/phxmount/connector/nvidia"
	"github.com/phxmount/phxmount/phxfs"
)

const (
	mib   = 1 << 20
	gib   = 1 << 30
	chunk = 128 * mib // extent size, as the NIXL GDS loader
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: phxbench-gpu gen|bench|kv|two [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "gen":
		err = genMain(os.Args[2:])
	case "bench":
		err = benchMain(os.Args[2:])
	case "kv":
		err = kvMain(os.Args[2:])
	case "two":
		err = twoMain(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "phxbench-gpu:", err)
		os.Exit(1)
	}
}

// benchOpts are bench's flags.
type benchOpts struct {
	common
	threads int
	sweepW  string // the sweep's axes, comma-separated
	sweepB  string
	sweepE  string
	sweepS  string
	sweepR  string
	cold    bool
	vendor  string
}

// common are the flags bench and kv share: the input, the output, the
// library's shape and the profile.
type common struct {
	file, out  string
	workers    int
	bounce     int64 // MiB
	cpuprofile string
}

// register adds the common flags to fs; what says what -file is.
func (c *common) register(fs *flag.FlagSet, what string) {
	fs.StringVar(&c.file, "file", "", what)
	fs.StringVar(&c.out, "out", "", "JSON results")
	fs.IntVar(&c.workers, "workers", 16, "phxfs workers")
	fs.Int64Var(&c.bounce, "bounce", 4, "phxfs bounce size in MiB")
	fs.StringVar(&c.cpuprofile, "cpuprofile", "", "write a CPU profile here")
}

func parseBenchFlags(args []string) benchOpts {
	var o benchOpts
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	o.register(fs, "safetensors file (on the backing file system, not the mount)")
	fs.IntVar(&o.threads, "threads", 16, "reader threads of the read ceilings (= phxfs workers chosen)")
	fs.StringVar(&o.sweepW, "sweep-workers", "8,16", "phxfs worker counts to sweep (hot)")
	fs.StringVar(&o.sweepB, "sweep-bounce", "1,2,4", "bounce sizes in MiB to sweep (hot)")
	fs.StringVar(&o.sweepE, "sweep-engines", "io_uring,sync", "engines to sweep (hot)")
	fs.StringVar(&o.sweepS, "sweep-buffers", "2,4", "bounce buffers per worker to sweep (hot)")
	fs.StringVar(&o.sweepR, "sweep-round", "256", "phxfs round sizes per worker in MiB to sweep (hot; -1: one round)")
	fs.BoolVar(&o.cold, "cold", true, "also measure cold (drop_caches)")
	fs.StringVar(&o.vendor, "vendor", "nvidia", "nvidia, or emu (staged emulated device: a dry run without a GPU)")
	fs.Parse(args)
	return o
}

// bench is one bench run: the file, the device buffer the loads fill, the
// readers of the ceilings, and the phxfs configuration the next load uses.
type bench struct {
	o       benchOpts
	rep     *report
	ts      []tensor
	start   int64 // the data section's offset in the file
	dataLen int64
	conn    connector.Connector
	mem     connector.Memory
	size    int64    // mem's size: the data section rounded up to 64 KiB
	fd, dfd int      // the file, buffered and O_DIRECT
	bufs    [][]byte // pinned buffers of the read ceilings, one per thread
	closers []func() // what close releases, in reverse

	reqs    []phxfs.Request   // every load's requests (plan)
	engine  string            // the next load's engine,
	buffers int               // bounce buffers per worker,
	round   int64             // round per worker (MiB)
	policy  phxfs.ODirect     // and O_DIRECT policy
	last    phxfs.StagedStats // of the last load's library
}

// benchMain measures the ceilings, sweeps phxfs hot, loads the file hot and
// cold in the chosen configuration, checking every load, and writes the
// JSON report (also when a step fails, once the file is known).
func benchMain(args []string) error {
	o := parseBenchFlags(args)
	if o.file == "" || o.out == "" {
		return fmt.Errorf("bench: -file and -out please")
	}
	b := &bench{o: o}
	var err error
	if b.ts, b.start, err = readHeader(o.file); err != nil {
		return err
	}
	b.dataLen = b.ts[len(b.ts)-1].End
	if b.rep, err = newReport(o.file, b.dataLen, o.threads); err != nil {
		return err
	}
	defer b.rep.write(o.out)
	defer b.close()
	hot := []func() error{
		b.openDevice,
		func() error { return pinnedCeiling(b.rep, b.conn, b.mem, o.threads) },
		b.openFile,
		b.pageCacheCeiling,
		b.sweep,
		b.hotLoad,
	}
	if err := run(hot); err != nil {
		return err
	}
	if !o.cold {
		return nil
	}
	// Each cold row drops the caches and checks the file is cold before
	// its clock starts, or is "not run" with the reason.
	return run([]func() error{b.coldCeilings, b.coldLoads})
}

// run runs steps in order up to the first error.
func run(steps []func() error) error {
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// openDevice opens the connector (-vendor) and allocates the device buffer
// the loads fill.
func (b *bench) openDevice() error {
	var err error
	if b.o.vendor == "emu" {
		b.conn, err = emu.New(emu.Config{Staged: true})
	} else {
		b.conn, err = nvidia.Open()
	}
	if err != nil {
		return err
	}
	devs, _ := b.conn.Devices()
	b.rep.Device = fmt.Sprintf("%s %s", devs[0].Name, devs[0].PCIAddress)
	b.size = (b.dataLen + 64<<10 - 1) / (64 << 10) * (64 << 10)
	mem, err := b.conn.Alloc(0, b.size)
	if err != nil {
		return err
	}
	b.mem = mem
	b.onClose(func() { mem.Close() })
	return nil
}

// onClose has close release something.
func (b *bench) onClose(f func()) { b.closers = append(b.closers, f) }

// close releases what onClose was given, last first.
func (b *bench) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

// timed runs f and says how long it took.
func timed(f func() error) (time.Duration, error) {
	t0 := time.Now()
	err := f()
	return time.Since(t0), err
}

// bestOf runs f n times and returns the shortest duration, or the first
// error.
func bestOf(n int, f func() (time.Duration, error)) (time.Duration, error) {
	best := time.Duration(1 << 62)
	for range n {
		d, err := f()
		if err != nil {
			return 0, err
		}
		best = min(best, d)
	}
	return best, nil
}

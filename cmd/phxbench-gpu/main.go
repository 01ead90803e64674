// Command phxbench-gpu is the Go half of the GPU benchmark (scripts/gpu-test.sh
// runs it on the GPU machine):
//
//	phxbench-gpu gen -out FILE -size BYTES     write a safetensors file of
//	                                            random tensors (finite floats,
//	                                            mixed dtypes, odd offsets)
//	phxbench-gpu bench -file FILE -out JSON    ceilings (pinned host-to-device
//	                                            copies, page-cache and O_DIRECT
//	                                            reads) and phxfs called
//	                                            directly: a worker/bounce sweep
//	                                            hot, and hot/cold loads
//
// Cold runs write 3 to /proc/sys/vm/drop_caches (root). Every phxfs load is
// checked against the file (sampled ranges and every tensor's first and last
// bytes, copied back from the GPU).
package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"phxmount/connector"
	"phxmount/connector/emu"
	"phxmount/connector/nvidia"
	"phxmount/phxfs"
)

const (
	mib   = 1 << 20
	gib   = 1 << 30
	chunk = 128 * mib // extent size, as the NIXL GDS loader
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: phxbench-gpu gen|bench [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "gen":
		err = genMain(os.Args[2:])
	case "bench":
		err = benchMain(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "phxbench-gpu:", err)
		os.Exit(1)
	}
}

// --- the safetensors file ---------------------------------------------------

type tensor struct {
	Name  string
	DType string
	Shape []int64
	Begin int64
	End   int64
}

var dtypeSize = map[string]int64{"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "F16": 2, "BF16": 2, "I32": 4, "F32": 4, "I64": 8, "F64": 8}

func isFloat(dt string) bool { return dt == "F16" || dt == "BF16" || dt == "F32" || dt == "F64" }

// layout plans about size bytes of tensors: big 2-D tensors of varied
// dtypes and sizes, with a few odd-sized small ones so that later tensors
// start at offsets that are not multiples of their element size.
func layout(size int64) []tensor {
	big := []string{"BF16", "F32", "F16", "BF16", "I64", "F64", "BF16", "I32"}
	var ts []tensor
	var pos int64
	add := func(name, dt string, shape ...int64) {
		n := dtypeSize[dt]
		for _, s := range shape {
			n *= s
		}
		if shape == nil {
			shape = []int64{} // a scalar: "shape": []
		}
		ts = append(ts, tensor{Name: name, DType: dt, Shape: shape, Begin: pos, End: pos + n})
		pos += n
	}
	for i := 0; pos < size-256*mib || i < 2; i++ {
		dt := big[i%len(big)]
		cols := int64(4096)
		want := int64(64+(i*37)%192) * mib
		rows := want / (cols * dtypeSize[dt])
		add(fmt.Sprintf("layers.%d.weight", i), dt, rows, cols)
		switch i {
		case 3:
			add("layers.3.odd_u8", "U8", 13)
		case 11:
			add("layers.11.mask", "BOOL", 7, 3)
		}
	}
	if rest := size - pos; rest > 0 {
		add("tail.weight", "BF16", rest/2/4096, 4096)
	}
	add("tail.bias", "F32", 4099)
	add("tail.i8", "I8", 5)
	add("tail.scalar", "F64")
	add("tail.empty", "F16", 0, 8)
	return ts
}

func splitmix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}

// fill writes the data bytes [off, off+len(b)) of the data section: random,
// made finite for floats (the top exponent bit cleared) and 0/1 for BOOL.
func fill(b []byte, off int64, seed uint64, ts []tensor) {
	for i := 0; i < len(b); i += 8 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], splitmix(seed^uint64((off+int64(i))/8)))
		copy(b[i:], w[:])
	}
	end := off + int64(len(b))
	k := sort.Search(len(ts), func(k int) bool { return ts[k].End > off })
	for ; k < len(ts) && ts[k].Begin < end; k++ {
		t := ts[k]
		lo, hi := max(t.Begin, off), min(t.End, end)
		switch {
		case t.DType == "BOOL":
			for p := lo; p < hi; p++ {
				b[p-off] &= 1
			}
		case isFloat(t.DType):
			sz := dtypeSize[t.DType]
			// top byte of each element: Begin + k*sz + sz-1
			first := t.Begin + sz - 1
			if lo > first {
				first += (lo - first + sz - 1) / sz * sz
			}
			for p := first; p < hi; p += sz {
				b[p-off] &^= 0x40
			}
		}
	}
}

func genMain(args []string) error {
	fs := flag.NewFlagSet("gen", flag.ExitOnError)
	out := fs.String("out", "", "file to write")
	sizeS := fs.String("size", "8GiB", "data bytes (suffix MiB or GiB)")
	seed := fs.Uint64("seed", 1, "seed")
	prefix := fs.String("prefix", "", "tensor name prefix (shards of one checkpoint need distinct names)")
	fs.Parse(args)
	size, err := parseSize(*sizeS)
	if err != nil || *out == "" {
		return fmt.Errorf("gen: -out and -size please (%v)", err)
	}
	ts := layout(size)
	for i := range ts {
		ts[i].Name = *prefix + ts[i].Name
	}
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt", "generator": "phxbench-gpu"}}
	for _, t := range ts {
		hdr[t.Name] = map[string]any{"dtype": t.DType, "shape": t.Shape, "data_offsets": []int64{t.Begin, t.End}}
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return err
	}
	for (8+len(js))%8 != 0 {
		js = append(js, ' ')
	}
	start := int64(8 + len(js))
	total := ts[len(ts)-1].End
	f, err := os.OpenFile(*out, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	var pre [8]byte
	binary.LittleEndian.PutUint64(pre[:], uint64(len(js)))
	if _, err := f.WriteAt(append(pre[:], js...), 0); err != nil {
		return err
	}
	t0 := time.Now()
	const block = 64 * mib
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	sem := make(chan struct{}, runtime.NumCPU())
	for off := int64(0); off < total; off += block {
		wg.Add(1)
		sem <- struct{}{}
		go func(off int64) {
			defer wg.Done()
			defer func() { <-sem }()
			b := make([]byte, min(block, total-off))
			fill(b, off, *seed, ts)
			if _, err := f.WriteAt(b, start+off); err != nil {
				select {
				case errc <- err:
				default:
				}
			}
		}(off)
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
	}
	fmt.Printf("gen: %s: %d tensors, %d data bytes + %d header, %.1fs\n", *out, len(ts), total, start, time.Since(t0).Seconds())
	return nil
}

func parseSize(s string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "GiB"):
		mult, s = gib, strings.TrimSuffix(s, "GiB")
	case strings.HasSuffix(s, "MiB"):
		mult, s = mib, strings.TrimSuffix(s, "MiB")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mult, err
}

// readHeader parses a safetensors header: tensors in data order and the
// data section's start.
func readHeader(name string) ([]tensor, int64, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	var pre [8]byte
	if _, err := f.ReadAt(pre[:], 0); err != nil {
		return nil, 0, err
	}
	n := binary.LittleEndian.Uint64(pre[:])
	if n > 100<<20 {
		return nil, 0, fmt.Errorf("%s: header of %d bytes", name, n)
	}
	js := make([]byte, n)
	if _, err := f.ReadAt(js, 8); err != nil {
		return nil, 0, err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(js, &raw); err != nil {
		return nil, 0, err
	}
	var ts []tensor
	for k, v := range raw {
		if k == "__metadata__" {
			continue
		}
		var e struct {
			DType   string  `json:"dtype"`
			Shape   []int64 `json:"shape"`
			Offsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(v, &e); err != nil || len(e.Offsets) != 2 {
			return nil, 0, fmt.Errorf("%s: tensor %s: %v", name, k, err)
		}
		ts = append(ts, tensor{Name: k, DType: e.DType, Shape: e.Shape, Begin: e.Offsets[0], End: e.Offsets[1]})
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Begin < ts[j].Begin })
	return ts, 8 + int64(n), nil
}

// --- the benchmark ----------------------------------------------------------

type result struct {
	Name    string  `json:"name"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	GBps    float64 `json:"gbps"`
	Note    string  `json:"note,omitempty"`
}

type report struct {
	File      string            `json:"file"`
	FileBytes int64             `json:"file_bytes"`
	DataBytes int64             `json:"data_bytes"`
	Threads   int               `json:"threads"`
	Results   []result          `json:"results"`
	Sweep     []result          `json:"sweep"`
	Chosen    map[string]int64  `json:"chosen"`
	Staged    map[string]any    `json:"staged_counters"`
	Device    string            `json:"device"`
	Notes     []string          `json:"notes"`
	Env       map[string]string `json:"env"`
}

func (r *report) add(name string, bytes int64, d time.Duration, note string) {
	x := result{Name: name, Bytes: bytes, Seconds: d.Seconds(), GBps: float64(bytes) / d.Seconds() / 1e9, Note: note}
	r.Results = append(r.Results, x)
	fmt.Printf("%-40s %8.2f GB/s  %7.3fs  %s\n", name, x.GBps, x.Seconds, note)
}

func dropCaches() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
}

// stripedRead reads [start, start+n) of fd with threads goroutines, each
// reading chunks of size cs into its own buffer (round robin).
func stripedRead(fd int, start, n int64, threads int, cs int64, bufs [][]byte) error {
	var wg sync.WaitGroup
	errc := make(chan error, threads)
	for w := range threads {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			buf := bufs[w]
			for off := int64(w) * cs; off < n; off += int64(threads) * cs {
				l := min(cs, n-off)
				pos := start + off
				ln := l
				if (pos % 4096) != 0 { // O_DIRECT: aligned reads only
					pos -= pos % 4096
					ln = l + (start+off)%4096
				}
				ln = (ln + 4095) / 4096 * 4096
				got, err := unix.Pread(fd, buf[:ln], pos)
				if err != nil {
					errc <- fmt.Errorf("pread %d at %d: %v", ln, pos, err)
					return
				}
				if int64(got) < l {
					errc <- fmt.Errorf("pread at %d: %d bytes", pos, got)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

func benchMain(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	file := fs.String("file", "", "safetensors file (on the backing file system, not the mount)")
	out := fs.String("out", "", "JSON results")
	threads := fs.Int("threads", 16, "reader threads of the read ceilings (= phxfs workers chosen)")
	sweepW := fs.String("sweep-workers", "8,16", "phxfs worker counts to sweep (hot)")
	sweepB := fs.String("sweep-bounce", "1,2,4", "bounce sizes in MiB to sweep (hot)")
	sweepE := fs.String("sweep-engines", "io_uring,sync", "engines to sweep (hot)")
	sweepS := fs.String("sweep-buffers", "2,4", "bounce buffers per worker to sweep (hot)")
	sweepR := fs.String("sweep-round", "256", "phxfs round sizes per worker in MiB to sweep (hot; -1: one round)")
	workers := fs.Int("workers", 16, "phxfs workers for the hot/cold loads")
	bounce := fs.Int64("bounce", 2, "phxfs bounce size (MiB) for the hot/cold loads")
	cold := fs.Bool("cold", true, "also measure cold (drop_caches)")
	vendor := fs.String("vendor", "nvidia", "nvidia, or emu (staged emulated device: a dry run without a GPU)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the hot sweep here")
	fs.Parse(args)
	if *file == "" || *out == "" {
		return fmt.Errorf("bench: -file and -out please")
	}
	ts, start, err := readHeader(*file)
	if err != nil {
		return err
	}
	dataLen := ts[len(ts)-1].End
	st, err := os.Stat(*file)
	if err != nil {
		return err
	}
	rep := &report{File: *file, FileBytes: st.Size(), DataBytes: dataLen, Threads: *threads, Chosen: map[string]int64{},
		Env: map[string]string{"GOMAXPROCS": strconv.Itoa(runtime.GOMAXPROCS(0)), "direct_io": os.Getenv(phxfs.EnvDirectIO)}}
	defer func() {
		b, _ := json.MarshalIndent(rep, "", " ")
		os.WriteFile(*out, b, 0o644)
	}()

	var conn connector.Connector
	if *vendor == "emu" {
		conn, err = emu.New(emu.Config{Staged: true})
	} else {
		conn, err = nvidia.Open()
	}
	if err != nil {
		return err
	}
	devs, _ := conn.Devices()
	rep.Device = fmt.Sprintf("%s %s", devs[0].Name, devs[0].PCIAddress)
	size := (dataLen + 64<<10 - 1) / (64 << 10) * (64 << 10)
	mem, err := conn.Alloc(0, size)
	if err != nil {
		return err
	}
	defer mem.Close()

	// Ceiling 1: pinned host-to-device copies, allocated before timing.
	if err := pinnedCeiling(rep, conn, mem, *threads); err != nil {
		return err
	}

	fd, err := unix.Open(*file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	dfd, err := unix.Open(*file, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	bufs := make([][]byte, *threads)
	for i := range bufs {
		h, err := conn.AllocHost(16*mib + 8192)
		if err != nil {
			return err
		}
		defer h.Close()
		bufs[i] = h.Bytes()
	}

	// Ceiling 2: page-cache reads (warm first).
	if err := stripedRead(fd, start, dataLen, *threads, 4*mib, bufs); err != nil {
		return err
	}
	for _, cs := range []int64{4 * mib, 16 * mib} {
		best := time.Duration(1 << 62)
		for range 2 {
			t0 := time.Now()
			if err := stripedRead(fd, start, dataLen, *threads, cs, bufs); err != nil {
				return err
			}
			best = min(best, time.Since(t0))
		}
		rep.add(fmt.Sprintf("ceiling page-cache read %dx%dMiB", *threads, cs/mib), dataLen, best, "hot, pread into pinned memory, no copy")
	}

	// phxfs directly: the sweep (hot), then the chosen configuration.
	reqs := plan(ts, fd, start, mem)
	engine, buffers, round, policy := "io_uring", 2, int64(64), phxfs.DirectAuto
	var lastStats phxfs.StagedStats // of the last load's library
	load := func(w int, b int64, warm bool) (time.Duration, error) {
		l, err := phxfs.New(phxfs.Config{Connector: conn, Engine: engine, Workers: w, BounceSize: b, Transport: phxfs.Staged,
			RoundBytes: round * mib, StagedBuffers: buffers, DirectIO: policy})
		if err != nil {
			return 0, err
		}
		defer l.Close()
		defer func() { lastStats = l.StagedStats() }()
		if err := l.OpenDevice(0); err != nil {
			return 0, err
		}
		if warm { // bounce buffers and streams exist before timing
			warm := plan(ts, fd, start, mem)
			if _, err := l.ReadBatch(warm[:min(4, len(warm))]); err != nil {
				return 0, err
			}
		}
		rs := append([]phxfs.Request(nil), reqs...)
		t0 := time.Now()
		if _, err := l.RegMem(0, mem.Addr(), size); err != nil {
			return 0, err
		}
		n, err := l.ReadBatch(rs)
		if err != nil || n != 0 {
			return 0, fmt.Errorf("phxfs batch: %d failed, %v", n, err)
		}
		d := time.Since(t0)
		return d, l.DeregMem(0, mem.Addr(), size)
	}
	if !warmRegister(conn, mem, size) {
		return fmt.Errorf("cannot register the buffer")
	}
	var ws []int
	for _, s := range strings.Split(*sweepW, ",") {
		if n, err := strconv.Atoi(s); err == nil {
			ws = append(ws, n)
		}
	}
	var bs []int64
	for _, s := range strings.Split(*sweepB, ",") {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			bs = append(bs, n*mib)
		}
	}
	var es []string
	for _, e := range strings.Split(*sweepE, ",") {
		if e != "" {
			es = append(es, e)
		}
	}
	var ss []int
	for _, x := range strings.Split(*sweepS, ",") {
		if n, err := strconv.Atoi(x); err == nil {
			ss = append(ss, n)
		}
	}
	var rs []int64
	for _, x := range strings.Split(*sweepR, ",") {
		if n, err := strconv.ParseInt(x, 10, 64); err == nil {
			rs = append(rs, n)
		}
	}
	if *cpuprofile != "" {
		pf, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		pprof.StartCPUProfile(pf)
		defer pf.Close()
	}
	bestRate, bestAt := 0.0, 0.0
	chosenE, chosenS, chosenR := "io_uring", 2, int64(64)
	for _, e := range es {
		for _, nb := range ss {
			for _, r := range rs {
				engine, buffers, round = e, nb, r
				for _, w := range ws {
					for _, b := range bs {
						best := time.Duration(1 << 62)
						for range 2 {
							d, err := load(w, b, true)
							if err != nil {
								return err
							}
							best = min(best, d)
						}
						x := result{Name: fmt.Sprintf("phxfs hot %s %d workers x %d MiB x %d buffers, round %d MiB, sync %s", e, w, b/mib, nb, r, os.Getenv(nvidia.EnvSync)), Bytes: dataLen, Seconds: best.Seconds(), GBps: float64(dataLen) / best.Seconds() / 1e9}
						rep.Sweep = append(rep.Sweep, x)
						fmt.Printf("sweep %-48s %8.2f GB/s\n", x.Name, x.GBps)
						if x.GBps > bestRate {
							bestRate = x.GBps
							rep.Chosen["sweep_best_workers"], rep.Chosen["sweep_best_bounce"], rep.Chosen["sweep_best_buffers"] = int64(w), b, int64(nb)
							rep.Env["sweep_best_engine"] = e
						}
						// At the daemon's shape (workers, bounce): pick engine and buffers.
						if w == *workers && b == *bounce*mib && x.GBps > bestAt {
							bestAt, chosenE, chosenS, chosenR = x.GBps, e, nb, r
						}
					}
				}
			}
		}
	}
	if *cpuprofile != "" {
		pprof.StopCPUProfile()
	}
	engine, buffers, round = chosenE, chosenS, chosenR
	rep.Chosen["workers"], rep.Chosen["bounce"], rep.Chosen["buffers"] = int64(*workers), *bounce*mib, int64(buffers)
	rep.Env["engine"] = engine

	// The chosen configuration, hot, with the bytes checked.
	if err := zero(conn, mem); err != nil {
		return err
	}
	best := time.Duration(1 << 62)
	for range 3 {
		d, err := load(*workers, *bounce*mib, true)
		if err != nil {
			return err
		}
		best = min(best, d)
	}
	rep.add("phxfs direct (Go) hot", dataLen, best, fmt.Sprintf("%s, %d workers x %d MiB x %d buffers, incl. RegMem", engine, *workers, *bounce, buffers))
	if err := verify(conn, mem, *file, start, ts); err != nil {
		return fmt.Errorf("phxfs hot load: %v", err)
	}
	fmt.Println("verify: phxfs hot load equals the file (sampled ranges and every tensor's ends)")

	if !*cold {
		return nil
	}
	if err := dropCaches(); err != nil {
		rep.Notes = append(rep.Notes, "cold runs skipped: "+err.Error())
		return nil
	}
	// Ceiling 3: cold reads, O_DIRECT and buffered, same thread count.
	for _, cs := range []int64{4 * mib, 16 * mib} {
		dropCaches()
		t0 := time.Now()
		if err := stripedRead(dfd, start, dataLen, *threads, cs, bufs); err != nil {
			return err
		}
		rep.add(fmt.Sprintf("ceiling cold O_DIRECT read %dx%dMiB", *threads, cs/mib), dataLen, time.Since(t0), "")
	}
	dropCaches()
	t0 := time.Now()
	if err := stripedRead(fd, start, dataLen, *threads, 4*mib, bufs); err != nil {
		return err
	}
	rep.add(fmt.Sprintf("ceiling cold buffered read %dx4MiB", *threads), dataLen, time.Since(t0), "")

	for _, mode := range []phxfs.DirectIO{phxfs.DirectAuto, phxfs.DirectNever} {
		policy = mode
		if err := zero(conn, mem); err != nil {
			return err
		}
		dropCaches()
		d, err := load(*workers, *bounce*mib, false)
		if err != nil {
			return err
		}
		s1 := lastStats
		rep.add("phxfs direct (Go) cold, policy "+mode.String(), dataLen, d,
			fmt.Sprintf("%d O_DIRECT reads, %d buffered, %d fallbacks", s1.DirectReads, s1.BufferedReads, s1.Fallbacks))
		if err := verify(conn, mem, *file, start, ts); err != nil {
			return fmt.Errorf("phxfs cold load (%v): %v", mode, err)
		}
	}
	s := lastStats
	rep.Staged = map[string]any{"direct_reads": s.DirectReads, "buffered_reads": s.BufferedReads, "fallbacks": s.Fallbacks, "cachestat": s.Cachestat}
	fmt.Println("verify: phxfs cold loads equal the file")
	return nil
}

// zero clears device memory through the copy engine (64 MiB at a time).
func zero(conn connector.Connector, mem connector.Memory) error {
	h, err := conn.AllocHost(64 * mib)
	if err != nil {
		return err
	}
	defer h.Close()
	clear(h.Bytes())
	s, err := conn.NewStream(0)
	if err != nil {
		return err
	}
	defer s.Close()
	for off := int64(0); off < mem.Size(); off += 64 * mib {
		if err := s.CopyToDevice(mem.Addr()+uint64(off), h.Bytes()[:min(64*mib, mem.Size()-off)]); err != nil {
			return err
		}
	}
	return s.Synchronize()
}

// warmRegister checks that the buffer can be registered at all.
func warmRegister(conn connector.Connector, mem connector.Memory, size int64) bool {
	l, err := phxfs.New(phxfs.Config{Connector: conn, Workers: 1, Transport: phxfs.Staged})
	if err != nil {
		return false
	}
	defer l.Close()
	if l.OpenDevice(0) != nil {
		return false
	}
	_, err = l.RegMem(0, mem.Addr(), size)
	return err == nil
}

// plan is the loader's request list: every tensor cut at 128 MiB, the data
// section laid out in the buffer as in the file.
func plan(ts []tensor, fd int, start int64, mem connector.Memory) []phxfs.Request {
	var rs []phxfs.Request
	for _, t := range ts {
		for o := t.Begin; o < t.End; o += chunk {
			n := min(chunk, t.End-o)
			rs = append(rs, phxfs.Request{Fd: fd, Device: 0, Buf: mem.Addr(), BufOffset: o, Len: n, FileOffset: start + o})
		}
	}
	return rs
}

func pinnedCeiling(rep *report, conn connector.Connector, mem connector.Memory, threads int) error {
	// One 1 GiB pinned buffer, one stream, whole-buffer copies.
	block := min(int64(gib), mem.Size()/(64<<10)*(64<<10))
	h, s, done, err := hostAndStream(conn, block)
	if err != nil {
		return err
	}
	defer done()
	n := min(mem.Size()/block, 8)
	copyAll := func() (time.Duration, error) {
		t0 := time.Now()
		for i := range n {
			if err := s.CopyToDevice(mem.Addr()+uint64(i*block), h.Bytes()); err != nil {
				return 0, err
			}
		}
		err := s.Synchronize()
		return time.Since(t0), err
	}
	copyAll()
	best := time.Duration(1 << 62)
	for range 2 {
		d, err := copyAll()
		if err != nil {
			return err
		}
		best = min(best, d)
	}
	rep.add(fmt.Sprintf("ceiling pinned H2D %dMiB copies", block/mib), n*block, best, "one stream")
	// threads streams, 4 MiB copies from per-thread pinned buffers (the
	// staged transport's shape without the reads).
	type lane struct {
		s connector.Stream
		b []byte
	}
	lanes := make([]lane, threads)
	for i := range lanes {
		st, err := conn.NewStream(0)
		if err != nil {
			return err
		}
		defer st.Close()
		lanes[i] = lane{st, h.Bytes()[int64(i)*4*mib%(block-4*mib+1):][:4*mib]}
	}
	total := n * block
	run := func() time.Duration {
		t0 := time.Now()
		var wg sync.WaitGroup
		for w := range lanes {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				ln := lanes[w]
				for off := int64(w) * 4 * mib; off < total; off += int64(threads) * 4 * mib {
					ln.s.CopyToDevice(mem.Addr()+uint64(off), ln.b)
				}
				ln.s.Synchronize()
			}(w)
		}
		wg.Wait()
		return time.Since(t0)
	}
	run()
	best = min(run(), run())
	rep.add(fmt.Sprintf("ceiling pinned H2D %d streams x 4MiB", threads), total, best, "")
	return nil
}

// verify copies back sampled ranges and every tensor's first and last 4 KiB
// and compares them with the file.
func verify(conn connector.Connector, mem connector.Memory, file string, start int64, ts []tensor) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	dataLen := ts[len(ts)-1].End
	type rng struct{ off, n int64 }
	var rs []rng
	for _, t := range ts {
		if t.End == t.Begin {
			continue
		}
		rs = append(rs, rng{t.Begin, min(4096, t.End-t.Begin)}, rng{max(t.Begin, t.End-4096), min(4096, t.End-t.Begin)})
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 64 {
		n := int64(mib)
		rs = append(rs, rng{r.Int64N(max(dataLen-n, 1)), min(n, dataLen)})
	}
	h, s, done, err := hostAndStream(conn, mib)
	if err != nil {
		return err
	}
	defer done()
	for _, x := range rs {
		got := h.Bytes()[:x.n]
		if err := s.CopyFromDevice(got, mem.Addr()+uint64(x.off)); err != nil {
			return err
		}
		if err := s.Synchronize(); err != nil {
			return err
		}
		want := make([]byte, x.n)
		if _, err := f.ReadAt(want, start+x.off); err != nil {
			return err
		}
		for i := range got {
			if got[i] != want[i] {
				return fmt.Errorf("data byte %d: GPU %#x, file %#x", x.off+int64(i), got[i], want[i])
			}
		}
	}
	return nil
}

// hostAndStream allocates a pinned host buffer and a copy stream on device
// 0; done releases both.
func hostAndStream(conn connector.Connector, size int64) (connector.HostMemory, connector.Stream, func(), error) {
	h, err := conn.AllocHost(size)
	if err != nil {
		return nil, nil, nil, err
	}
	s, err := conn.NewStream(0)
	if err != nil {
		h.Close()
		return nil, nil, nil, err
	}
	return h, s, func() { s.Close(); h.Close() }, nil
}

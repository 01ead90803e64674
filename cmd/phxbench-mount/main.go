// Command phxbench-mount measures a phxmount mount against its backing
// directory side by side in one run and prints the ratios (see
// scripts/bench-mount.sh, which mounts and calls it).
//
//	phxbench-mount -backing B -mount M [-reps 3] [-size-mb 256] [-files 10000] [-raw FILE]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// side is one of the two directories measured.
type side struct{ name, dir string }

// row is one benchmark: a measurement per side per repetition.
type row struct {
	Name    string               `json:"name"`
	Unit    string               `json:"unit"`    // "MB/s", "ops/s" (higher is better) or "s" (lower is better)
	Target  float64              `json:"target"`  // mount/backing ratio the design asks for (0: none)
	Higher  bool                 `json:"higher"`  // higher values are better
	Samples map[string][]float64 `json:"samples"` // side -> one value per repetition
	// Cold rows: side -> pages of the file resident in the guest's page
	// cache right before each sample (-1: could not be checked).
	Cold     bool               `json:"cold,omitempty"`
	Resident map[string][]int64 `json:"resident,omitempty"`
}

func (r *row) median(s string) float64 {
	v := append([]float64(nil), r.Samples[s]...)
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	return v[len(v)/2]
}

// ratio is mount relative to backing, as "how many times as good":
// throughput ratio for rates, time ratio (mount/backing) for times.
func (r *row) ratio() float64 {
	b, m := r.median("backing"), r.median("mount")
	if b == 0 || m == 0 {
		return 0
	}
	return m / b
}

func (r *row) ok() string {
	if r.Target == 0 {
		return ""
	}
	x := r.ratio()
	if (r.Higher && x >= r.Target) || (!r.Higher && x <= r.Target) {
		return "ok"
	}
	return "MISS"
}

func (r *row) add(s side, v float64) { r.Samples[s.name] = append(r.Samples[s.name], v) }

var (
	backing = flag.String("backing", "", "backing directory")
	mount   = flag.String("mount", "", "the mount of the backing directory")
	reps    = flag.Int("reps", 3, "repetitions (medians are reported)")
	sizeMB  = flag.Int("size-mb", 256, "size of the sequential file")
	nfiles  = flag.Int("files", 10000, "files for the metadata rows")
	nrand   = flag.Int("rand-ops", 40000, "4 KiB random reads per run")
	rawOut  = flag.String("raw", "", "write raw numbers (JSON) here")
	note    = flag.String("note", "", "free text stored with the raw numbers (e.g. passthrough state)")
)

func die(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "phxbench-mount: "+format+"\n", args...)
	os.Exit(1)
}

func dropCaches() {
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		die("drop caches (needs root): %v", err)
	}
}

func readAll(p string, bs int) int64 {
	f, err := os.Open(p)
	if err != nil {
		die("%v", err)
	}
	defer f.Close()
	buf := make([]byte, bs)
	var n int64
	for {
		m, err := f.Read(buf)
		n += int64(m)
		if err != nil || m == 0 {
			return n
		}
	}
}

func mbps(bytes int64, d time.Duration) float64 { return float64(bytes) / 1e6 / d.Seconds() }

// The rows, by index into newRows().
const (
	rowCold = iota
	rowHot
	rowRand
	rowWrite
	rowCreate
	rowStat
	rowReaddir
	rowUnlink
)

func newRows(vm bool) []*row {
	rows := []*row{
		{Name: coldName(vm), Unit: "MB/s", Target: 0.97, Higher: true, Cold: true},
		{Name: "seq read 1 MiB, page-cache hot", Unit: "MB/s", Target: 0.97, Higher: true},
		{Name: "rand read 4 KiB, hot", Unit: "ops/s", Target: 0.95, Higher: true},
		{Name: "seq write 1 MiB + fsync", Unit: "MB/s", Target: 0, Higher: true},
		{Name: fmt.Sprintf("create %d files", *nfiles), Unit: "s", Target: 3, Higher: false},
		{Name: fmt.Sprintf("stat %d files", *nfiles), Unit: "s", Target: 1.5, Higher: false},
		{Name: fmt.Sprintf("readdir %d files", *nfiles), Unit: "s", Target: 2, Higher: false},
		{Name: fmt.Sprintf("unlink %d files", *nfiles), Unit: "s", Target: 3, Higher: false},
	}
	for _, r := range rows {
		r.Samples = map[string][]float64{}
		if r.Cold {
			r.Resident = map[string][]int64{}
		}
	}
	return rows
}

// writeSeqFile writes the sequential file once, on the backing side.
func writeSeqFile(p string, size int64) {
	f, err := os.Create(p)
	if err != nil {
		die("%v", err)
	}
	buf := make([]byte, 1<<20)
	rand.New(rand.NewSource(1)).Read(buf)
	for i := int64(0); i < size>>20; i++ {
		if _, err := f.Write(buf); err != nil {
			die("write: %v", err)
		}
	}
	f.Sync()
	f.Close()
}

func main() {
	flag.Parse()
	if *backing == "" || *mount == "" {
		die("need -backing and -mount")
	}
	sides := []side{{"backing", *backing}, {"mount", *mount}}
	size := int64(*sizeMB) << 20
	const work = "phxbench"
	bdir := filepath.Join(*backing, work)
	os.RemoveAll(bdir)
	if err := os.MkdirAll(bdir, 0755); err != nil {
		die("%v", err)
	}
	defer os.RemoveAll(bdir)
	seq := filepath.Join(work, "seq")
	writeSeqFile(filepath.Join(*backing, seq), size)
	// A cold read through either side may be served from the backing
	// file's cache or the FUSE inode's: both are checked before each.
	coldPaths := []string{filepath.Join(*backing, seq), filepath.Join(*mount, seq)}

	cpuinfo, _ := os.ReadFile("/proc/cpuinfo")
	vm := underVM(string(cpuinfo))
	rows := newRows(vm)
	wbuf := make([]byte, 1<<20)
	rand.New(rand.NewSource(2)).Read(wbuf)
	for rep := 0; rep < *reps; rep++ {
		// Alternate which side goes first so that neither always benefits.
		order := sides
		if rep%2 == 1 {
			order = []side{sides[1], sides[0]}
		}
		for _, s := range order {
			dataRows(rows, s, rep, filepath.Join(s.dir, seq), coldPaths, size, wbuf)
		}
		for _, s := range order {
			metaRows(rows, s, filepath.Join(s.dir, work, "many-"+s.name))
		}
	}
	// The control protocol's rows (ioctl read through the mount against
	// phxfs called directly) are cmd/phxbench-ioctl's table, which
	// scripts/bench-mount.sh prints after this one against the same mount.
	printTable(rows, vm)
	writeRaw(rows)
}

// dataRows measures the read and write rows on one side.
func dataRows(rows []*row, s side, rep int, p string, coldPaths []string, size int64, wbuf []byte) {
	if err := primeHost(coldPaths[0]); err != nil {
		die("read %s with O_DIRECT: %v", coldPaths[0], err)
	}
	rows[rowCold].Resident[s.name] = append(rows[rowCold].Resident[s.name], dropCold(coldPaths))
	t0 := time.Now()
	n := readAll(p, 1<<20)
	rows[rowCold].add(s, mbps(n, time.Since(t0)))
	t0 = time.Now()
	n = readAll(p, 1<<20)
	rows[rowHot].add(s, mbps(n, time.Since(t0)))
	rows[rowRand].add(s, randReads(p, size, int64(rep)))

	wp := filepath.Join(filepath.Dir(p), "w-"+s.name)
	t0 = time.Now()
	w, err := os.Create(wp)
	if err != nil {
		die("%v", err)
	}
	for i := int64(0); i < size>>20; i++ {
		if _, err := w.Write(wbuf); err != nil {
			die("write: %v", err)
		}
	}
	w.Sync()
	w.Close()
	rows[rowWrite].add(s, mbps(size, time.Since(t0)))
	os.Remove(wp)
}

// randReads times 4 KiB preads at random offsets of a hot file (ops/s).
func randReads(p string, size, seed int64) float64 {
	f, err := os.Open(p)
	if err != nil {
		die("%v", err)
	}
	defer f.Close()
	rng := rand.New(rand.NewSource(seed))
	buf := make([]byte, 4096)
	blocks := size / 4096
	for i := 0; i < *nrand/8; i++ { // warm-up, not measured
		unix.Pread(int(f.Fd()), buf, rng.Int63n(blocks)*4096)
	}
	t0 := time.Now()
	for i := 0; i < *nrand; i++ {
		if _, err := unix.Pread(int(f.Fd()), buf, rng.Int63n(blocks)*4096); err != nil {
			die("pread: %v", err)
		}
	}
	return float64(*nrand) / time.Since(t0).Seconds()
}

// metaRows times create, stat, readdir and unlink of many files in d.
func metaRows(rows []*row, s side, d string) {
	os.Mkdir(d, 0755)
	names := make([]string, *nfiles)
	for i := range names {
		names[i] = filepath.Join(d, "f"+strconv.Itoa(i))
	}
	timed := func(i int, fn func()) {
		t0 := time.Now()
		fn()
		rows[i].add(s, time.Since(t0).Seconds())
	}
	timed(rowCreate, func() {
		for _, nm := range names {
			fd, err := unix.Open(nm, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0644)
			if err != nil {
				die("create: %v", err)
			}
			unix.Close(fd)
		}
	})
	timed(rowStat, func() {
		var st unix.Stat_t
		for _, nm := range names {
			if err := unix.Lstat(nm, &st); err != nil {
				die("stat: %v", err)
			}
		}
	})
	timed(rowReaddir, func() {
		df, err := os.Open(d)
		if err != nil {
			die("%v", err)
		}
		got, err := df.Readdirnames(-1)
		df.Close()
		if err != nil || len(got) != *nfiles {
			die("readdir: %d names, %v", len(got), err)
		}
	})
	timed(rowUnlink, func() {
		for _, nm := range names {
			if err := unix.Unlink(nm); err != nil {
				die("unlink: %v", err)
			}
		}
	})
	os.Remove(d)
}

func printTable(rows []*row, vm bool) {
	fmt.Printf("%-38s %12s %12s %8s %8s %s\n", "benchmark (median of "+strconv.Itoa(*reps)+")", "backing", "mount", "ratio", "target", "")
	for _, r := range rows {
		fmt.Println(formatRow(r))
	}
	fmt.Println("ratio: mount/backing; for rates higher is better, for times (s) lower is better")
	fmt.Println(hostCacheNote(vm))
}

// formatRow is one line of the table; a cold row whose samples were not
// all cold on both sides shows why instead of a ratio.
func formatRow(r *row) string {
	b, m := fmtv(r.median("backing"), r.Unit), fmtv(r.median("mount"), r.Unit)
	if r.Cold {
		if cold, why := r.coldVerdict(); !cold {
			return fmt.Sprintf("%-38s %12s %12s  %s", r.Name, b, m, why)
		}
	}
	tgt := ""
	if r.Target != 0 {
		if r.Higher {
			tgt = fmt.Sprintf(">=%.2f", r.Target)
		} else {
			tgt = fmt.Sprintf("<=%.1f", r.Target)
		}
	}
	return fmt.Sprintf("%-38s %12s %12s %7.3fx %8s %s", r.Name, b, m, r.ratio(), tgt, r.ok())
}

func writeRaw(rows []*row) {
	if *rawOut == "" {
		return
	}
	b, _ := json.MarshalIndent(map[string]any{"time": time.Now().Format(time.RFC3339), "note": *note, "rows": rows}, "", "  ")
	if err := os.WriteFile(*rawOut, b, 0644); err != nil {
		die("%v", err)
	}
	fmt.Printf("raw numbers: %s\n", *rawOut)
}

func fmtv(v float64, unit string) string {
	switch unit {
	case "s":
		return fmt.Sprintf("%.3f s", v)
	case "ops/s":
		return fmt.Sprintf("%.0f/s", v)
	}
	return fmt.Sprintf("%.0f MB/s", v)
}

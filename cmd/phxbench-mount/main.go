// Command phxbench-mount measures a phxmount mount against its backing
// directory side by side in one run and prints the ratios (see
// scripts/bench-mount.sh, which mounts each configuration and calls it),
// and combines the raw numbers of several configurations into one table.
//
//	phxbench-mount -backing B -mount M [-config LABEL] [-passthrough on|off] [-cache auto|exclusive|off]
//	               [-reps 4] [-size-mb 256] [-files 10000] [-raw FILE]
//	phxbench-mount -summary RAW.json...
package main

import (
	"flag"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
)

// side is one of the two directories measured.
type side struct{ name, dir string }

// row is one benchmark: a measurement per side per repetition.
type row struct {
	Name    string               `json:"name"`
	Unit    string               `json:"unit"`    // "MB/s", "ops/s" (higher is better), "s" or "ms" (lower is better)
	Target  float64              `json:"target"`  // mount/backing ratio the design asks for (0: none); ms for staleness
	Higher  bool                 `json:"higher"`  // higher values are better
	Samples map[string][]float64 `json:"samples"` // side -> one value per repetition
	// Cold rows: side -> pages of the file resident in the guest's page
	// cache right before each sample (-1: could not be checked).
	Cold     bool               `json:"cold,omitempty"`
	Resident map[string][]int64 `json:"resident,omitempty"`
	// MountOnly rows (staleness) have no backing side: the mount's median
	// is the figure, compared with Target directly.
	MountOnly bool `json:"mount_only,omitempty"`
}

// median of a side's samples (the mean of the middle two for an even
// count: with the sides alternating which goes first, an even number of
// repetitions gives each side as many first places, and the slower
// second places of both count alike).
func (r *row) median(s string) float64 {
	v := append([]float64(nil), r.Samples[s]...)
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
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

// figure is what is compared with the target: the ratio, or the mount's
// median for a mount-only row.
func (r *row) figure() float64 {
	if r.MountOnly {
		return r.median("mount")
	}
	return r.ratio()
}

func (r *row) ok() string {
	if r.Target == 0 {
		return ""
	}
	x := r.figure()
	if (r.Higher && x >= r.Target) || (!r.Higher && x <= r.Target) {
		return "ok"
	}
	return "MISS"
}

func (r *row) add(s side, v float64) { r.Samples[s.name] = append(r.Samples[s.name], v) }

var (
	backing     = flag.String("backing", "", "backing directory")
	mount       = flag.String("mount", "", "the mount of the backing directory")
	config      = flag.String("config", "", "label of the mount's configuration (the summary's column)")
	passthrough = flag.String("passthrough", "", "whether the mount's reads and writes use kernel passthrough: on or off (sets the read targets)")
	cacheMode   = flag.String("cache", "auto", "the mount's -o cache mode (sets the staleness target)")
	reps        = flag.Int("reps", 4, "repetitions (medians are reported; even: each side goes first as often)")
	sizeMB      = flag.Int("size-mb", 256, "size of the sequential file")
	nfiles      = flag.Int("files", 10000, "files for the metadata rows")
	nrand       = flag.Int("rand-ops", 40000, "4 KiB random reads per hot run")
	nrandCold   = flag.Int("rand-cold-ops", 2000, "4 KiB random reads per cold run")
	nstale      = flag.Int("stale-samples", 9, "staleness samples (3 where the mode is not expected to see backing changes quickly)")
	rawOut      = flag.String("raw", "", "write raw numbers (JSON) here")
	note        = flag.String("note", "", "free text stored with the raw numbers (e.g. passthrough state)")
	summary     = flag.Bool("summary", false, "print one table from the raw files named as arguments")
)

func die(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "phxbench-mount: "+format+"\n", args...)
	os.Exit(1)
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
	if *summary {
		printSummary(flag.Args())
		return
	}
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
	rows := newRows(vm, *passthrough == "on", *cacheMode)
	wbuf := make([]byte, 1<<20)
	rand.New(rand.NewSource(2)).Read(wbuf)
	for rep := 0; rep < *reps; rep++ {
		// Alternate which side goes first so that neither always benefits.
		order := sides
		if rep%2 == 1 {
			order = []side{sides[1], sides[0]}
		}
		// The first cold read after the metadata and write rows is slow
		// whichever side makes it (the host is still writing back); an
		// unmeasured one takes that, so neither side does.
		settleCold(coldPaths)
		for _, s := range order {
			dataRows(rows, s, rep, filepath.Join(s.dir, seq), coldPaths, size, wbuf)
		}
		for _, s := range order {
			metaRows(rows, s, filepath.Join(s.dir, work, "many-"+s.name))
		}
	}
	staleRow(rows[rowStale], filepath.Join(*backing, work), filepath.Join(*mount, work))
	// The control protocol's rows (ioctl read through the mount against
	// phxfs called directly) are cmd/phxbench-ioctl's table, which
	// scripts/bench-mount.sh prints after this one against the same mount.
	printTable(rows, vm)
	writeRaw(rows)
}

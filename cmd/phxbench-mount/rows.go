package main

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The rows, by index into newRows().
const (
	rowCold = iota
	rowHot
	rowRandHot
	rowRandCold
	rowWrite
	rowCreate
	rowStat
	rowReaddir
	rowUnlink
	rowStale
)

// newRows makes the table. The read targets are the issue's: with kernel
// passthrough the mount must read as fast as the backing directory; on the
// classic path (every read through the daemon) a little less.
func newRows(vm, pt bool, cache string) []*row {
	seqCold, seqHot, randHot, randCold := 0.8, 0.9, 0.8, 0.5
	if pt {
		seqCold, seqHot, randHot, randCold = 0.95, 0.95, 0.95, 0.5
	}
	stale := 0.0
	if cache == "auto" {
		stale = 100
	}
	rows := []*row{
		{Name: coldName(vm), Unit: "MB/s", Target: seqCold, Higher: true, Cold: true},
		{Name: "seq read 1 MiB, page-cache hot", Unit: "MB/s", Target: seqHot, Higher: true},
		{Name: "rand read 4 KiB, hot", Unit: "ops/s", Target: randHot, Higher: true},
		{Name: "rand read 4 KiB, cold", Unit: "ops/s", Target: randCold, Higher: true, Cold: true},
		{Name: "seq write 1 MiB + fsync", Unit: "MB/s", Target: 0, Higher: true},
		{Name: fmt.Sprintf("create %d files", *nfiles), Unit: "s", Target: 3, Higher: false},
		{Name: fmt.Sprintf("stat %d files", *nfiles), Unit: "s", Target: 1.5, Higher: false},
		{Name: fmt.Sprintf("readdir %d files", *nfiles), Unit: "s", Target: 2, Higher: false},
		{Name: fmt.Sprintf("unlink %d files", *nfiles), Unit: "s", Target: 3, Higher: false},
		{Name: "staleness: backing write -> stat+read", Unit: "ms", Target: stale, Higher: false, MountOnly: true},
	}
	for _, r := range rows {
		r.Samples = map[string][]float64{}
		if r.Cold {
			r.Resident = map[string][]int64{}
		}
	}
	return rows
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

// makeCold leaves the file host-warm and guest-cold (cold.go) and records
// what was still resident for row r.
func makeCold(r *row, s side, coldPaths []string) {
	if err := primeHost(coldPaths[0]); err != nil {
		die("read %s with O_DIRECT: %v", coldPaths[0], err)
	}
	r.Resident[s.name] = append(r.Resident[s.name], dropCold(coldPaths))
}

// settleCold reads the file cold once, unmeasured.
func settleCold(coldPaths []string) {
	if err := primeHost(coldPaths[0]); err != nil {
		die("read %s with O_DIRECT: %v", coldPaths[0], err)
	}
	dropCold(coldPaths)
	readAll(coldPaths[0], 1<<20)
}

// dataRows measures the read and write rows on one side.
func dataRows(rows []*row, s side, rep int, p string, coldPaths []string, size int64, wbuf []byte) {
	makeCold(rows[rowCold], s, coldPaths)
	t0 := time.Now()
	n := readAll(p, 1<<20)
	rows[rowCold].add(s, mbps(n, time.Since(t0)))
	t0 = time.Now()
	n = readAll(p, 1<<20)
	rows[rowHot].add(s, mbps(n, time.Since(t0)))
	rows[rowRandHot].add(s, randReads(p, size, int64(rep), *nrand, *nrand/8))
	makeCold(rows[rowRandCold], s, coldPaths)
	rows[rowRandCold].add(s, randReads(p, size, int64(rep)+100, *nrandCold, 0))

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

// randReads times ops 4 KiB preads at random offsets of the file (ops/s),
// after warm unmeasured ones.
func randReads(p string, size, seed int64, ops, warm int) float64 {
	f, err := os.Open(p)
	if err != nil {
		die("%v", err)
	}
	defer f.Close()
	rng := rand.New(rand.NewSource(seed))
	buf := make([]byte, 4096)
	blocks := size / 4096
	for i := 0; i < warm; i++ {
		unix.Pread(int(f.Fd()), buf, rng.Int63n(blocks)*4096)
	}
	t0 := time.Now()
	for i := 0; i < ops; i++ {
		if _, err := unix.Pread(int(f.Fd()), buf, rng.Int63n(blocks)*4096); err != nil {
			die("pread: %v", err)
		}
	}
	return float64(ops) / time.Since(t0).Seconds()
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

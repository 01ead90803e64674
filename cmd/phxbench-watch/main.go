// Command phxbench-watch measures how often a busy neighbour overflows
// the fanotify queue of a cache=auto mount: it mounts DIR/watched with
// phxmount (cached, idle), runs a neighbour that creates and removes files
// as fast as it can in DIR/neighbour (the same file system, outside the
// mount's tree: its events reach the mount's filesystem mark and are
// dropped as outside), and reports the mount's queue overflows per minute
// (user.phx.info watch_overflows) with the neighbour's rate and the
// machine's load. Each overflow invalidates everything the kernel caches
// of the mount (correct, but the cache is refilled). Run as root; a
// measurement, not a test (docs/perf-notes.md).
//
//	phxbench-watch [-bin bin/phxmount] [-dir /var/tmp] [-seconds 60] [-workers 2] [-files 1000]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

var (
	bin     = flag.String("bin", "bin/phxmount", "phxmount binary")
	dir     = flag.String("dir", os.TempDir(), "a directory on the file system to measure")
	seconds = flag.Int("seconds", 60, "how long the neighbour runs")
	workers = flag.Int("workers", 2, "neighbour goroutines")
	files   = flag.Int("files", 1000, "files the mount has looked up (its cached tree)")
)

func main() {
	flag.Parse()
	base, err := os.MkdirTemp(*dir, "phxbench-watch-")
	check(err)
	defer os.RemoveAll(base)
	backing, mnt, nb := filepath.Join(base, "watched"), filepath.Join(base, "mnt"), filepath.Join(base, "neighbour")
	for _, d := range []string{backing, mnt, nb} {
		check(os.Mkdir(d, 0755))
	}
	for i := 0; i < *files; i++ {
		check(os.WriteFile(filepath.Join(backing, fmt.Sprintf("f%d", i)), []byte("x"), 0644))
	}
	daemon := exec.Command(*bin, backing, mnt)
	daemon.Stderr = os.Stderr
	check(daemon.Start())
	defer func() {
		unix.Unmount(mnt, unix.MNT_DETACH)
		daemon.Wait()
	}()
	check(exec.Command(*bin, "wait", "--timeout", "15", mnt).Run())
	for i := 0; i < *files; i++ {
		var st unix.Stat_t
		unix.Stat(filepath.Join(mnt, fmt.Sprintf("f%d", i)), &st) // cached for the hour
	}
	fmt.Printf("kernel %s, %d CPUs, fanotify queue %s events, %d neighbour goroutines for %d s; load average before: %s\n",
		kernel(), runtime.NumCPU(), readTrim("/proc/sys/fs/fanotify/max_queued_events"), *workers, *seconds, loadavg())
	before := info(mnt)
	ops := neighbour(nb, time.Duration(*seconds)*time.Second)
	after := info(mnt)
	minutes := float64(*seconds) / 60
	over := after["watch_overflows"] - before["watch_overflows"]
	fmt.Printf("neighbour: %.0f creates+removes/s; load average after: %s\n", float64(ops)/float64(*seconds), loadavg())
	fmt.Printf("mount: %d overflows (%.1f per minute); %d neighbour events read and dropped, %d about its own inodes, %d invalidations\n",
		over, float64(over)/minutes, after["watch_outside"]-before["watch_outside"], after["watch_events"]-before["watch_events"],
		after["watch_invalidations"]-before["watch_invalidations"])
}

// neighbour creates and removes files in dir from *workers goroutines
// for d, and returns how many it created (and removed).
func neighbour(dir string, d time.Duration) int64 {
	var ops atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for g := 0; g < *workers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				p := filepath.Join(dir, fmt.Sprintf("n%d-%d", g, i)) // distinct names: no event merges with another
				fd, err := unix.Open(p, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0644)
				if err == nil {
					unix.Close(fd)
					unix.Unlink(p)
					ops.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return ops.Load()
}

// info is the mount's user.phx.info counters.
func info(mnt string) map[string]int64 {
	buf := make([]byte, 16384)
	n, err := unix.Getxattr(mnt, "user.phx.info", buf)
	check(err)
	out := map[string]int64{}
	for _, l := range strings.Split(string(buf[:n]), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			if x, err := strconv.ParseInt(v, 10, 64); err == nil {
				out[k] = x
			}
		}
	}
	return out
}

func kernel() string {
	var u unix.Utsname
	unix.Uname(&u)
	return unix.ByteSliceToString(u.Release[:])
}

// loadavg is /proc/loadavg's 1-minute figure: how busy the machine was
// (the reader overflows when it is starved of CPU).
func loadavg() string {
	f := strings.Fields(readTrim("/proc/loadavg"))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

func readTrim(p string) string {
	b, _ := os.ReadFile(p)
	return strings.TrimSpace(string(b))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "phxbench-watch:", err)
		os.Exit(1)
	}
}

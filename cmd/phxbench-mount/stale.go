package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// The staleness row: the time from a write on the backing directory (not
// through the mount) until stat and read through the mount both show it.
// Before each sample the mount has the old file cached (read twice so
// that the pages are kept, then stat); the write changes size and bytes.

// staleCap ends a sample that never sees the change (cache=exclusive
// watches nothing, by design; cache=off waits out its 1 s timeouts).
const staleCap = 2 * time.Second

// staleRow measures the staleness samples into r (milliseconds; a sample
// that hit staleCap records the cap).
func staleRow(r *row, bdir, mdir string) {
	n := *nstale
	if *cacheMode != "auto" {
		n = min(n, 3)
	}
	bp, mp := filepath.Join(bdir, "stale"), filepath.Join(mdir, "stale")
	if err := os.WriteFile(bp, []byte("generation 0"), 0644); err != nil {
		die("%v", err)
	}
	for i := 1; i <= n; i++ {
		// Read twice (the second open keeps the pages), then stat: a read
		// marks the kernel's atime stale, so a stat right after one asks
		// the daemon; this one leaves the attributes cached.
		os.ReadFile(mp)
		os.ReadFile(mp)
		var st unix.Stat_t
		unix.Stat(mp, &st)
		want := []byte(fmt.Sprintf("generation %d %s", i, bytes.Repeat([]byte("x"), i)))
		if err := os.WriteFile(bp, want, 0644); err != nil {
			die("%v", err)
		}
		r.add(side{name: "mount"}, float64(seen(mp, want).Microseconds())/1000)
	}
}

// seen polls path through the mount until stat reports want's size and a
// read returns want, and says how long that took (staleCap at most).
func seen(path string, want []byte) time.Duration {
	t0 := time.Now()
	for {
		d := time.Since(t0)
		if d >= staleCap {
			return staleCap
		}
		var st unix.Stat_t
		if unix.Stat(path, &st) == nil && st.Size == int64(len(want)) {
			if got, err := os.ReadFile(path); err == nil && bytes.Equal(got, want) {
				return time.Since(t0)
			}
		}
		time.Sleep(50 * time.Microsecond)
	}
}

package integration

// The watcher's two load cases: a fanotify queue overflow (a real burst of
// backing-side changes larger than the queue) invalidates everything, and
// writes through the mount cause no invalidations at all.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

const queueSysctl = "/proc/sys/fs/fanotify/max_queued_events"

// withSmallQueue starts a daemon whose fanotify group holds queue events
// at most: a group takes the limit from the sysctl when it is made, which
// is restored once the daemon is up.
func withSmallQueue(t *testing.T, queue int, opts ...mountOption) *daemon {
	t.Helper()
	requireMountEnv(t)
	old, err := os.ReadFile(queueSysctl)
	if err != nil {
		t.Fatalf("the fanotify queue limit: %v", err)
	}
	restore := func() { os.WriteFile(queueSysctl, old, 0) }
	defer restore()
	must(t, os.WriteFile(queueSysctl, []byte(strconv.Itoa(queue)), 0))
	return startDaemon(t, opts...)
}

// burst creates n files under dir from 4 goroutines, as fast as they can.
func burst(t *testing.T, dir string, n int) {
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 4 {
				fd, err := unix.Open(filepath.Join(dir, fmt.Sprintf("b%d", i)), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0644)
				if err == nil {
					unix.Close(fd)
				}
			}
		}()
	}
	wg.Wait()
}

// TestFanotifyQueueOverflow: with a queue of 64 events, bursts of
// thousands of creates on the backing side overflow it; the watcher then
// invalidates every name, negative name, attribute and page the kernel
// keeps, so that changes whose events were lost show anyway: names looked
// up (and found missing) before the burst and created at its end, a mode
// and the bytes of a file changed at its end.
func TestFanotifyQueueOverflow(t *testing.T) {
	d := withSmallQueue(t, 64)
	b, m := d.Backing, d.Mnt
	must(t, os.Mkdir(b+"/burst", 0755))
	must(t, os.WriteFile(b+"/f", []byte("before"), 0644))
	const late = 50
	var overflows int64
	for round := 0; round < 10 && overflows == 0; round++ {
		for i := 0; i < late; i++ {
			look(fmt.Sprintf("%s/late%d-%d", m, round, i), false) // negative entries
		}
		look(m+"/f", true)
		look(m+"/f", true)
		burst(t, fmt.Sprintf("%s/burst", b), 4000)
		for i := 0; i < late; i++ {
			must(t, os.WriteFile(fmt.Sprintf("%s/late%d-%d", b, round, i), []byte("late"), 0644))
		}
		must(t, os.WriteFile(b+"/f", []byte(fmt.Sprintf("after %d", round)), 0600))
		must(t, os.Chmod(b+"/f", 0600))
		eventually(t, "late names, f", func() string {
			for i := 0; i < late; i++ {
				if msg := sameAsBacking(b, m, fmt.Sprintf("late%d-%d", round, i)); msg != "" {
					return msg
				}
			}
			return sameAsBacking(b, m, "f")
		})
		overflows = infoCounter(t, m, "watch_overflows")
	}
	if overflows == 0 {
		t.Fatalf("10 bursts of 4000 creates did not overflow a queue of 64 events (watch_events %d)", infoCounter(t, m, "watch_events"))
	}
	if got, want := len(listDir(m+"/burst")), len(listDir(b+"/burst")); got != want {
		t.Errorf("after the overflow the mount lists %d names in burst/, the backing directory %d", got, want)
	}
	if !strings.Contains(d.Stderr(), "overflowed") {
		t.Errorf("the daemon did not log the overflow:\n%s", d.Stderr())
	}
}

// TestWritesThroughTheMountCauseNoInvalidations: writes made through the
// mount reach fanotify too (from the daemon on the classic path, from the
// writing process with passthrough); none may become a notification, so
// that a stream of small writes costs the kernel nothing extra.
func TestWritesThroughTheMountCauseNoInvalidations(t *testing.T) {
	eachPassthrough(t, func(t *testing.T, mode string, d *daemon) {
		p := filepath.Join(d.Mnt, "log")
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0644)
		must(t, err)
		before := infoCounter(t, d.Mnt, "watch_invalidations")
		const writes = 5000
		for i := 0; i < writes; i++ {
			if _, err := f.Write([]byte{byte('a' + i%26)}); err != nil {
				t.Fatal(err)
			}
		}
		must(t, f.Close())
		st := statOf(t, p)
		if st.Size != writes {
			t.Fatalf("size %d after %d one-byte writes", st.Size, writes)
		}
		// Nothing per write, nor for the close (the passthrough file's
		// last reference may be dropped by the writer rather than the
		// daemon); one spare for an event of the test process elsewhere.
		if n := infoCounter(t, d.Mnt, "watch_invalidations") - before; n > 1 {
			t.Errorf("%d one-byte writes through the mount (%s) caused %d invalidations; want none", writes, mode, n)
		}
		if own := infoCounter(t, d.Mnt, "watch_own"); own == 0 {
			t.Errorf("watch_own is 0: the writes' events were not recognised as the mount's own")
		}
	})
}

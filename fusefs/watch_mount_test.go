package fusefs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
)

// The watcher on a real mount: the backing side is changed by another
// process (the daemon is this test process, and its own changes make no
// invalidations), and what the mount shows is checked by stat and read.

// changeBacking runs a shell script as another process.
func changeBacking(t *testing.T, script string) {
	t.Helper()
	if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v %s", script, err, out)
	}
}

// within2s polls check until it returns "" or 2 s (the README's bound)
// pass.
func within2s(t *testing.T, what string, check func() string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		msg := check()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen through the mount within 2 s: %s", what, msg)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sizeIs checks what the mount shows of p: its size and, with data, its
// bytes.
func sizeIs(p string, want []byte, data bool) string {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return err.Error()
	}
	if st.Size != int64(len(want)) {
		return fmt.Sprintf("size %d, want %d", st.Size, len(want))
	}
	if data {
		if b, err := os.ReadFile(p); err != nil || !bytes.Equal(b, want) {
			return fmt.Sprintf("read %q, %v; want %q", b, err, want)
		}
	}
	return ""
}

// armedFault makes the reads of the watcher's event source fail once
// armed.
type armedFault struct {
	eventSource
	armed *atomic.Bool
}

func (s armedFault) Read(b []byte) (int, error) {
	n, err := s.eventSource.Read(b)
	if s.armed.Load() {
		return 0, unix.EIO
	}
	return n, err
}

// TestWatcherReadErrorFallsBack: when reading events fails on a mount,
// the backing file system falls back to revalidation and says so (the
// log, the cache report); names and attributes the kernel cached since,
// positive and negative, still show a backing-side change within 2 s.
func TestWatcherReadErrorFallsBack(t *testing.T) {
	var armed atomic.Bool
	wrapEventSource = func(s eventSource) eventSource { return armedFault{s, &armed} }
	t.Cleanup(func() { wrapEventSource = nil })
	l, logs := logtest.NewNullLogger()
	b, m, f := mountForTest(t, Options{Cache: CacheAuto, Log: logrus.NewEntry(l)})
	if !f.watch.active() {
		t.Skipf("skipped: no fanotify group: %s", f.watch.initWhy)
	}
	changeBacking(t, "printf old > "+b+"/f")
	armed.Store(true)
	changeBacking(t, "touch "+b+"/wake") // an event, whose read fails
	within2s(t, "the watcher's failure", func() string {
		if ci := f.RootCache(); !ci.Watch.Failed || ci.Class != client.CacheRevalidate {
			return fmt.Sprintf("class %s, watch %+v", ci.Class, ci.Watch)
		}
		return ""
	})
	time.Sleep(50 * time.Millisecond) // the invalidation of everything
	// Cached after the failure: with the watcher's hour these would stay.
	if msg := sizeIs(m+"/f", []byte("old"), true); msg != "" {
		t.Fatal(msg)
	}
	if _, err := os.Stat(m + "/new"); !os.IsNotExist(err) {
		t.Fatalf("new: %v", err)
	}
	changeBacking(t, "printf changed > "+b+"/f; echo n > "+b+"/new")
	within2s(t, "a change after the failure", func() string {
		if msg := sizeIs(m+"/f", []byte("changed"), true); msg != "" {
			return "f: " + msg
		}
		if _, err := os.Stat(m + "/new"); err != nil {
			return "new: " + err.Error()
		}
		return ""
	})
	said := false
	for _, e := range logs.AllEntries() {
		said = said || e.Level == logrus.ErrorLevel && strings.Contains(e.Message, "fall back to revalidation")
	}
	if !said {
		t.Errorf("the log does not say so: %d entries", len(logs.AllEntries()))
	}
}

// waitUntil polls cond for up to d.
func waitUntil(d time.Duration, cond func() bool) {
	for deadline := time.Now().Add(d); !cond() && time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
	}
}

// holdReply holds back the reply to the next LOOKUP of name until the
// returned release is called; held is closed once the reply is held.
func holdReply(t *testing.T, name string) (held <-chan struct{}, release func()) {
	h, r := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func(n string) {
		if n != name {
			return
		}
		once.Do(func() {
			close(h)
			<-r
		})
	}
	lookupRepliedHook.Store(&hook)
	var rel sync.Once
	release = func() { rel.Do(func() { close(r) }) }
	t.Cleanup(func() {
		release()
		lookupRepliedHook.Store(nil)
	})
	return h, release
}

// TestInvalidationRacingAReply: a backing-side change whose event is
// applied while the reply to a LOOKUP read before the change is still on
// its way to the kernel must not let that reply's answer stay: a name
// renamed over (an entry invalidation) and a file rewritten in place (an
// inode invalidation of an inode the kernel does not know yet).
func TestInvalidationRacingAReply(t *testing.T) {
	b, m, f := mountForTest(t, Options{Cache: CacheAuto})
	if !f.watch.active() {
		t.Skipf("skipped: no fanotify group: %s", f.watch.initWhy)
	}
	changeBacking(t, "mkdir "+b+"/d && printf old > "+b+"/d/x && printf newer > "+b+"/d/y && printf old > "+b+"/d/f")
	if _, err := os.Stat(m + "/d"); err != nil {
		t.Fatal(err)
	}
	race := func(name, change string) {
		t.Helper()
		held, release := holdReply(t, name)
		done := make(chan struct{})
		go func() {
			defer close(done)
			var st unix.Stat_t
			unix.Stat(filepath.Join(m, "d", name), &st) // the first lookup of name
		}()
		<-held
		events := f.watch.events.Load()
		changeBacking(t, change)
		// Let the watcher meet the held reply: its event read, then its
		// round of invalidations sent (or waiting for the reply).
		waitUntil(2*time.Second, func() bool { return f.watch.events.Load() > events })
		for events = 0; events != f.watch.events.Load(); time.Sleep(100 * time.Millisecond) {
			events = f.watch.events.Load() // until all of the change's events are read
		}
		invals := f.watch.invals.Load()
		waitUntil(500*time.Millisecond, func() bool { return f.watch.invals.Load() > invals })
		release()
		<-done
	}
	race("x", "mv "+b+"/d/y "+b+"/d/x")
	within2s(t, "a rename over a name whose lookup reply was on its way", func() string {
		return sizeIs(m+"/d/x", []byte("newer"), true)
	})
	race("f", "printf rewritten-in-place > "+b+"/d/f")
	within2s(t, "a rewrite of a file whose lookup reply was on its way", func() string {
		return sizeIs(m+"/d/f", []byte("rewritten-in-place"), false)
	})
}

package fusefs

import (
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/phxmount/phxmount/client"
)

// TestControlObserveAndCounters: every data ioctl is observed once with
// its command's name and a duration, other commands are not, and Counters
// is what INFO carries.
func TestControlObserveAndCounters(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	e := newCtlEnv(t, false, false)
	e.s.cfg.ObserveIoctl = func(command string, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if d <= 0 {
			t.Errorf("%s took %v", command, d)
		}
		seen = append(seen, command)
	}
	f, _ := patternFile(t, 1<<20, os.O_RDWR)
	m := e.alloc(t, 1<<20)
	r := e.registered(t, f, m)
	if n, errno := e.read(e.me, f, client.IOReq{ID: r.ID, Length: 4096}); errno != 0 || n != 4096 {
		t.Fatalf("READ = %d, %v", n, errno)
	}
	reqs := []client.IOReq{{ID: r.ID, Length: 100}, {ID: r.ID, BufOffset: 100, Length: 100, FileOffset: 100}}
	for _, write := range []bool{false, true} {
		in, err := client.EncodeBatch(4, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if _, errno := e.ioctl(e.me, f, client.CmdBatch(write, 4), in); errno != 0 {
			t.Fatalf("BATCH write=%v: %v", write, errno)
		}
	}
	in := e.info(t, f)
	if !slices.Equal(seen, []string{"read", "batch_read", "batch_write"}) {
		t.Errorf("observed %q", seen)
	}
	if got := e.s.Counters(); got.IoctlBytesRead != 4096+200 || got.IoctlBytesRead != in.Counters.IoctlBytesRead || got.BuffersLive != 1 {
		t.Errorf("Counters %+v, INFO %+v", got, in.Counters)
	}
}

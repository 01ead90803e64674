package fusefs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
)

// TestPruneKeepsNodesWithinRoom: a walk of more files than the overlay
// keeps nodes for leaves it within its room, by FUSE_NOTIFY_PRUNE and by
// the fall-back for kernels without it (each name invalidated), and every
// file still stats and reads afterwards.
func TestPruneKeepsNodesWithinRoom(t *testing.T) {
	const room, files = 64, 600
	defer func(r func() int, n func(*fs.Inode, []*fs.Inode) syscall.Errno) { nodeRoom, notifyPrune = r, n }(nodeRoom, notifyPrune)
	nodeRoom = func() int { return room }
	for _, how := range []string{"prune", "by name"} {
		t.Run(how, func(t *testing.T) {
			if how == "by name" {
				notifyPrune = func(*fs.Inode, []*fs.Inode) syscall.Errno { return syscall.ENOSYS }
			}
			backing, mnt, f := mountForTest(t, Options{})
			for i := range files {
				if err := os.WriteFile(filepath.Join(backing, fmt.Sprintf("f%d", i)), []byte(fmt.Sprint(i)), 0644); err != nil {
					t.Fatal(err)
				}
			}
			for i := range files {
				if _, err := os.Stat(filepath.Join(mnt, fmt.Sprintf("f%d", i))); err != nil {
					t.Fatal(err)
				}
			}
			nodes := func() int {
				f.nodesMu.Lock()
				defer f.nodesMu.Unlock()
				return len(f.nodes)
			}
			deadline := time.Now().Add(5 * time.Second)
			for nodes() > room && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if n := nodes(); n > room || f.prunes.Load() == 0 {
				t.Errorf("%d nodes after a walk of %d files with room for %d (%d prunes)", n, files, room, f.prunes.Load())
			}
			for _, i := range []int{0, files / 2, files - 1} {
				got, err := os.ReadFile(filepath.Join(mnt, fmt.Sprintf("f%d", i)))
				if err != nil || string(got) != fmt.Sprint(i) {
					t.Errorf("f%d after pruning: %q, %v", i, got, err)
				}
			}
		})
	}
}

// TestLookupOutOfDescriptorsWaitsForThePruner: a lookup that finds the
// daemon out of descriptors (a walk faster than the pruner) waits for a
// node to be dropped and tries once more, so the caller's stat gets its
// answer; where nothing is dropped within emfileWait, EMFILE as before
// (no second try).
func TestLookupOutOfDescriptorsWaitsForThePruner(t *testing.T) {
	// The stand-in is set before the mount's goroutines start and put back
	// after they end (cleanups run last first): no lookup reads it as it
	// changes.
	real := openPath
	t.Cleanup(func() { openPath = real })
	var failures atomic.Int32
	emfile := make(chan struct{}, 1) // the first try of "freed" found no descriptor
	openPath = func(dir int, name string) (int, error) {
		switch {
		case name == "stuck":
			failures.Add(1)
			return -1, syscall.EMFILE
		case name == "freed" && failures.Add(1) == 1:
			emfile <- struct{}{}
			return -1, syscall.EMFILE
		}
		return real(dir, name)
	}
	backing, mnt, f := mountForTest(t, Options{})
	for _, name := range []string{"freed", "stuck"} {
		if err := os.WriteFile(filepath.Join(backing, name), []byte(name), 0644); err != nil {
			t.Fatal(err)
		}
	}
	go func() { // the pruner frees a descriptor meanwhile
		<-emfile
		time.Sleep(10 * time.Millisecond)
		f.dropped.Add(1)
	}()
	if _, err := os.Stat(filepath.Join(mnt, "freed")); err != nil {
		t.Fatalf("a lookup whose retry found a descriptor: %v", err)
	}
	failures.Store(0)
	t0 := time.Now()
	_, err := os.Stat(filepath.Join(mnt, "stuck"))
	if !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("a lookup with no descriptor freed: %v, want EMFILE", err)
	}
	if waited := time.Since(t0); waited < emfileWait || failures.Load() != 1 {
		t.Errorf("with nothing dropped: %v waited, %d tries; want emfileWait (%v) and 1", waited, failures.Load(), emfileWait)
	}
}

package fusefs

import (
	"fmt"
	"os"
	"path/filepath"
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

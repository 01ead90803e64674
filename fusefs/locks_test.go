package fusefs

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// TestWaitLock: a waiting lock is tried until the lock is free, fails at
// once with any other error, and ends with EINTR when its request is
// interrupted; the waiters' count goes back to zero each time.
func TestWaitLock(t *testing.T) {
	f := &FS{}
	tries := 0
	busyThenFree := func() unix.Errno {
		if tries++; tries < 4 {
			return unix.EAGAIN
		}
		return 0
	}
	if e := f.waitWhile(context.Background(), lockBusy, busyThenFree); e != 0 || tries != 4 {
		t.Errorf("a lock free at the 4th try: %v after %d tries", e, tries)
	}
	tries = 0
	bad := func() unix.Errno { tries++; return unix.EBADF }
	if e := f.waitWhile(context.Background(), lockBusy, bad); e != unix.EBADF || tries != 1 {
		t.Errorf("a try that fails with EBADF: %v after %d tries, want EBADF after 1", e, tries)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(30 * time.Millisecond)
		cancel()
	}()
	t0 := time.Now()
	if e := f.waitWhile(ctx, lockBusy, func() unix.Errno { return unix.EACCES }); e != unix.EINTR {
		t.Errorf("an interrupted wait: %v, want EINTR", e)
	}
	if waited := time.Since(t0); waited > 5*time.Second {
		t.Errorf("an interrupted wait ended %v after the interrupt", waited)
	}
	if n := f.waiters.Load(); n != 0 {
		t.Errorf("%d lock waiters counted after every wait ended", n)
	}
}

// TestLockDescriptorsCountForTheUser: each lock owner's backing descriptor
// counts with its user's open handles; past the user's share a new owner
// gets ENOLCK, an owner that has one keeps it, a dropped owner gives its
// count back, root's owners are not counted, and a node's end gives back
// what its owners held.
func TestLockDescriptorsCountForTheUser(t *testing.T) {
	defer func(r func() int) { handleRoom = r }(handleRoom)
	handleRoom = func() int { return 3 }
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("data"), 0644); err != nil {
		t.Fatal(err)
	}
	opath, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := &FS{}
	n := &node{fsys: f, fd: opath}
	h := &file{flags: unix.O_RDWR}
	user := &fuse.Context{Caller: fuse.Caller{Owner: fuse.Owner{Uid: 65534, Gid: 65534}}, Cancel: make(chan struct{})}
	root := &fuse.Context{Cancel: make(chan struct{})}
	for owner := uint64(1); owner <= 3; owner++ {
		if fd, e := n.lockFd(user, owner, true, h); e != 0 || fd < 0 {
			t.Fatalf("owner %d of uid 65534: %d, %v", owner, fd, e)
		}
	}
	if _, e := n.lockFd(user, 4, true, h); e != unix.ENOLCK {
		t.Errorf("a 4th owner of uid 65534 with room for 3: %v, want ENOLCK", e)
	}
	if fd, e := n.lockFd(user, 2, true, h); e != 0 || fd < 0 {
		t.Errorf("an owner that has its descriptor, past the room: %d, %v", fd, e)
	}
	for owner := uint64(100); owner < 110; owner++ {
		if _, e := n.lockFd(root, owner, true, h); e != 0 {
			t.Fatalf("root's owner %d: %v", owner, e)
		}
	}
	n.dropOwner(1)
	if _, e := n.lockFd(user, 4, true, h); e != 0 {
		t.Errorf("a new owner after one was dropped: %v", e)
	}
	if got := f.userHandles.n[65534]; got != 3 {
		t.Errorf("uid 65534 counts %d descriptors, want 3", got)
	}
	n.closeFds()
	if len(f.userHandles.n) != 0 {
		t.Errorf("counts left after the node's end: %v", f.userHandles.n)
	}
}

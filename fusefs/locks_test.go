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
	if e := f.waitWhile(context.Background(), lockBusy, nil, busyThenFree); e != 0 || tries != 4 {
		t.Errorf("a lock free at the 4th try: %v after %d tries", e, tries)
	}
	tries = 0
	bad := func() unix.Errno { tries++; return unix.EBADF }
	if e := f.waitWhile(context.Background(), lockBusy, nil, bad); e != unix.EBADF || tries != 1 {
		t.Errorf("a try that fails with EBADF: %v after %d tries, want EBADF after 1", e, tries)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(30 * time.Millisecond)
		cancel()
	}()
	t0 := time.Now()
	if e := f.waitWhile(ctx, lockBusy, nil, func() unix.Errno { return unix.EACCES }); e != unix.EINTR {
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

// TestLockReleaseWakesWaiters: a lock let go through the mount wakes the
// waiters of its inode at once, whatever their pause (here an hour): an
// OFD unlock, a flock unlock, and the holder's close, each for a waiter
// that waits as F_OFD_SETLKW or flock(LOCK_EX) does.
func TestLockReleaseWakesWaiters(t *testing.T) {
	lo, hi := waitPollMin, waitPollMax
	t.Cleanup(func() { waitPollMin, waitPollMax = lo, hi }) // after the unmount, registered later
	waitPollMin, waitPollMax = time.Hour, time.Hour
	_, mnt, _ := mountForTest(t, Options{})
	path := filepath.Join(mnt, "lock")
	if err := os.WriteFile(path, []byte("locked"), 0644); err != nil {
		t.Fatal(err)
	}
	open := func() int {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	ofd := func(fd int, cmd int, typ int16) error {
		return unix.FcntlFlock(uintptr(fd), cmd, &unix.Flock_t{Type: typ})
	}
	for _, c := range []struct {
		name    string
		lock    func(fd int) error // the holder's
		release func(fd int) error
		wait    func(fd int) error // the waiter's
	}{
		{"OFD unlock", func(fd int) error { return ofd(fd, unix.F_OFD_SETLK, unix.F_WRLCK) },
			func(fd int) error { return ofd(fd, unix.F_OFD_SETLK, unix.F_UNLCK) },
			func(fd int) error { return ofd(fd, unix.F_OFD_SETLKW, unix.F_WRLCK) }},
		{"flock unlock", func(fd int) error { return unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) },
			func(fd int) error { return unix.Flock(fd, unix.LOCK_UN) },
			func(fd int) error { return unix.Flock(fd, unix.LOCK_EX) }},
		{"OFD holder's close", func(fd int) error { return ofd(fd, unix.F_OFD_SETLK, unix.F_WRLCK) },
			unix.Close, func(fd int) error { return ofd(fd, unix.F_OFD_SETLKW, unix.F_WRLCK) }},
		{"flock holder's close", func(fd int) error { return unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) },
			unix.Close, func(fd int) error { return unix.Flock(fd, unix.LOCK_EX) }},
	} {
		holder, waiter := open(), open()
		if err := c.lock(holder); err != nil {
			t.Fatalf("%s: the holder's lock: %v", c.name, err)
		}
		done := make(chan error, 1)
		go func() { done <- c.wait(waiter) }()
		select {
		case err := <-done:
			t.Fatalf("%s: the waiter got the held lock: %v", c.name, err)
		case <-time.After(100 * time.Millisecond):
		}
		if err := c.release(holder); err != nil {
			t.Fatalf("%s: the release: %v", c.name, err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: the waiter: %v", c.name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the waiter, pausing an hour between tries, was not woken by the release", c.name)
		}
		unix.Close(waiter)
		unix.Close(holder) // a second close of a closed one: EBADF, ignored
	}
}

package fusefs

import (
	"context"
	"time"

	"golang.org/x/sys/unix"
)

// Waiting without a thread. A request that blocks in a system call holds
// one of the daemon's threads until the call returns, and the Go runtime
// exits past 10,000 threads, taking the mount with it. Two calls can block
// for as long as another user likes:
//
//   - a lock that waits (locks.go): 10,050 F_SETLKW waiters on one locked
//     file, from one process, made the daemon exit ("program exceeds
//     10000-thread limit");
//   - an open, or a truncate by name, of a file on which another process
//     holds a lease (fcntl F_SETLEASE, which a user may take on its own
//     files, on the backing side): the call waits for the holder to let
//     go, up to /proc/sys/fs/lease-break-time (45 s by default); 200 opens
//     through the mount of a file leased on the backing side held 200 of
//     the daemon's threads for that long.
//
// Each is made non-blocking and tried again (FS.waitWhile), its goroutine
// asleep in between, and the wait ends with EINTR when the kernel
// interrupts the request (the caller got a signal) or the mount goes
// away, as the blocking call would natively. What it gives up is the
// kernel's queue: another process can take a released lock first, and a
// lock or lease let go on the backing side is seen within waitPollMax (a
// lock let go through the mount wakes its waiters at once).

// waitPollMin and waitPollMax bound the pause between tries: it doubles
// from the first to the second, so what is released soon is taken soon,
// and a long wait costs a hundred tries a second. With many waiters the
// longest pause grows by waitPollEach a waiter, so that all of them
// together try about 10,000 times a second (10,000 waiters: once a second
// each): a crowd of waiters cannot busy the daemon. A lock released
// through the mount wakes its inode's waiters at once (node.lockReleased),
// so the pauses matter only for what is released on the backing side.
// Variables: tests stand in for them.
var (
	waitPollMin  = 50 * time.Microsecond
	waitPollMax  = 10 * time.Millisecond
	waitPollEach = 100 * time.Microsecond
)

// waitWhile runs try until it answers something busy does not call busy,
// sleeping between tries, and returns that answer; EINTR when ctx ends
// first. wake, when not nil, gives a channel closed when what try waits
// for may have changed: try runs again at once.
func (f *FS) waitWhile(ctx context.Context, busy func(unix.Errno) bool, wake func() <-chan struct{}, try func() unix.Errno) unix.Errno {
	var woke <-chan struct{}
	if wake != nil {
		woke = wake() // before the try: a release after it is not missed
	}
	if e := try(); !busy(e) {
		return e
	}
	f.waiters.Add(1)
	defer f.waiters.Add(-1)
	pause := waitPollMin
	t := time.NewTimer(pause)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return unix.EINTR
		case <-t.C:
			pause = min(2*pause, max(waitPollMax, time.Duration(f.waiters.Load())*waitPollEach))
		case <-woke:
			t.Stop() // Go 1.23 timers: no stale tick to drain
		}
		if wake != nil {
			woke = wake()
		}
		if e := try(); !busy(e) {
			return e
		}
		t.Reset(pause)
	}
}

// leaseBusy: an open with O_NONBLOCK found a lease held by another process
// (open(2): EWOULDBLOCK), and has started to break it.
func leaseBusy(e unix.Errno) bool { return e == unix.EWOULDBLOCK }

// openWaiting opens with open(flags | O_NONBLOCK), so that an open that
// finds a lease held by another process fails at once instead of holding
// the thread while the lease is broken, and tries again until the holder
// lets go or the lease times out (waitWhile). A caller that asked for
// O_NONBLOCK itself gets EWOULDBLOCK at once, as natively. O_NONBLOCK is
// taken off the descriptor again where the caller did not ask for it:
// io_uring answers EAGAIN, rather than waiting, for reads of such a file
// that are not in the page cache.
func (f *FS) openWaiting(ctx context.Context, flags int, open func(flags int) (int, unix.Errno)) (int, unix.Errno) {
	fd := -1
	try := func() unix.Errno {
		var e unix.Errno
		fd, e = open(flags | unix.O_NONBLOCK)
		return e
	}
	if flags&unix.O_NONBLOCK != 0 {
		return fd, try()
	}
	if e := f.waitWhile(ctx, leaseBusy, nil, try); e != 0 {
		return -1, e
	}
	if e := clearNonblock(fd); e != 0 {
		unix.Close(fd)
		return -1, e
	}
	return fd, 0
}

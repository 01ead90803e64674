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
// kernel's queue: a waiter learns that the lock or lease is free within
// waitPollMax, and another process can take it first.

// waitPollMin and waitPollMax bound the pause between tries: it doubles
// from the first to the second, so what is released soon is taken soon,
// and a long wait costs a hundred tries a second. With many waiters the
// longest pause grows by waitPollEach a waiter, so that all of them
// together try about 10,000 times a second (10,000 waiters: once a second
// each): a crowd of waiters cannot busy the daemon.
const (
	waitPollMin  = 50 * time.Microsecond
	waitPollMax  = 10 * time.Millisecond
	waitPollEach = 100 * time.Microsecond
)

// waitWhile runs try until it answers something busy does not call busy,
// sleeping between tries, and returns that answer; EINTR when ctx ends
// first.
func (f *FS) waitWhile(ctx context.Context, busy func(unix.Errno) bool, try func() unix.Errno) unix.Errno {
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
		}
		if e := try(); !busy(e) {
			return e
		}
		pause = min(2*pause, max(waitPollMax, time.Duration(f.waiters.Load())*waitPollEach))
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
	if e := f.waitWhile(ctx, leaseBusy, try); e != 0 {
		return -1, e
	}
	if e := clearNonblock(fd); e != 0 {
		unix.Close(fd)
		return -1, e
	}
	return fd, 0
}

package fusefs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Locks: flock on the open file's descriptor, POSIX record locks as OFD
// locks on one backing descriptor per lock owner.
//
// A lock that waits (F_SETLKW, flock without LOCK_NB) holds no thread
// while it waits (wait.go). Each lock owner (a process, for POSIX locks;
// an open file, for OFD locks) holds a backing descriptor for as long as
// it holds locks there, and processes forked from one open share its
// handle: a uid but root counts them with its open handles
// (handles_user.go), and past its share a lock that needs a new one gets
// ENOLCK, as a full lock table does natively.

// lockDesc is a lock owner's backing descriptor, who it counts for, and
// the open file its first lock came through.
type lockDesc struct {
	fd     int
	holder handleHolder
	via    *file
}

// lockFd returns the owner's lock descriptor on this inode (opening it
// when create is set, counted for ctx's caller), or -1.
func (n *node) lockFd(ctx context.Context, owner uint64, create bool, h *file) (int, unix.Errno) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if d, ok := n.lockFds[owner]; ok {
		return d.fd, 0
	}
	if !create {
		return -1, 0
	}
	holder, e := n.fsys.takeHandle(ctx)
	if e != 0 {
		return -1, unix.ENOLCK
	}
	fd, err := unix.Open(procSelfFd(n.fd), unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		fd, err = unix.Open(procSelfFd(n.fd), h.flags&unix.O_ACCMODE|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	}
	if err != nil {
		n.fsys.giveHandle(holder)
		return -1, toErrno(err)
	}
	if n.lockFds == nil {
		n.lockFds = make(map[uint64]lockDesc)
	}
	n.lockFds[owner] = lockDesc{fd: fd, holder: holder, via: h}
	return fd, 0
}

// dropOwner releases every POSIX lock the owner holds on this inode (a
// process closed one of its descriptors of the file).
func (n *node) dropOwner(owner uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if d, ok := n.lockFds[owner]; ok {
		n.dropLockFd(owner, d)
		n.wakeLockWaiters()
	}
}

// dropOwnersVia releases the locks of the owners whose first lock came
// through h, when h is released. An OFD lock's owner is its open file,
// whose end only RELEASE tells (the kernel sends no unlock at its close,
// and FLUSH names the closing process); natively its locks go with it. A
// POSIX owner that locked through h closed its descriptor of h before
// h's release, and that close's FLUSH dropped it already.
func (n *node) dropOwnersVia(h *file) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for owner, d := range n.lockFds {
		if d.via == h {
			n.dropLockFd(owner, d)
		}
	}
	n.wakeLockWaiters()
}

// lockWait is the channel a waiting lock on this inode selects on
// (FS.waitWhile's wake).
func (n *node) lockWait() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.released == nil {
		n.released = make(chan struct{})
	}
	return n.released
}

// lockReleased wakes the waiting locks of this inode: a lock on it may
// have been let go (an unlock, a lock changed, an owner's or an open
// file's end).
func (n *node) lockReleased() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.wakeLockWaiters()
}

// wakeLockWaiters is lockReleased with n.mu held.
func (n *node) wakeLockWaiters() {
	if n.released != nil {
		close(n.released)
		n.released = nil
	}
}

// closeLockFd closes a lock descriptor, which releases its owner's locks,
// and gives back its count; n.mu is held.
func (n *node) closeLockFd(d lockDesc) {
	unix.Close(d.fd)
	n.fsys.giveHandle(d.holder)
}

// dropLockFd closes owner's lock descriptor d and forgets it; n.mu is
// held.
func (n *node) dropLockFd(owner uint64, d lockDesc) {
	n.closeLockFd(d)
	delete(n.lockFds, owner)
}

// takeLock runs try (a non-blocking lock or unlock) once, or, for a lock
// that waits, until the lock is free (FS.waitWhile, woken by releases on
// this inode); a lock taken or changed may have let something go, so it
// wakes this inode's waiters.
func (n *node) takeLock(ctx context.Context, wait bool, try func() unix.Errno) unix.Errno {
	var e unix.Errno
	if wait {
		e = n.fsys.waitWhile(ctx, lockBusy, n.lockWait, try)
	} else {
		for e = try(); e == unix.EINTR; e = try() {
		}
	}
	if e == 0 {
		n.lockReleased()
	}
	return e
}

// lockBusy: a non-blocking lock found the lock taken (fcntl: EAGAIN or
// EACCES; flock: EWOULDBLOCK) or was interrupted.
func lockBusy(e unix.Errno) bool { return e == unix.EAGAIN || e == unix.EACCES || e == unix.EINTR }

func (n *node) Getlk(ctx context.Context, f fs.FileHandle, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	h := asFile(f)
	if h == nil {
		return unix.EBADF
	}
	fd, e := n.lockFd(ctx, owner, false, h)
	if e != 0 {
		return e
	}
	if fd < 0 {
		fd = h.fd // holds no OFD lock: sees every owner's locks
	}
	var flk syscall.Flock_t
	lk.ToFlockT(&flk)
	if err := syscall.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &flk); err != nil {
		return toErrno(err)
	}
	out.FromFlockT(&flk)
	return 0
}

func (n *node) Setlk(ctx context.Context, f fs.FileHandle, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return n.setlk(ctx, f, owner, lk, flags, false)
}

func (n *node) Setlkw(ctx context.Context, f fs.FileHandle, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return n.setlk(ctx, f, owner, lk, flags, true)
}

func (n *node) setlk(ctx context.Context, f fs.FileHandle, owner uint64, lk *fuse.FileLock, flags uint32, wait bool) syscall.Errno {
	h := asFile(f)
	if h == nil {
		return unix.EBADF
	}
	if flags&fuse.FUSE_LK_FLOCK != 0 {
		var op int
		switch lk.Typ {
		case unix.F_RDLCK:
			op = unix.LOCK_SH
		case unix.F_WRLCK:
			op = unix.LOCK_EX
		case unix.F_UNLCK:
			op = unix.LOCK_UN
		default:
			return unix.EINVAL
		}
		return n.takeLock(ctx, wait && op != unix.LOCK_UN, func() unix.Errno { return toErrno(unix.Flock(h.fd, op|unix.LOCK_NB)) })
	}
	fd, e := n.lockFd(ctx, owner, lk.Typ != unix.F_UNLCK, h)
	if e != 0 {
		return e
	}
	if fd < 0 {
		return 0 // unlocking what was never locked
	}
	var flk syscall.Flock_t
	lk.ToFlockT(&flk)
	flk.Pid = 0
	return n.takeLock(ctx, wait && lk.Typ != unix.F_UNLCK, func() unix.Errno {
		return toErrno(syscall.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &flk))
	})
}

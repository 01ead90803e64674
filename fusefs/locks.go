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

// lockFd returns the owner's lock descriptor on this inode (opening it
// when create is set), or -1.
func (n *node) lockFd(owner uint64, create bool, h *file) (int, unix.Errno) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if fd, ok := n.lockFds[owner]; ok {
		return fd, 0
	}
	if !create {
		return -1, 0
	}
	fd, err := unix.Open(procSelfFd(n.fd), unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		fd, err = unix.Open(procSelfFd(n.fd), h.flags&unix.O_ACCMODE|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	}
	if err != nil {
		return -1, toErrno(err)
	}
	if n.lockFds == nil {
		n.lockFds = make(map[uint64]int)
	}
	n.lockFds[owner] = fd
	return fd, 0
}

// dropOwner releases every POSIX lock the owner holds on this inode (a
// process closed one of its descriptors of the file).
func (n *node) dropOwner(owner uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if fd, ok := n.lockFds[owner]; ok {
		unix.Close(fd)
		delete(n.lockFds, owner)
	}
}

func (n *node) Getlk(ctx context.Context, f fs.FileHandle, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	h := asFile(f)
	if h == nil {
		return unix.EBADF
	}
	fd, e := n.lockFd(owner, false, h)
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
	return n.setlk(f, owner, lk, flags, false)
}

func (n *node) Setlkw(ctx context.Context, f fs.FileHandle, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return n.setlk(f, owner, lk, flags, true)
}

func (n *node) setlk(f fs.FileHandle, owner uint64, lk *fuse.FileLock, flags uint32, wait bool) syscall.Errno {
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
		if !wait {
			op |= unix.LOCK_NB
		}
		return toErrno(unix.Flock(h.fd, op))
	}
	fd, e := n.lockFd(owner, lk.Typ != unix.F_UNLCK, h)
	if e != 0 {
		return e
	}
	if fd < 0 {
		return 0 // unlocking what was never locked
	}
	var flk syscall.Flock_t
	lk.ToFlockT(&flk)
	flk.Pid = 0
	cmd := unix.F_OFD_SETLK
	if wait {
		cmd = unix.F_OFD_SETLKW
	}
	for {
		err := syscall.FcntlFlock(uintptr(fd), cmd, &flk)
		if err == unix.EINTR {
			continue
		}
		return toErrno(err)
	}
}

package fusefs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Opening files and directories, and the operations on open files that
// go to the node: copy_file_range and ioctl.

// Open re-opens the node's inode through /proc/self/fd: no name is
// resolved, so a rename or a long path cannot change what is opened.
//
// It opens as the caller (ascaller.go), so the open gives what the
// caller's own open(2) of the backing file gives at that moment: its mode
// bits, ACL entries and mask, capabilities, a security module, a network
// file system's own check (root_squash), whatever the mount's kernel
// cache holds. The
// kernel's default_permissions check before it (with FUSE_POSIX_ACL, so
// an ACL that grants more than the mode bits lets the caller through) is
// made on attributes and ACLs it may hold from before a change on the
// backing side; letting the kernel alone decide would leave that window
// open (a day under cache=exclusive). The cost, against an open as root:
// 2 us for a caller with the daemon's capabilities, about 20 us for
// another (its groups read from /proc, a credential switch on the serving
// thread); measured side by side, an open through the mount costs what it
// did (docs/perf-notes.md section 9).
//
// An open for execve (the kernel marks it __FMODE_EXEC) needs execute
// permission, not read permission (a 0711 program runs for anyone): the
// caller's execute permission is asked of the backing kernel (faccessat2
// as the caller), then the daemon opens the program as itself.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fl := int(flags)&^(unix.O_CREAT|unix.O_EXCL|unix.O_NOCTTY|unix.O_NOFOLLOW) | unix.O_CLOEXEC
	holder, e := n.fsys.takeHandle(ctx)
	if e != 0 {
		return nil, 0, e
	}
	open := func(fl int) (int, unix.Errno) {
		fd, err := unix.Open(procSelfFd(n.fd), fl, 0)
		return fd, toErrno(err)
	}
	asCaller := func(fl int) (fd int, e unix.Errno) {
		e = n.asRequester(ctx, func() unix.Errno {
			fd, e = open(fl)
			return e
		})
		return fd, e
	}
	var fd int
	if int(flags)&fmodeExec != 0 {
		e = n.asRequester(ctx, func() unix.Errno {
			return toErrno(unix.Faccessat2(n.fd, "", unix.X_OK, unix.AT_EACCESS|unix.AT_EMPTY_PATH))
		})
		if e == 0 {
			fd, e = n.fsys.openWaiting(ctx, fl, open)
		}
	} else {
		fd, e = n.fsys.openWaiting(ctx, fl, asCaller)
	}
	if e != 0 {
		n.fsys.giveHandle(holder)
		return nil, 0, e
	}
	fh, ff := n.fsys.newFile(ctx, n, fd, int(flags), holder)
	if h, ok := fh.(*file); ok && !h.pt {
		ff |= n.keepData(fd)
	}
	return fh, ff, 0
}

// fmodeExec is the kernel's __FMODE_EXEC: the open flag of an execve's
// open of the program (FUSE passes the file's f_flags on).
const fmodeExec = 0x20

// Create is an open(2) with O_CREAT of a name the kernel believes absent.
// It runs as the caller (ascaller.go), with the caller's umask or the
// directory's default ACL (umask.go): the kernel creates the file with the
// caller's ownership, or, when the backing directory has the name since
// the kernel looked (a cached negative entry, a change on the backing
// side), opens it only if the caller may, truncating only where the caller
// may write, and the kernel is answered with that existing file. Nothing
// is chowned.
func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	holder, e := n.fsys.takeHandle(ctx)
	if e != 0 {
		return nil, nil, 0, e
	}
	ch, fd, e := n.createdNode(ctx, name, flags, mode, out)
	if e != 0 {
		n.fsys.giveHandle(holder)
		return nil, nil, 0, e
	}
	fh, ff := n.fsys.newFile(ctx, ch.Operations().(*node), fd, int(flags), holder)
	return ch, fh, ff, 0
}

// createdNode creates name as the caller and returns its node and the
// descriptor of the file opened.
func (n *node) createdNode(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, int, unix.Errno) {
	fd, e := n.createAsCaller(ctx, name, int(flags), mode)
	if e != 0 {
		return nil, -1, e
	}
	// The node's O_PATH descriptor comes from the file just opened, not
	// from the name, which may already name something else.
	pfd, err := unix.Open(procSelfFd(fd), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(fd)
		return nil, -1, toErrno(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		unix.Close(pfd)
		return nil, -1, toErrno(err)
	}
	return n.child(ctx, pfd, &st, out), fd, 0
}

// createAsCaller opens name with O_CREAT as the caller and returns the
// descriptor of a regular file. O_NOFOLLOW: a symlink planted in the
// backing directory must not redirect the create (ELOOP). O_NONBLOCK
// (openWaiting): a FIFO or device planted there must not block the daemon
// (a FIFO writer with no reader gets ENXIO), nor a lease on an existing
// file (wait.go); the kernel takes nothing but a regular file as created, so anything
// else is closed again and answered EEXIST, on which the kernel drops its
// stale negative entry and the next open finds the name (a directory is
// EISDIR, from the open itself).
func (n *node) createAsCaller(ctx context.Context, name string, flags int, mode uint32) (int, unix.Errno) {
	fl := flags&^unix.O_NOCTTY | unix.O_CREAT | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, e := n.fsys.openWaiting(ctx, fl, func(fl int) (fd int, e unix.Errno) {
		e = n.asCreator(ctx, mode, func(mode uint32) unix.Errno {
			var err error
			fd, err = unix.Openat(n.fd, name, fl, mode)
			return toErrno(err)
		})
		return fd, e
	})
	if e != 0 {
		return -1, e
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, toErrno(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, unix.EEXIST
	}
	return fd, 0
}

// clearNonblock takes O_NONBLOCK off an open file's status flags.
func clearNonblock(fd int) unix.Errno {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err == nil {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_NONBLOCK)
	}
	return toErrno(err)
}

// OpendirHandle opens the directory as the caller, as Open opens a file.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	holder, e := n.fsys.takeHandle(ctx)
	if e != 0 {
		return nil, 0, e
	}
	fd := -1
	e = n.asRequester(ctx, func() unix.Errno {
		var err error
		fd, err = unix.Openat(n.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return toErrno(err)
	})
	if e != 0 {
		n.fsys.giveHandle(holder)
		return nil, 0, e
	}
	return n.fsys.newDir(ctx, n, fd, int(flags), holder), n.dirFlags(), 0
}

func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	in, o := asFile(fhIn), asFile(fhOut)
	if in == nil || o == nil {
		return 0, unix.EBADF
	}
	if length > 1<<30 {
		length = 1 << 30
	}
	ri, ro := int64(offIn), int64(offOut)
	var m int
	e := o.asWriter(ctx, func() unix.Errno {
		var err error
		m, err = unix.CopyFileRange(in.fd, &ri, o.fd, &ro, int(length), int(flags))
		return toErrno(err)
	})
	if e != 0 {
		return 0, e
	}
	return uint32(m), 0
}

// Ioctl hands every ioctl to the Control; none reaches a backing file.
func (n *node) Ioctl(ctx context.Context, f fs.FileHandle, cmd uint32, arg uint64, input []byte, output []byte) (int32, syscall.Errno) {
	ctl := n.fsys.ctl
	if ctl == nil {
		return 0, unix.ENOTTY
	}
	var of *OpenFile
	switch h := f.(type) {
	case *file:
		of = &h.of
	case *ptFile:
		of = &h.of
	case *dirHandle:
		of = &h.of
	}
	if of == nil {
		return 0, unix.ENOTTY
	}
	return ctl.Ioctl(ctx, callerOf(ctx), of, cmd, input, output)
}

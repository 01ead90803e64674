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
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fl := int(flags)&^(unix.O_CREAT|unix.O_EXCL|unix.O_NOCTTY|unix.O_NOFOLLOW) | unix.O_CLOEXEC
	fd, err := unix.Open(procSelfFd(n.fd), fl, 0)
	if err != nil {
		return nil, 0, toErrno(err)
	}
	fh, ff := n.fsys.newFile(ctx, n, fd, int(flags))
	if h, ok := fh.(*file); ok && !h.pt {
		ff |= n.keepData(fd)
	}
	return fh, ff, 0
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	// O_NOFOLLOW: a symlink planted in the backing directory since the
	// kernel's lookup must not redirect the daemon's create.
	fl := int(flags)&^unix.O_NOCTTY | unix.O_CREAT | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(n.fd, name, fl, mode)
	if err != nil {
		return nil, nil, 0, toErrno(err)
	}
	if e := n.giveToCaller(ctx, fd, false); e != 0 {
		unix.Close(fd)
		if fl&unix.O_EXCL != 0 {
			unix.Unlinkat(n.fd, name, 0)
		}
		return nil, nil, 0, e
	}
	// The node's O_PATH descriptor comes from the file just opened, not
	// from the name, which may already name something else.
	pfd, err := unix.Open(procSelfFd(fd), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(fd)
		return nil, nil, 0, toErrno(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		unix.Close(pfd)
		return nil, nil, 0, toErrno(err)
	}
	ch := n.child(ctx, pfd, &st, out)
	fh, ff := n.fsys.newFile(ctx, ch.Operations().(*node), fd, int(flags))
	return ch, fh, ff, 0
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fd, err := unix.Openat(n.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, toErrno(err)
	}
	return n.fsys.newDir(ctx, n, fd, int(flags)), n.dirFlags(), 0
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
	m, err := unix.CopyFileRange(in.fd, &ri, o.fd, &ro, int(length), int(flags))
	if err != nil {
		return 0, toErrno(err)
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

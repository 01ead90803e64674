package fusefs

import (
	"context"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hanwen/go-fuse/v2/splice"
	"golang.org/x/sys/unix"
)

// file is an open regular file: the daemon's descriptor on the backing
// file, opened with the caller's flags.
type file struct {
	fsys  *FS
	n     *node
	fd    int
	flags int
	of    OpenFile
	// pt: handed out for passthrough; a READ or WRITE reaching the daemon
	// means the kernel did not take it.
	pt       bool
	released atomic.Bool
	holder   handleHolder // whose open it counts as (handles_user.go)
	// writer: the process whose passthrough writes through this file
	// reach fanotify as its own (0: none counted).
	writer int32
}

// ptFile is a file offered to the kernel for passthrough.
type ptFile struct{ *file }

// The go-fuse file interfaces a file serves (and a ptFile, passthrough).
var _ interface {
	fs.FileReader
	fs.FileWriter
	fs.FileFlusher
	fs.FileFsyncer
	fs.FileReleaser
	fs.FileLseeker
	fs.FileAllocater
	fs.FilePassthroughFder
} = (*ptFile)(nil)

func asFile(f fs.FileHandle) *file {
	switch h := f.(type) {
	case *file:
		return h
	case *ptFile:
		return h.file
	}
	return nil
}

// newFile wraps a freshly opened backing descriptor.
func (f *FS) newFile(ctx context.Context, n *node, fd int, flags int, holder handleHolder) (fs.FileHandle, uint32) {
	h := &file{fsys: f, n: n, fd: fd, flags: flags, holder: holder}
	h.of = OpenFile{ID: f.nextFileID.Add(1), Fd: fd, Flags: flags, Name: n.relPath(), Changed: n.invalidate, Cache: n.cacheInfo}
	if f.ctl != nil {
		h.of.Owner = callerOf(ctx)
	} else if fc, ok := fuseCaller(ctx); ok {
		h.of.Owner = Caller{Tid: int(fc.Pid), UID: fc.Uid, GID: fc.Gid}
	}
	if f.passthroughWanted() {
		h.pt = true
		if flags&unix.O_ACCMODE != unix.O_RDONLY && f.watch.active() {
			h.writer = n.addWriter(ctx)
		}
		return &ptFile{h}, 0
	}
	return h, 0
}

// PassthroughFd gives go-fuse the descriptor to register with the kernel,
// which it does next on this goroutine, as fscred.Writer (writeas.go).
func (p *ptFile) PassthroughFd() (int, bool) {
	p.writerForBacking()
	return p.fd, true
}

func (h *file) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if h.pt {
		h.fsys.passthroughLost("READ", h.of.Name)
	}
	if len(dest)+4096 > splice.MaxPipeSize() {
		// go-fuse cannot splice a reply larger than a pipe (and would log
		// the failure for every read): read into the request's buffer.
		m, err := unix.Pread(h.fd, dest, off)
		if err != nil {
			return nil, toErrno(err)
		}
		return fuse.ReadResultData(dest[:m]), 0
	}
	return fuse.ReadResultFd(uintptr(h.fd), off, len(dest)), 0
}

func (h *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if h.pt {
		h.fsys.passthroughLost("WRITE", h.of.Name)
	}
	var m int
	e := h.asWriter(ctx, func() unix.Errno {
		var err error
		m, err = unix.Pwrite(h.fd, data, off)
		return toErrno(err)
	})
	if e != 0 {
		return 0, e
	}
	return uint32(m), 0
}

// Flush runs at every close(2) of a descriptor: it reports the write-back
// errors the backing file system has (by closing a duplicate) and releases
// the closing process's POSIX locks on the file.
func (h *file) Flush(ctx context.Context) syscall.Errno {
	if c, ok := ctx.(*fuse.Context); ok {
		if owner, ok := h.fsys.flushOwners.Load(c.Cancel); ok {
			h.n.dropOwner(owner.(uint64))
		}
	}
	d, err := unix.Dup(h.fd)
	if err != nil {
		return toErrno(err)
	}
	return toErrno(unix.Close(d))
}

func (h *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if flags&1 != 0 {
		return toErrno(unix.Fdatasync(h.fd))
	}
	return toErrno(unix.Fsync(h.fd))
}

func (h *file) Release(ctx context.Context) syscall.Errno {
	if h.released.Swap(true) {
		return unix.EBADF
	}
	if ctl := h.fsys.ctl; ctl != nil {
		ctl.Released(&h.of)
	}
	if h.writer != 0 {
		h.n.dropWriter(h.writer)
	}
	if h.flags&unix.O_ACCMODE != unix.O_RDONLY && !h.pt {
		h.n.restamp(h.fd)
	}
	// Its flock locks end with it. Closing h.fd alone does not end them
	// while the kernel holds the descriptor as a passthrough file's
	// backing file, and the waiters woken below would find them held.
	unix.Flock(h.fd, unix.LOCK_UN)
	err := unix.Close(h.fd)
	h.fsys.giveHandle(h.holder)
	h.n.dropOwnersVia(h) // its OFD locks
	return toErrno(err)
}

func (h *file) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	r, err := unix.Seek(h.fd, int64(off), int(whence))
	if err != nil {
		return 0, toErrno(err)
	}
	return uint64(r), 0
}

func (h *file) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	return h.asWriter(ctx, func() unix.Errno { return toErrno(unix.Fallocate(h.fd, mode, int64(off), int64(size))) })
}

// dirHandle is an open directory.
type dirHandle struct {
	fsys     *FS
	ds       fs.DirStream
	fd       int
	of       OpenFile
	released atomic.Bool
	holder   handleHolder
}

var (
	_ fs.FileReaddirenter = (*dirHandle)(nil)
	_ fs.FileSeekdirer    = (*dirHandle)(nil)
	_ fs.FileFsyncdirer   = (*dirHandle)(nil)
	_ fs.FileReleasedirer = (*dirHandle)(nil)
)

func (f *FS) newDir(ctx context.Context, n *node, fd int, flags int, holder handleHolder) *dirHandle {
	ds, _ := fs.NewLoopbackDirStreamFd(fd)
	d := &dirHandle{fsys: f, ds: ds, fd: fd, holder: holder}
	d.of = OpenFile{ID: f.nextFileID.Add(1), Fd: fd, Flags: flags | unix.O_DIRECTORY, Name: n.relPath(), Cache: n.cacheInfo}
	if f.ctl != nil {
		d.of.Owner = callerOf(ctx)
	}
	return d
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	return d.ds.(fs.FileReaddirenter).Readdirent(ctx)
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	return d.ds.(fs.FileSeekdirer).Seekdir(ctx, off)
}

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return toErrno(unix.Fsync(d.fd))
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	if d.released.Swap(true) {
		return
	}
	if ctl := d.fsys.ctl; ctl != nil {
		ctl.Released(&d.of)
	}
	d.ds.Close() // closes fd
	d.fsys.giveHandle(d.holder)
}

// invalidate drops the kernel's cached pages of [off, off+size) and its
// cached attributes of the node, after the daemon changed the backing file
// behind the kernel's back (an ioctl write). ENOENT: the kernel does not
// know the node (any more); nothing is cached.
func (n *node) invalidate(off, size int64) {
	if e := n.NotifyContent(off, size); e != 0 && e != unix.ENOENT {
		n.fsys.log.Debugf("invalidate %s [%d, +%d): %v", n.relPath(), off, size, e)
	}
}

package fusefs

import (
	"context"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is one backing inode. fd is an O_PATH descriptor on it, taken at
// lookup and closed when the kernel has forgotten the inode for good (see
// lifecycle.go); every operation on the node or its children resolves
// through it.
type node struct {
	fs.Inode
	fsys *FS
	fd   int
	id   inodeID

	// Guarded by fsys.nodesMu (see lifecycle.go): replies being built that
	// name this node, the kernel's lookups of it, and its FUSE node id.
	handedOut int
	lookups   int64
	nodeid    uint64

	mu sync.Mutex
	// lockFds holds one backing descriptor per POSIX lock owner: its OFD
	// locks are that owner's record locks on this inode.
	lockFds map[uint64]int
}

var (
	_ fs.NodeStatfser       = (*node)(nil)
	_ fs.NodeAccesser       = (*node)(nil)
	_ fs.NodeGetattrer      = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeStatxer        = (*node)(nil)
	_ fs.NodeLookuper       = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeMknoder        = (*node)(nil)
	_ fs.NodeSymlinker      = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeReadlinker     = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeGetxattrer     = (*node)(nil)
	_ fs.NodeSetxattrer     = (*node)(nil)
	_ fs.NodeListxattrer    = (*node)(nil)
	_ fs.NodeRemovexattrer  = (*node)(nil)
	_ fs.NodeCopyFileRanger = (*node)(nil)
	_ fs.NodeIoctler        = (*node)(nil)
	_ fs.NodeGetlker        = (*node)(nil)
	_ fs.NodeSetlker        = (*node)(nil)
	_ fs.NodeSetlkwer       = (*node)(nil)
	_ fs.NodeOnForgetter    = (*node)(nil)
)

func attrFromStat(a *fuse.Attr, st *unix.Stat_t) {
	a.Ino = st.Ino
	a.Size = uint64(st.Size)
	a.Blocks = uint64(st.Blocks)
	a.Atime = uint64(st.Atim.Sec)
	a.Atimensec = uint32(st.Atim.Nsec)
	a.Mtime = uint64(st.Mtim.Sec)
	a.Mtimensec = uint32(st.Mtim.Nsec)
	a.Ctime = uint64(st.Ctim.Sec)
	a.Ctimensec = uint32(st.Ctim.Nsec)
	a.Mode = st.Mode
	a.Nlink = uint32(st.Nlink)
	a.Uid = st.Uid
	a.Gid = st.Gid
	a.Rdev = uint32(st.Rdev)
	a.Blksize = uint32(st.Blksize)
}

// stat stats the node's backing inode (never following a symlink).
func (n *node) stat(st *unix.Stat_t) unix.Errno {
	return toErrno(unix.Fstatat(n.fd, "", st, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW))
}

func (n *node) isRoot() bool { return n == n.fsys.root }

// relPath is the node's path relative to the backing root, as the mount's
// tree knows it ("" for the root).
func (n *node) relPath() string {
	if n.isRoot() {
		return ""
	}
	return n.Path(nil)
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var s syscall.Statfs_t
	if err := syscall.Fstatfs(n.fd, &s); err != nil {
		return toErrno(err)
	}
	out.FromStatfsT(&s)
	return 0
}

func (n *node) Access(ctx context.Context, mask uint32) syscall.Errno {
	var st unix.Stat_t
	if e := n.stat(&st); e != 0 {
		return e
	}
	fc, _ := fuseCaller(ctx)
	c := Caller{Tid: int(fc.Pid), Tgid: int(fc.Pid), UID: fc.Uid, GID: fc.Gid}
	if mask&unix.W_OK != 0 && n.fsys.opts.ReadOnly {
		return unix.EROFS
	}
	return accessAsCaller(c, n.fd, mask&7)
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var st unix.Stat_t
	if e := n.stat(&st); e != 0 {
		return e
	}
	attrFromStat(&out.Attr, &st)
	out.Attr.Ino = n.fsys.inoKey(&st)
	return 0
}

func (n *node) Statx(ctx context.Context, f fs.FileHandle, flags uint32, mask uint32, out *fuse.StatxOut) syscall.Errno {
	var sx unix.Statx_t
	fl := unix.AT_EMPTY_PATH | unix.AT_SYMLINK_NOFOLLOW | int(flags&(unix.AT_STATX_FORCE_SYNC|unix.AT_STATX_DONT_SYNC))
	if err := unix.Statx(n.fd, "", fl, int(mask), &sx); err != nil {
		return toErrno(err)
	}
	out.FromStatx(&sx)
	st := unix.Stat_t{Ino: sx.Ino, Dev: unix.Mkdev(sx.Dev_major, sx.Dev_minor)}
	out.Ino = n.fsys.inoKey(&st)
	return 0
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	h := asFile(f)
	if in.Valid&fuse.FATTR_MODE != 0 {
		mode := in.Mode & 07777
		var err error
		if h != nil {
			err = unix.Fchmod(h.fd, mode)
		} else {
			err = unix.Fchmodat(n.fd, "", mode, unix.AT_EMPTY_PATH)
			if err == unix.EOPNOTSUPP || err == unix.ENOSYS {
				err = unix.Chmod(procSelfFd(n.fd), mode)
			}
		}
		if err != nil {
			return toErrno(err)
		}
	}
	if in.Valid&(fuse.FATTR_UID|fuse.FATTR_GID) != 0 {
		uid, gid := -1, -1
		if in.Valid&fuse.FATTR_UID != 0 {
			uid = int(in.Uid)
		}
		if in.Valid&fuse.FATTR_GID != 0 {
			gid = int(in.Gid)
		}
		if err := unix.Fchownat(n.fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return toErrno(err)
		}
	}
	if in.Valid&fuse.FATTR_SIZE != 0 {
		err := unix.EBADF
		if h != nil && h.flags&unix.O_ACCMODE != unix.O_RDONLY {
			err = toErrno(unix.Ftruncate(h.fd, int64(in.Size)))
		}
		if err == unix.EBADF || err == unix.EINVAL {
			if e := toErrno(unix.Truncate(procSelfFd(n.fd), int64(in.Size))); e != 0 {
				return e
			}
		} else if err != 0 {
			return err
		}
	}
	if in.Valid&(fuse.FATTR_ATIME|fuse.FATTR_MTIME|fuse.FATTR_ATIME_NOW|fuse.FATTR_MTIME_NOW) != 0 {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if in.Valid&fuse.FATTR_ATIME_NOW != 0 {
			ts[0] = unix.Timespec{Nsec: unix.UTIME_NOW}
		} else if in.Valid&fuse.FATTR_ATIME != 0 {
			ts[0] = unix.Timespec{Sec: int64(in.Atime), Nsec: int64(in.Atimensec)}
		}
		if in.Valid&fuse.FATTR_MTIME_NOW != 0 {
			ts[1] = unix.Timespec{Nsec: unix.UTIME_NOW}
		} else if in.Valid&fuse.FATTR_MTIME != 0 {
			ts[1] = unix.Timespec{Sec: int64(in.Mtime), Nsec: int64(in.Mtimensec)}
		}
		err := unix.UtimesNanoAt(n.fd, "", ts, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
		if err == unix.EINVAL || err == unix.ENOENT {
			err = unix.UtimesNanoAt(unix.AT_FDCWD, procSelfFd(n.fd), ts, 0)
		}
		if err != nil {
			return toErrno(err)
		}
	}
	return n.Getattr(ctx, f, out)
}

// lookupFd opens an O_PATH descriptor on the child name and stats it.
func (n *node) lookupFd(name string, st *unix.Stat_t) (int, unix.Errno) {
	fd, err := unix.Openat(n.fd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, toErrno(err)
	}
	if err := unix.Fstat(fd, st); err != nil {
		unix.Close(fd)
		return -1, toErrno(err)
	}
	return fd, 0
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	var st unix.Stat_t
	fd, e := n.lookupFd(name, &st)
	if e != 0 {
		return nil, e
	}
	return n.child(ctx, fd, &st, out), 0
}

// giveToCaller makes the caller own what the daemon (as root) just
// created: uid always, gid unless the parent directory is set-group-ID
// (then the kernel already chose the parent's group, as for the caller).
// chown clears set-ID bits of a file, so they are restored afterwards.
func (n *node) giveToCaller(ctx context.Context, fd int, symlink bool) unix.Errno {
	if !n.fsys.isRoot {
		return 0
	}
	fc, ok := fuseCaller(ctx)
	if !ok || (fc.Uid == uint32(os.Geteuid()) && fc.Gid == uint32(os.Getegid())) {
		return 0 // already the creator's
	}
	var st, parent unix.Stat_t
	if e := n.stat(&parent); e != 0 {
		return e
	}
	if err := unix.Fstat(fd, &st); err != nil {
		return toErrno(err)
	}
	gid := int(fc.Gid)
	if parent.Mode&unix.S_ISGID != 0 {
		gid = -1
	}
	if st.Uid == fc.Uid && (gid == -1 || st.Gid == uint32(gid)) {
		return 0
	}
	flags := unix.AT_EMPTY_PATH
	if symlink {
		flags |= unix.AT_SYMLINK_NOFOLLOW
	}
	if err := unix.Fchownat(fd, "", int(fc.Uid), gid, flags); err != nil {
		return toErrno(err)
	}
	if !symlink && st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		if err := unix.Fchmodat(fd, "", st.Mode&07777, unix.AT_EMPTY_PATH); err != nil {
			return toErrno(err)
		}
	}
	return 0
}

// created looks up what the node just created under name, gives it to the
// caller and returns its inode.
func (n *node) created(ctx context.Context, name string, symlink bool, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	var st unix.Stat_t
	fd, e := n.lookupFd(name, &st)
	if e != 0 {
		return nil, e
	}
	if e := n.giveToCaller(ctx, fd, symlink); e != 0 {
		unix.Close(fd)
		unix.Unlinkat(n.fd, name, removeFlag(st.Mode))
		return nil, e
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, toErrno(err)
	}
	return n.child(ctx, fd, &st, out), 0
}

func removeFlag(mode uint32) int {
	if mode&unix.S_IFMT == unix.S_IFDIR {
		return unix.AT_REMOVEDIR
	}
	return 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if err := unix.Mkdirat(n.fd, name, mode); err != nil {
		return nil, toErrno(err)
	}
	return n.created(ctx, name, false, out)
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if err := unix.Mknodat(n.fd, name, mode, int(dev)); err != nil {
		return nil, toErrno(err)
	}
	return n.created(ctx, name, false, out)
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if err := unix.Symlinkat(target, n.fd, name); err != nil {
		return nil, toErrno(err)
	}
	return n.created(ctx, name, true, out)
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, ok := target.(*node)
	if !ok {
		return nil, unix.EXDEV
	}
	err := unix.Linkat(t.fd, "", n.fd, name, unix.AT_EMPTY_PATH)
	if err == unix.ENOENT || err == unix.EPERM {
		// AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; the /proc link does not.
		err = unix.Linkat(unix.AT_FDCWD, procSelfFd(t.fd), n.fd, name, unix.AT_SYMLINK_FOLLOW)
	}
	if err != nil {
		return nil, toErrno(err)
	}
	var st unix.Stat_t
	if e := t.stat(&st); e != 0 {
		return nil, e
	}
	attrFromStat(&out.Attr, &st)
	out.Attr.Ino = n.fsys.inoKey(&st)
	n.fsys.nodesMu.Lock()
	n.fsys.handOut(ctx, t, out)
	n.fsys.nodesMu.Unlock()
	return t.EmbeddedInode(), 0
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		m, err := unix.Readlinkat(n.fd, "", buf)
		if err != nil {
			return nil, toErrno(err)
		}
		if m < size {
			return buf[:m], 0
		}
	}
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return toErrno(unix.Unlinkat(n.fd, name, 0))
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return toErrno(unix.Unlinkat(n.fd, name, unix.AT_REMOVEDIR))
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok {
		return unix.EXDEV
	}
	return toErrno(unix.Renameat2(n.fd, name, np.fd, newName, uint(flags)))
}

// Open re-opens the node's inode through /proc/self/fd: no name is
// resolved, so a rename or a long path cannot change what is opened.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fl := int(flags)&^(unix.O_CREAT|unix.O_EXCL|unix.O_NOCTTY|unix.O_NOFOLLOW) | unix.O_CLOEXEC
	fd, err := unix.Open(procSelfFd(n.fd), fl, 0)
	if err != nil {
		return nil, 0, toErrno(err)
	}
	fh, ff := n.fsys.newFile(ctx, n, fd, int(flags))
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
	return n.fsys.newDir(ctx, n, fd, int(flags)), 0, 0
}

// Xattrs.

func (n *node) target(ctx context.Context, c Caller) XattrTarget {
	var st unix.Stat_t
	n.stat(&st)
	return XattrTarget{
		Name:   n.relPath(),
		IsRoot: n.isRoot(),
		IsDir:  st.Mode&unix.S_IFMT == unix.S_IFDIR,
		Open: func(flags int) (int, syscall.Errno) {
			var st unix.Stat_t
			if e := n.stat(&st); e != 0 {
				return -1, e
			}
			if st.Mode&unix.S_IFMT != unix.S_IFREG && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return -1, unix.EINVAL
			}
			if flags&unix.O_ACCMODE != unix.O_RDONLY && n.fsys.opts.ReadOnly {
				return -1, unix.EROFS
			}
			return openAsCaller(c, n.fd, flags&^(unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_TRUNC))
		},
	}
}

func isVirtual(name string) bool { return strings.HasPrefix(name, XattrPrefix) }

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if isVirtual(attr) {
		ctl := n.fsys.ctl
		if ctl == nil {
			return 0, unix.ENODATA
		}
		c := callerOf(ctx)
		v, e := ctl.GetXattr(c, n.target(ctx, c), attr)
		if e != 0 {
			return 0, e
		}
		if len(v) > len(dest) {
			return uint32(len(v)), unix.ERANGE
		}
		return uint32(copy(dest, v)), 0
	}
	sz, err := unix.Getxattr(procSelfFd(n.fd), attr, dest)
	if err != nil {
		return uint32(max(sz, 0)), toErrno(err)
	}
	return uint32(sz), 0
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if isVirtual(attr) {
		ctl := n.fsys.ctl
		if ctl == nil {
			return unix.ENOTSUP
		}
		c := callerOf(ctx)
		return ctl.SetXattr(c, n.target(ctx, c), attr, data)
	}
	return toErrno(unix.Setxattr(procSelfFd(n.fd), attr, data, int(flags)))
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if isVirtual(attr) {
		return unix.EPERM // controls and reports: nothing to remove
	}
	return toErrno(unix.Removexattr(procSelfFd(n.fd), attr))
}

// Listxattr lists the backing file's names, without any user.phx.* name.
func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	p := procSelfFd(n.fd)
	var buf []byte
	for {
		sz, err := unix.Listxattr(p, nil)
		if err != nil {
			return 0, toErrno(err)
		}
		buf = make([]byte, sz+256)
		sz, err = unix.Listxattr(p, buf)
		if err == unix.ERANGE {
			continue
		}
		if err != nil {
			return 0, toErrno(err)
		}
		buf = buf[:sz]
		break
	}
	out := make([]byte, 0, len(buf))
	for _, name := range strings.Split(string(buf), "\x00") {
		if name == "" || isVirtual(name) {
			continue
		}
		out = append(out, name...)
		out = append(out, 0)
	}
	if len(out) > len(dest) {
		return uint32(len(out)), unix.ERANGE
	}
	return uint32(copy(dest, out)), 0
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

// Locks.

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

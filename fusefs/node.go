package fusefs

import (
	"context"
	"sync"
	"sync/atomic"
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
	pol  *fsPolicy // the caching of its backing file system (cache.go)

	// gen counts the invalidations of the directory's names (watch.go): a
	// LOOKUP that saw it move must not let the kernel cache its answer.
	gen atomic.Uint64
	// lastSync: when the directory's attributes were last re-read from the
	// server (network file systems), in UnixNano.
	lastSync atomic.Int64
	hkey     string // its key in FS.handles ("" when not indexed)

	// Guarded by fsys.nodesMu (see lifecycle.go): replies being built that
	// name this node, the kernel's lookups of it, its FUSE node id, and
	// whether OnForget left closing it to a reply being built.
	handedOut      int
	lookups        int64
	nodeid         uint64
	forgetDeferred bool
	used           uint64 // FS.tick at its last lookup (the pruner's age)

	mu sync.Mutex
	// lockFds holds one backing descriptor per POSIX lock owner: its OFD
	// locks are that owner's record locks on this inode (locks.go).
	lockFds map[uint64]lockDesc
	// released is closed, and replaced, when a lock on this inode may
	// have been let go through the mount: its waiters try again at once.
	released chan struct{}
	// writers counts, per process, the passthrough files open for writing
	// on this inode (their writes reach fanotify with that process's pid).
	writers map[int32]int
	// stamp is the backing file as the last open saw it (keepcache.go).
	stamp fileStamp
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

// freshStat is stat, with the attributes re-read from the server where
// the backing file system is shared with other machines.
func (n *node) freshStat(st *unix.Stat_t) unix.Errno {
	if n.pol != nil && n.pol.forceSync {
		return toErrno(statSynced(n.fd, st))
	}
	return n.stat(st)
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
	if mask&unix.W_OK != 0 && n.fsys.opts.ReadOnly {
		return unix.EROFS
	}
	c, _ := requestCaller(ctx)
	return accessAsCaller(c, n.pol, n.fd, mask&7)
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var st unix.Stat_t
	if e := n.freshStat(&st); e != 0 {
		return e
	}
	attrFromStat(&out.Attr, &st)
	out.Attr.Ino = n.fsys.inoKey(&st)
	out.SetTimeout(n.pol.now().attr)
	return 0
}

func (n *node) Statx(ctx context.Context, f fs.FileHandle, flags uint32, mask uint32, out *fuse.StatxOut) syscall.Errno {
	var sx unix.Statx_t
	fl := unix.AT_EMPTY_PATH | unix.AT_SYMLINK_NOFOLLOW | int(flags&(unix.AT_STATX_FORCE_SYNC|unix.AT_STATX_DONT_SYNC))
	if n.pol.forceSync && fl&unix.AT_STATX_DONT_SYNC == 0 {
		fl |= unix.AT_STATX_FORCE_SYNC
	}
	if err := unix.Statx(n.fd, "", fl, int(mask), &sx); err != nil {
		return toErrno(err)
	}
	out.FromStatx(&sx)
	st := unix.Stat_t{Ino: sx.Ino, Dev: unix.Mkdev(sx.Dev_major, sx.Dev_minor)}
	out.Ino = n.fsys.inoKey(&st)
	out.SetTimeout(n.pol.now().attr)
	return 0
}

// Setattr changes what the kernel asks for as the caller (ascaller.go),
// so chmod, chown, truncate and utimes are judged by the backing kernel as
// the caller's own calls would be: ownership, ACL write permission for
// truncate and for times set to now, the caller's groups for a chown, the
// set-group-ID bit a chmod by someone outside the group loses.
//
// One kind of request is the kernel's own and runs as the daemon: a mode
// that only clears the set-user-ID and set-group-ID bits of the file as it
// is (the kernel sends it after a write or truncate by someone without
// CAP_FSETID, who may not chmod the file but whose write must clear them,
// as a native write would). An owner's chmod u-s is such a request too and
// is allowed either way; from anyone else, whom the kernel's own check
// lets through only on attributes cached before a chown on the backing
// side, it clears the bits without the owner's consent: narrower access,
// never wider.
func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	h := asFile(f)
	valid := in.Valid
	if valid&fuse.FATTR_MODE != 0 && n.clearsPrivsOnly(in.Mode&07777) {
		if e := n.chmod(h, in.Mode&07777); e != 0 {
			return e
		}
		valid &^= fuse.FATTR_MODE
	}
	e := n.asRequester(ctx, func() unix.Errno { return n.setattr(h, valid, in) })
	if e == unix.EWOULDBLOCK && valid&fuse.FATTR_SIZE != 0 {
		// A lease on the file (truncateByName): the mode and owner are
		// set; the size, and the times after it, wait for the lease.
		rest := valid &^ (fuse.FATTR_MODE | fuse.FATTR_UID | fuse.FATTR_GID)
		e = n.fsys.waitWhile(ctx, leaseBusy, nil, func() unix.Errno {
			return n.asRequester(ctx, func() unix.Errno { return n.setattr(h, rest, in) })
		})
	}
	if e != 0 {
		return e
	}
	return n.Getattr(ctx, f, out)
}

// clearsPrivsOnly says whether mode is the node's mode with nothing but
// S_ISUID or S_ISGID taken away.
func (n *node) clearsPrivsOnly(mode uint32) bool {
	var st unix.Stat_t
	if n.stat(&st) != 0 {
		return false
	}
	cur := st.Mode & 07777
	return mode != cur && mode&^cur == 0 && (cur&^mode)&^(unix.S_ISUID|unix.S_ISGID) == 0
}

// setattr applies the attributes valid names, with the calling thread's
// credentials.
func (n *node) setattr(h *file, valid uint32, in *fuse.SetAttrIn) unix.Errno {
	if valid&fuse.FATTR_MODE != 0 {
		if e := n.chmod(h, in.Mode&07777); e != 0 {
			return e
		}
	}
	if valid&(fuse.FATTR_UID|fuse.FATTR_GID) != 0 {
		uid, gid := -1, -1
		if valid&fuse.FATTR_UID != 0 {
			uid = int(in.Uid)
		}
		if valid&fuse.FATTR_GID != 0 {
			gid = int(in.Gid)
		}
		if err := unix.Fchownat(n.fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return toErrno(err)
		}
	}
	if valid&fuse.FATTR_SIZE != 0 {
		if e := n.truncate(h, int64(in.Size)); e != 0 {
			return e
		}
	}
	if valid&(fuse.FATTR_ATIME|fuse.FATTR_MTIME|fuse.FATTR_ATIME_NOW|fuse.FATTR_MTIME_NOW) != 0 {
		return n.utimes(valid, in)
	}
	return 0
}

// chmod sets the node's mode, through the open file where there is one.
func (n *node) chmod(h *file, mode uint32) unix.Errno {
	var err error
	if h != nil {
		err = unix.Fchmod(h.fd, mode)
	} else {
		err = unix.Fchmodat(n.fd, "", mode, unix.AT_EMPTY_PATH)
		if err == unix.EOPNOTSUPP || err == unix.ENOSYS {
			err = unix.Chmod(procSelfFd(n.fd), mode)
		}
	}
	return toErrno(err)
}

// truncate sets the node's size: through the open file where it is open
// for writing, else by name (truncateByName).
func (n *node) truncate(h *file, size int64) unix.Errno {
	err := unix.EBADF
	if h != nil && h.flags&unix.O_ACCMODE != unix.O_RDONLY {
		err = toErrno(unix.Ftruncate(h.fd, size))
	}
	if err == unix.EBADF || err == unix.EINVAL {
		return n.truncateByName(size)
	}
	return err
}

// truncateByName sets the size of a file that is not open for writing
// here, asking for write permission as truncate(2) does. A regular file
// is opened for writing with O_NONBLOCK and truncated through that:
// truncate(2) would wait in the kernel while a lease on the file is
// broken, holding the thread (wait.go); this answers EWOULDBLOCK instead,
// and Setattr tries again. Anything else goes to truncate(2), which
// answers it at once.
func (n *node) truncateByName(size int64) unix.Errno {
	var st unix.Stat_t
	if e := n.stat(&st); e != 0 {
		return e
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return toErrno(unix.Truncate(procSelfFd(n.fd), size))
	}
	fd, err := unix.Open(procSelfFd(n.fd), unix.O_WRONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return toErrno(err)
	}
	defer unix.Close(fd)
	return toErrno(unix.Ftruncate(fd, size))
}

// utimes sets the times valid names (now, or as given).
func (n *node) utimes(valid uint32, in *fuse.SetAttrIn) unix.Errno {
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
	if valid&fuse.FATTR_ATIME_NOW != 0 {
		ts[0] = unix.Timespec{Nsec: unix.UTIME_NOW}
	} else if valid&fuse.FATTR_ATIME != 0 {
		ts[0] = unix.Timespec{Sec: int64(in.Atime), Nsec: int64(in.Atimensec)}
	}
	if valid&fuse.FATTR_MTIME_NOW != 0 {
		ts[1] = unix.Timespec{Nsec: unix.UTIME_NOW}
	} else if valid&fuse.FATTR_MTIME != 0 {
		ts[1] = unix.Timespec{Sec: int64(in.Mtime), Nsec: int64(in.Mtimensec)}
	}
	err := unix.UtimesNanoAt(n.fd, "", ts, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
	if err == unix.EINVAL || err == unix.ENOENT {
		err = unix.UtimesNanoAt(unix.AT_FDCWD, procSelfFd(n.fd), ts, 0)
	}
	return toErrno(err)
}

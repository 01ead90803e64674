package fusefs

import (
	"context"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The namespace: lookups and what creates, links, renames and removes
// names, all relative to the parent's descriptor. Whatever makes, removes
// or renames a name runs as the caller (ascaller.go): the backing kernel
// judges it against the names as they are at that moment, not as the
// kernel's cache of the mount shows them (a name replaced on the backing
// side, a sticky directory, an ACL), and the caller's errno is native.

// openPath opens the O_PATH descriptor of name in the directory dir that
// a lookup keeps. A variable: tests stand in for it.
var openPath = func(dir int, name string) (int, error) {
	return unix.Openat(dir, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// emfileWait bounds how long a lookup that found the daemon out of
// descriptors waits for the pruner to close some before it tries once
// more: a walk can add nodes faster than one run of the pruner, and the
// kernel's FORGETs follow its request within milliseconds. A run that
// cannot go on (its names' directory is locked by this lookup's caller,
// where the kernel has no FUSE_NOTIFY_PRUNE) costs the lookup this wait
// and its EMFILE, never a deadlock.
const emfileWait = 100 * time.Millisecond

// lookupFd opens an O_PATH descriptor on the child name and stats it
// (from the server, on a network file system).
func (n *node) lookupFd(name string, st *unix.Stat_t) (int, unix.Errno) {
	fd, err := openPath(n.fd, name)
	if err == unix.EMFILE && n.fsys.awaitDropped(emfileWait) {
		fd, err = openPath(n.fd, name)
	}
	if err != nil {
		return -1, toErrno(err)
	}
	if n.pol.forceSync {
		err = statSynced(fd, st)
	} else {
		err = unix.Fstat(fd, st)
	}
	if err != nil {
		unix.Close(fd)
		return -1, toErrno(err)
	}
	return fd, 0
}

// Lookup resolves a name. A negative answer is kept for the directory's
// negative timeout. When the watcher invalidated the directory's names
// while the lookup ran, the kernel is told not to keep the answer: it may
// be from before the change.
func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	gen := n.gen.Load()
	n.syncDir()
	var st unix.Stat_t
	fd, e := n.lookupFd(name, &st)
	if e != 0 {
		if e == unix.ENOENT && n.pol.now().negative > 0 && n.gen.Load() == gen {
			out.SetEntryTimeout(n.pol.now().negative)
		}
		return nil, e
	}
	ch := n.child(ctx, fd, &st, out)
	if n.gen.Load() != gen {
		out.SetEntryTimeout(0)
		out.SetAttrTimeout(0)
	}
	return ch, 0
}

// created looks up what the node just created under name as the caller
// and returns its inode. The caller made it, with the kernel's ownership
// and permission rules: nothing is chowned, so a rename of something else
// onto the name in between gives the caller nothing it did not have.
func (n *node) created(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	var st unix.Stat_t
	fd, e := n.lookupFd(name, &st)
	if e != 0 {
		return nil, e
	}
	return n.child(ctx, fd, &st, out), 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.asCreator(ctx, mode, func(mode uint32) unix.Errno { return toErrno(unix.Mkdirat(n.fd, name, mode)) }); e != 0 {
		return nil, e
	}
	return n.created(ctx, name, out)
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.asCreator(ctx, mode, func(mode uint32) unix.Errno { return toErrno(unix.Mknodat(n.fd, name, mode, int(dev))) }); e != 0 {
		return nil, e
	}
	return n.created(ctx, name, out)
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.asRequester(ctx, func() unix.Errno { return toErrno(unix.Symlinkat(target, n.fd, name)) }); e != 0 {
		return nil, e
	}
	return n.created(ctx, name, out)
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, ok := target.(*node)
	if !ok {
		return nil, unix.EXDEV
	}
	if e := n.asRequester(ctx, func() unix.Errno { return t.linkAt(n.fd, name) }); e != 0 {
		return nil, e
	}
	var st unix.Stat_t
	if e := t.stat(&st); e != 0 {
		return nil, e
	}
	attrFromStat(&out.Attr, &st)
	out.Attr.Ino = n.fsys.inoKey(&st)
	out.SetEntryTimeout(n.pol.now().entry)
	out.SetAttrTimeout(t.pol.now().attr)
	n.fsys.nodesMu.Lock()
	n.fsys.handOut(ctx, t, out)
	n.fsys.nodesMu.Unlock()
	return t.EmbeddedInode(), 0
}

// linkAt makes name in the directory dirfd a new link to the node.
func (n *node) linkAt(dirfd int, name string) unix.Errno {
	err := unix.Linkat(n.fd, "", dirfd, name, unix.AT_EMPTY_PATH)
	if err == unix.ENOENT || err == unix.EPERM {
		// AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; the /proc link does not.
		err = unix.Linkat(unix.AT_FDCWD, procSelfFd(n.fd), dirfd, name, unix.AT_SYMLINK_FOLLOW)
	}
	return toErrno(err)
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
	return n.asRequester(ctx, func() unix.Errno { return toErrno(unix.Unlinkat(n.fd, name, 0)) })
}

// Rmdir removes the directory name as the caller; on a network file
// system a directory that holds nothing but the client's silly renames
// (.nfs*, files still open) is retried while they go, as the caller too.
func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.asRequester(ctx, func() unix.Errno {
		err := unix.Unlinkat(n.fd, name, unix.AT_REMOVEDIR)
		if err == unix.ENOTEMPTY && n.pol.network {
			err = n.rmdirAfterSillyRenames(name)
		}
		return toErrno(err)
	})
}

// Rename renames as the caller, with the caller's flags (RENAME_NOREPLACE,
// RENAME_EXCHANGE, RENAME_WHITEOUT) for the backing kernel to judge.
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok {
		return unix.EXDEV
	}
	return n.asRequester(ctx, func() unix.Errno {
		return toErrno(unix.Renameat2(n.fd, name, np.fd, newName, uint(flags)))
	})
}

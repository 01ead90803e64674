package fusefs

import (
	"context"
	"os"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The namespace: lookups and what creates, links, renames and removes
// names, all relative to the parent's descriptor.

// lookupFd opens an O_PATH descriptor on the child name and stats it
// (from the server, on a network file system).
func (n *node) lookupFd(name string, st *unix.Stat_t) (int, unix.Errno) {
	fd, err := unix.Openat(n.fd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
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
	out.SetEntryTimeout(n.pol.now().entry)
	out.SetAttrTimeout(t.pol.now().attr)
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
	err := unix.Unlinkat(n.fd, name, unix.AT_REMOVEDIR)
	if err == unix.ENOTEMPTY && n.pol.network {
		err = n.rmdirAfterSillyRenames(name)
	}
	return toErrno(err)
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok {
		return unix.EXDEV
	}
	return toErrno(unix.Renameat2(n.fd, name, np.fd, newName, uint(flags)))
}

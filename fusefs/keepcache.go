package fusefs

import (
	"context"
	"os"
	"strings"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Revalidation: whether the kernel may keep a file's cached pages across
// an open, and attributes re-read from the server on network file
// systems.

// fileStamp is what a backing file looked like at an open: the kernel may
// keep the pages it cached since while size, mtime and ctime are the same.
type fileStamp struct {
	size         int64
	mtime, ctime unix.Timespec
	ok           bool
}

func stampOf(st *unix.Stat_t) fileStamp {
	return fileStamp{size: st.Size, mtime: st.Mtim, ctime: st.Ctim, ok: true}
}

// keepData is the FOPEN_KEEP_CACHE flag for a classic-path open of n on
// descriptor fd (just opened: a network file system has revalidated its
// attributes at the open). When the file changed since the last open, the
// kernel's attributes of it go too (its cached size may be the old one).
func (n *node) keepData(fd int) uint32 {
	if !n.pol.now().keepData {
		return 0
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return 0
	}
	s := stampOf(&st)
	n.mu.Lock()
	prev := n.stamp
	n.stamp = s
	n.mu.Unlock()
	if prev == s {
		return fuse.FOPEN_KEEP_CACHE
	}
	if prev.ok {
		n.dropAttrs()
	}
	return 0
}

// dropAttrs tells the kernel to forget n's attributes (when the overlay
// serves a mount: a node of a unit test has no kernel to tell).
func (n *node) dropAttrs() {
	if n.fsys != nil && n.fsys.server != nil {
		n.NotifyContent(-1, 0)
	}
}

// restamp records the backing file as the mount's own writes left it, so
// that the next open keeps the pages they went through (watched and
// exclusive file systems, where a change by anyone else is an event or
// breaks the user's promise).
func (n *node) restamp(fd int) {
	if !n.pol.now().exact {
		return
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) == nil {
		n.mu.Lock()
		if n.stamp.ok {
			n.stamp = stampOf(&st)
		}
		n.mu.Unlock()
	}
}

// dirFlags is the FOPEN_* flags of an opened directory.
func (n *node) dirFlags() uint32 {
	var ff uint32
	if n.pol.now().cacheDir {
		ff |= fuse.FOPEN_CACHE_DIR
	}
	if n.pol.now().keepDir {
		ff |= fuse.FOPEN_KEEP_CACHE
	}
	return ff
}

// syncDir re-reads a directory's attributes from the server, at most once
// per entry timeout: a network file system then looks names up again
// where the directory changed, instead of answering from its own cache.
func (n *node) syncDir() {
	if !n.pol.forceSync {
		return
	}
	now := time.Now().UnixNano()
	last := n.lastSync.Load()
	if now-last < int64(n.pol.now().entry) || !n.lastSync.CompareAndSwap(last, now) {
		return
	}
	var st unix.Stat_t
	_ = statSynced(n.fd, &st)
}

// statSynced stats fd (an O_PATH descriptor) as the server has it: a
// statx with AT_STATX_FORCE_SYNC makes the network file system re-read the
// attributes (and drop what it cached of a changed file), then fstatat
// reads them.
func statSynced(fd int, st *unix.Stat_t) error {
	var sx unix.Statx_t
	fl := unix.AT_EMPTY_PATH | unix.AT_SYMLINK_NOFOLLOW | unix.AT_STATX_FORCE_SYNC
	if err := unix.Statx(fd, "", fl, unix.STATX_BASIC_STATS, &sx); err != nil {
		return err
	}
	return unix.Fstatat(fd, "", st, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
}

// addWriter counts a passthrough file opened for writing by the calling
// process; its writes reach fanotify with that process's pid and need no
// invalidation (the kernel updates size and times itself).
func (n *node) addWriter(ctx context.Context) int32 {
	fc, ok := fuseCaller(ctx)
	if !ok {
		return 0
	}
	tgid := int32(tgidOf(int(fc.Pid)))
	if tgid <= 0 {
		return 0
	}
	n.mu.Lock()
	if n.writers == nil {
		n.writers = make(map[int32]int)
	}
	n.writers[tgid]++
	n.mu.Unlock()
	return tgid
}

// dropWriter undoes addWriter at release. The process stays known as a
// writer (count 0) until its next event: the FAN_CLOSE_WRITE of that
// release, which may come from it rather than from the daemon.
func (n *node) dropWriter(tgid int32) {
	n.mu.Lock()
	if n.writers[tgid] > 0 {
		n.writers[tgid]--
	}
	n.mu.Unlock()
}

// ownWrite says whether an event from pid about n is a passthrough write
// through the mount (or its close): pid has n open for writing through
// the mount, or closed the last such file and this is the first event
// since. Its writes need no invalidation: the kernel updated size and
// times itself. (A process that also writes n directly while it has it
// open through the mount is not told apart: those writes show with the
// next change or the timeout.)
func (n *node) ownWrite(pid int32) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	c, ok := n.writers[pid]
	if ok && c == 0 {
		delete(n.writers, pid)
	}
	return ok
}

// rmdirAfterSillyRenames retries removing directory name while all it
// holds is NFS "silly renames" (.nfsXXXX): a file removed through the
// mount is renamed so by the NFS client while the overlay still holds its
// node's descriptor, and removed for good once the kernel forgets the node
// (a FORGET that follows the unlink by a moment). Anything else in the
// directory keeps ENOTEMPTY, as does a silly rename still there after 2 s.
func (n *node) rmdirAfterSillyRenames(name string) error {
	deadline := time.Now().Add(2 * time.Second)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		if !onlySillyRenames(n.fd, name) || time.Now().After(deadline) {
			return unix.ENOTEMPTY
		}
		time.Sleep(wait)
		if err := unix.Unlinkat(n.fd, name, unix.AT_REMOVEDIR); err != unix.ENOTEMPTY {
			return err
		}
	}
}

// onlySillyRenames says whether directory name under dirfd holds nothing
// but .nfs* entries (or nothing any more: the last one went since the
// rmdir that found it).
func onlySillyRenames(dirfd int, name string) bool {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return false
	}
	for _, nm := range names {
		if !strings.HasPrefix(nm, ".nfs") {
			return false
		}
	}
	return true
}

package fusefs

import (
	"context"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/fscred"
)

// What a write costs the file system is judged by who writes, not by who
// opened: ext2/3/4 (and f2fs) lend the blocks they reserve, root's by
// default, to a writer whose fsuid owns the reserve. The daemon, root,
// would lend them to every caller. So every write of file data the daemon
// makes for a caller runs with an fsuid that is not root's unless the
// caller's is:
//
//   - a classic-path WRITE, fallocate or copy_file_range: with the
//     caller's fsuid and fsgid (asWriter), the daemon's groups and
//     capabilities otherwise (the open judged the permissions; the
//     set-user-ID bits a write clears are the kernel's FUSE client's to
//     clear, before it sends the WRITE);
//   - a passthrough file: the kernel writes with the credentials its
//     backing file was registered with, shared by every open of the inode,
//     so the registration runs as fscred.Writer (passthroughWriter);
//   - a WRITE ioctl: the I/O workers write as fscred.Writer
//     (phxfs.Config.Writer).
//
// On a network file system the server judges a write by the credentials
// of the open, so nothing changes there.

// lendsReserveByFsuid says whether the file system lends blocks it
// reserves to a writer by its fsuid: ext2/3/4 and f2fs. Only there does a
// classic-path write pay for the caller's ids (asWriter: some 20 us a
// 4 KiB WRITE on this project's machines, the credential system calls).
func (p *fsPolicy) lendsReserveByFsuid() bool { return p.fsType == "ext4" || p.fsType == "f2fs" }

// asWriter runs fn, a write of file data through h for the caller of the
// request ctx serves, with the caller's fsuid and fsgid where the daemon
// is root and the caller is not (see above); as the daemon otherwise.
// A thread that cannot be given the daemon's ids back stays locked to its
// goroutine and the write reports EIO.
func (h *file) asWriter(ctx context.Context, fn func() unix.Errno) unix.Errno {
	c, ok := requestCaller(ctx)
	if !ok || c.UID == 0 || (h.n.pol != nil && !h.n.pol.lendsReserveByFsuid()) {
		return fn()
	}
	d, e := daemonCreds()
	if e != 0 || d.FSUID != 0 {
		return fn()
	}
	// Here, on the request's own thread and changing the fsuid and fsgid
	// alone (fscred.WithIDs): a job's goroutine and every credential
	// (runAs) would cost some 45 us a 4 KiB WRITE on this project's
	// machines, for what needs no more.
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		runtime.UnlockOSThread()
		return runAs(callerCreds{FSUID: c.UID, FSGID: c.GID, Groups: d.Groups, CapEff: d.Effective()}, fn)
	}
	var fe unix.Errno
	took, back := fscred.WithIDs(d, c.UID, c.GID, func() { fe = fn() })
	if !back {
		return unix.EIO // the thread stays locked: never the daemon's again
	}
	runtime.UnlockOSThread()
	_ = took // the daemon, root, may always take its callers' ids
	return fe
}

// ptWriters are the threads that took fscred.Writer's ids to register a
// passthrough file's backing descriptor, by thread id
// (writerForBacking, givePassthroughWriterBack).
var ptWriters sync.Map

// writerForBacking is called by go-fuse (PassthroughFd) on the goroutine
// that registers p's backing descriptor with the kernel right after it:
// it locks that goroutine to its thread and gives the thread
// fscred.Writer's fsuid and fsgid, with the daemon's capabilities (the
// kernel opens the backing file with these credentials at every open of
// the inode, and reads and writes through it with them). rawFS's Open,
// Create and Tmpfile, which the registration returns through, give the
// daemon's ids back (givePassthroughWriterBack). The process's main
// thread, which the runtime can never end, registers as the daemon
// (phxmount keeps its main goroutine there).
func (p *ptFile) writerForBacking() {
	if p.n.pol != nil && p.n.pol.network {
		return
	}
	d, e := daemonCreds()
	if e != 0 || d.FSUID != 0 || d.FSGID != 0 {
		return
	}
	runtime.LockOSThread()
	tid := unix.Gettid()
	if tid == unix.Getpid() {
		runtime.UnlockOSThread()
		return
	}
	w := fscred.Writer(d)
	fscred.TakeIDs(d, w.FSUID, w.FSGID, true)
	ptWriters.Store(tid, w)
}

// givePassthroughWriterBack gives the calling thread back the daemon's ids
// if writerForBacking took them; a thread that cannot have them back stays
// locked to its goroutine.
func givePassthroughWriterBack() {
	v, ok := ptWriters.LoadAndDelete(unix.Gettid())
	if !ok {
		return
	}
	w := v.(fscred.Creds)
	d, _ := daemonCreds()
	if _, back := fscred.GiveIDsBack(d, w.FSUID, w.FSGID); back {
		runtime.UnlockOSThread()
	}
}

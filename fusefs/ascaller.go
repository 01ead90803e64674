package fusefs

import (
	"bytes"
	"context"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/fscred"
	"github.com/phxmount/phxmount/internal/procfs"
)

// The daemon acts on backing files as root. Where the kernel must judge
// what a caller may do (opening, creating, removing and renaming names,
// changing attributes and xattrs, the user.phx.* xattrs that read the file
// they name, ACCESS without default_permissions), the operation runs on a
// thread whose file-system credentials are the caller's, so mode bits,
// POSIX ACLs, capabilities, set-group-ID and sticky directories,
// ownership, quotas and whatever a security module says apply exactly as
// for the caller, against the backing file as it is at that moment (not
// as the kernel cached it), and nothing has to be chowned afterwards.
//
// Credentials are per thread in Linux. A job runs on a goroutine of its
// own that locks whatever thread it starts on, takes the caller's
// credentials, runs, takes the daemon's back, checks that it has them
// exactly and only then unlocks: no other goroutine runs on that thread
// meanwhile, and a thread that cannot take the daemon's credentials back
// is never unlocked, so the runtime ends it when the goroutine returns.
// The new goroutine usually runs on the requesting goroutine's own thread
// as soon as that one waits for it, so a job costs the credential system
// calls, not a switch to another thread (on this project's machines a
// wake-up of another thread cost 45 us quiet, far more when the CPUs are
// busy; docs/perf-notes.md section 9).
//
// Two kinds of job run on credThreads instead: OS threads locked to one
// goroutine for their whole life, each with a file-system context
// (umask, cwd) of its own. A job that finds itself on the main thread is
// handed to one (the runtime cannot end the main thread, and
// /proc/<pid>/status shows the main thread's credentials), and so is a
// create that needs the caller's umask on the thread (asCreator, umask.go).
// A caller whose credentials a thread would copy exactly, or one with the
// daemon's capabilities on a local file system (likeTheDaemon), needs no
// job: fn runs where the request is served.

// callerCreds is what the kernel judges a file-system access by (fsuid,
// fsgid, groups; CapEff: the caller's effective capabilities in the
// daemon's user namespace).
type callerCreds fscred.Creds

// credsOf reads the caller's supplementary groups and effective capabilities
// from /proc; FUSE already reported its fsuid and fsgid. A caller whose
// thread id FUSE could not report (0: a process in a PID namespace the
// daemon cannot see) is judged by its fsuid and fsgid alone. Capabilities
// count only in the daemon's own user namespace: a process that is root in
// a user namespace of its own has none over the backing files.
//
// Nothing is cached: a thread's groups and capabilities can change at any
// time (setgroups, capset, an execve that gains or drops capabilities, an
// unshare of its user namespace) without a change of the fsuid and fsgid
// that FUSE reports, and no system call tells another process's groups, so
// every request reads them afresh (about 6 us; docs/perf-notes.md section 9).
func credsOf(c Caller) (callerCreds, unix.Errno) {
	cr := callerCreds{FSUID: c.UID, FSGID: c.GID}
	pid := c.Tid
	if pid <= 0 {
		pid = c.Tgid
	}
	if pid == 0 {
		return cr, 0
	}
	if pid < 0 {
		return cr, unix.ESRCH
	}
	groups, capEff, e := readCallerStatus(pid)
	if e != 0 {
		if e == unix.ENOENT {
			return cr, unix.ESRCH // the caller is gone: decide nothing for it
		}
		return cr, e
	}
	cr.Groups = groups
	if capEff == 0 {
		return cr, 0 // no capability to count: its user namespace does not matter
	}
	same, e := inDaemonUserNS(pid)
	if e != 0 {
		return cr, e
	}
	if same {
		cr.CapEff = [2]uint32{uint32(capEff), uint32(capEff >> 32)}
	}
	return cr, 0
}

// statusBufs holds the buffers readCallerStatus reads into.
var statusBufs = sync.Pool{New: func() any { b := make([]byte, 4096); return &b }}

// readCallerStatus reads the Groups: and CapEff: lines of
// /proc/<pid>/status with one open, one read and one close into a pooled
// buffer (procfs.ReadStatus's os.ReadFile, with its fstat and reads to
// EOF, cost twice as much here, and every job by an unprivileged caller
// pays it). The kernel makes the whole file at the first read: a read
// that leaves the buffer part empty has all of it.
func readCallerStatus(pid int) (groups []int, capEff uint64, e unix.Errno) {
	bp := statusBufs.Get().(*[]byte)
	defer statusBufs.Put(bp)
	b, e := readWhole(procfs.Root+"/"+strconv.Itoa(pid)+"/status", bp)
	if e != 0 {
		return nil, 0, e
	}
	if v, ok := procfs.Field(b, "Groups:"); ok {
		for _, f := range bytes.Fields(v) {
			if g, err := strconv.Atoi(string(f)); err == nil {
				groups = append(groups, g)
			}
		}
	}
	v, ok := procfs.Field(b, "CapEff:")
	capEff, err := strconv.ParseUint(string(v), 16, 64)
	if !ok || err != nil {
		return nil, 0, unix.EIO
	}
	return groups, capEff, 0
}

// readWhole reads the proc file p with one read into *bp, growing it (and
// reading again) while the file fills it.
func readWhole(p string, bp *[]byte) ([]byte, unix.Errno) {
	for {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, toErrno(err)
		}
		n, err := unix.Read(fd, *bp)
		unix.Close(fd)
		if err != nil {
			return nil, toErrno(err)
		}
		if n < len(*bp) {
			return (*bp)[:n], 0
		}
		*bp = make([]byte, 2*len(*bp))
	}
}

// daemonUserNS names the daemon's user namespace as readlink of
// /proc/self/ns/user shows it ("user:[INODE]").
var daemonUserNS = sync.OnceValues(func() (string, error) {
	return os.Readlink("/proc/self/ns/user")
})

// inDaemonUserNS says whether the thread pid is in the daemon's user
// namespace (the same nsfs inode; readlink costs 2.4 us here, a stat of
// the link 4.2 us). Anything it cannot tell counts as another namespace:
// the caller is then judged without capabilities.
func inDaemonUserNS(pid int) (bool, unix.Errno) {
	self, err := daemonUserNS()
	if err != nil {
		return false, 0
	}
	var buf [64]byte
	n, err := unix.Readlink("/proc/"+strconv.Itoa(pid)+"/ns/user", buf[:])
	if err != nil {
		if err == unix.ENOENT || err == unix.ESRCH {
			return false, unix.ESRCH
		}
		return false, 0
	}
	return string(buf[:n]) == self, 0
}

// requestCaller is the caller of the request ctx serves, as asCaller
// takes it (no thread-group lookup: only the thread's credentials count).
func requestCaller(ctx context.Context) (Caller, bool) {
	fc, ok := fuseCaller(ctx)
	if !ok {
		return Caller{}, false
	}
	return Caller{Tid: int(fc.Pid), Tgid: int(fc.Pid), UID: fc.Uid, GID: fc.Gid}, true
}

// asRequester runs fn as the caller of the request ctx serves, on the
// node's backing file system; as the daemon itself when ctx names no
// request (a call from inside the daemon or a test that drives a node
// directly).
func (n *node) asRequester(ctx context.Context, fn func() unix.Errno) unix.Errno {
	c, ok := requestCaller(ctx)
	if !ok {
		return fn()
	}
	return asCaller(c, n.pol, fn)
}

// asCaller runs fn with the caller's file-system credentials, on the
// backing file system of pol (nil: unknown).
//
// A daemon that is not root cannot take other credentials: it acts for
// callers of its own uid as itself and refuses the others (EACCES), which
// is never wider than the kernel would allow them.
func asCaller(c Caller, pol *fsPolicy, fn func() unix.Errno) unix.Errno {
	cr, e, self := callerOrSelf(c, pol)
	if e != 0 {
		return e
	}
	if self {
		return fn()
	}
	return runAs(cr, fn)
}

// asCallerWithUmask is asCaller for a create that must run with umask as
// the thread's umask: on a credThread, even for a caller like the daemon
// (whose own threads share the daemon's umask, 0).
func asCallerWithUmask(c Caller, pol *fsPolicy, umask uint32, fn func() unix.Errno) unix.Errno {
	cr, e, self := callerOrSelf(c, pol)
	if e != 0 {
		return e
	}
	if self {
		return runOnCredThread(nil, int(umask), fn)
	}
	return runOnCredThread(&cr, int(umask), fn)
}

// callerOrSelf reads the caller's credentials; self says that fn may run
// as the daemon (where it is): a thread that took them would have the
// daemon's, or the caller is one whose groups cannot matter (likeTheDaemon).
func callerOrSelf(c Caller, pol *fsPolicy) (callerCreds, unix.Errno, bool) {
	if os.Geteuid() != 0 {
		if int(c.UID) != os.Geteuid() {
			return callerCreds{}, unix.EACCES, false
		}
		return callerCreds{}, 0, true
	}
	if pol != nil && !pol.network {
		if self, e := likeTheDaemon(c); e != 0 || self {
			return callerCreds{}, e, self
		}
	}
	cr, e := credsOf(c)
	if e != 0 {
		return cr, e, false
	}
	return cr, 0, cr.isDaemon()
}

// fsCaps are the capabilities that decide, for whoever holds them, every
// check a local file system makes that a caller's supplementary groups
// could decide otherwise: permission bits and ACL group entries
// (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), ownership, the sticky bit and
// ACL changes (CAP_FOWNER), the set-group-ID bit a chmod keeps
// (CAP_FSETID), the group of a chown (CAP_CHOWN).
var fsCaps = [2]uint32{1<<unix.CAP_CHOWN | 1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_DAC_READ_SEARCH | 1<<unix.CAP_FOWNER | 1<<unix.CAP_FSETID, 0}

// likeTheDaemon says, without reading the caller's groups (/proc status,
// 6-9 us), whether a job of the caller may run as the daemon on a local
// file system: the caller is in the daemon's user namespace, has the
// daemon's fsuid and fsgid, and its effective capabilities (capget, 0.3
// us, read afresh every time) within the daemon's permitted set are the
// daemon's effective set, which holds fsCaps. For such a caller no local
// check consults the groups (fsCaps decide instead), so running as the
// daemon gives what the caller's own call gives; a network file system
// sends the groups to its server, so there callerOrSelf reads them.
// (One check outside fsCaps does consult groups: ext4's reserved blocks
// for the resgid group, which the daemon, without CAP_SYS_RESOURCE, uses
// only where its own groups hold resgid.)
func likeTheDaemon(c Caller) (bool, unix.Errno) {
	d, e := daemonCreds()
	if e != 0 || int(c.UID) != d.FSUID || int(c.GID) != d.FSGID || c.Tid <= 0 {
		return false, 0
	}
	for i := range fsCaps {
		if d.Caps[i].Effective&fsCaps[i] != fsCaps[i] {
			return false, 0
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3, Pid: int32(c.Tid)}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		if err == unix.ESRCH {
			return false, unix.ESRCH
		}
		return false, 0
	}
	for i := range data {
		if data[i].Effective&d.Caps[i].Permitted != d.Caps[i].Effective {
			return false, 0
		}
	}
	return inDaemonUserNS(c.Tid)
}

// daemonCreds are the credentials of the daemon's threads (every thread but
// one in a job), read once.
var daemonCreds = sync.OnceValues(fscred.Current)

// isDaemon says whether a thread that took cr would have exactly the
// daemon's credentials: same fsuid, fsgid and groups, and the daemon's
// effective capabilities (assume keeps of the caller's what the daemon
// may have).
func (cr callerCreds) isDaemon() bool {
	d, e := daemonCreds()
	if e != 0 || int(cr.FSUID) != d.FSUID || int(cr.FSGID) != d.FSGID || !slices.Equal(cr.Groups, d.Groups) {
		return false
	}
	for i := range d.Caps {
		if cr.CapEff[i]&d.Caps[i].Permitted != d.Caps[i].Effective {
			return false
		}
	}
	return true
}

// runAs runs fn with cr on a goroutine of its own, locked to the thread it
// runs on for the job (see the top of this file).
func runAs(cr callerCreds, fn func() unix.Errno) unix.Errno {
	done := make(chan unix.Errno, 1)
	go runLocked(cr, fn, done)
	return <-done
}

// runLocked is runAs's goroutine.
func runLocked(cr callerCreds, fn func() unix.Errno, done chan<- unix.Errno) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		runtime.UnlockOSThread()
		done <- runOnCredThread(&cr, -1, fn)
		return
	}
	base, e := daemonCreds()
	if e == 0 {
		if e = fscred.Creds(cr).Assume(base); e == 0 {
			e = fn()
		}
	}
	if re := base.Restore(); re != 0 {
		done <- e
		return // still locked: the runtime ends the thread
	}
	runtime.UnlockOSThread()
	done <- e
}

// credJob is one function to run with a caller's credentials.
type credJob struct {
	cr    *callerCreds // nil: the thread's own (the daemon's)
	umask int          // the thread's umask for the job; -1 leaves it
	fn    func() unix.Errno
	done  chan unix.Errno
}

// credThread serves credJobs one at a time on its own OS thread.
type credThread struct{ jobs chan credJob }

// idleCredThreads holds the threads waiting for work; a thread finding it
// full ends instead, so a burst of jobs leaves at most this many.
var idleCredThreads = make(chan *credThread, 16)

// runOnCredThread runs fn with cr (nil: the daemon's own) on an idle
// credThread, or a new one, with the thread's umask set to umask (-1: left
// as it is).
func runOnCredThread(cr *callerCreds, umask int, fn func() unix.Errno) unix.Errno {
	var t *credThread
	select {
	case t = <-idleCredThreads:
	default:
		t = &credThread{jobs: make(chan credJob, 1)}
		go t.serve()
	}
	done := make(chan unix.Errno, 1)
	t.jobs <- credJob{cr: cr, umask: umask, fn: fn, done: done}
	return <-done
}

// serve runs jobs on this goroutine's OS thread, which it never unlocks:
// returning ends the thread with whatever credentials it has. The thread
// gets a file-system context of its own first (unshare CLONE_FS), so the
// umask a job sets is the thread's alone; nothing a job runs resolves a
// path against the working directory.
func (t *credThread) serve() {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		// The runtime never ends the main thread (it parks it for good
		// instead), and /proc/<pid>/status shows the main thread's
		// credentials: leave it parked here with the daemon's own, and
		// serve from another thread.
		go t.serve()
		return
	}
	broken := toErrno(unix.Unshare(unix.CLONE_FS))
	base, e := fscred.Current()
	if broken == 0 {
		broken = e
	}
	baseUmask := unix.Umask(0)
	unix.Umask(baseUmask)
	for job := range t.jobs {
		if broken != 0 {
			job.done <- broken
			return
		}
		job.done <- t.run(job, base, baseUmask)
		if job.cr != nil {
			if broken = base.Restore(); broken != 0 {
				return
			}
		}
		select {
		case idleCredThreads <- t:
		default:
			return
		}
	}
}

// run runs one job on the thread, whose credentials are base and umask
// baseUmask, and gives the umask back (serve gives the credentials back).
func (t *credThread) run(job credJob, base fscred.State, baseUmask int) unix.Errno {
	if job.umask >= 0 {
		unix.Umask(job.umask)
		defer unix.Umask(baseUmask)
	}
	if job.cr != nil {
		if e := fscred.Creds(*job.cr).Assume(base); e != 0 {
			return e
		}
	}
	return job.fn()
}

// openAsCaller re-opens the inode fd refers to (on the file system of pol)
// with flags, as the caller: EACCES (or whatever the kernel says) where
// the caller could not open it.
func openAsCaller(c Caller, pol *fsPolicy, fd int, flags int) (int, unix.Errno) {
	out := -1
	e := asCaller(c, pol, func() unix.Errno {
		nfd, err := unix.Open(procSelfFd(fd), flags|unix.O_CLOEXEC, 0)
		if err != nil {
			return toErrno(err)
		}
		out = nfd
		return 0
	})
	return out, e
}

// accessAsCaller asks the kernel whether the caller may access the inode fd
// refers to (on the file system of pol) with mask (unix.R_OK, W_OK, X_OK).
func accessAsCaller(c Caller, pol *fsPolicy, fd int, mask uint32) unix.Errno {
	return asCaller(c, pol, func() unix.Errno {
		return toErrno(unix.Faccessat2(fd, "", mask, unix.AT_EACCESS|unix.AT_EMPTY_PATH))
	})
}

package fusefs

import (
	"context"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/internal/procfs"
)

// The daemon acts on backing files as root. Where the kernel must judge
// what a caller may do (creating a name, the user.phx.* xattrs that read
// the file they name, ACCESS without default_permissions), the operation
// runs on a thread whose file-system credentials are the caller's, so mode
// bits, POSIX ACLs, capabilities, set-group-ID directories, ownership,
// quotas and whatever a security module says apply exactly as for the
// caller, and nothing has to be chowned afterwards.
//
// Those threads are credThreads: OS threads locked to one goroutine for
// their whole life, so no other goroutine ever runs on them. Each takes a
// caller's credentials for one operation, then takes the daemon's back and
// checks that it has them exactly; a thread that cannot is ended (its
// goroutine returns still locked, and the runtime ends the thread). The
// main thread, which the runtime cannot end, is never one.

// callerCreds is what the kernel judges a file-system access by.
type callerCreds struct {
	fsuid, fsgid uint32
	groups       []int
	capEff       [2]uint32 // the caller's effective capabilities in the daemon's user namespace
}

// credsOf reads the caller's supplementary groups and effective capabilities
// from /proc; FUSE already reported its fsuid and fsgid. A caller whose
// thread id FUSE could not report (0: a process in a PID namespace the
// daemon cannot see) is judged by its fsuid and fsgid alone. Capabilities
// count only in the daemon's own user namespace: a process that is root in
// a user namespace of its own has none over the backing files.
func credsOf(c Caller) (callerCreds, unix.Errno) {
	cr := callerCreds{fsuid: c.UID, fsgid: c.GID}
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
	st, err := procfs.ReadStatus(pid)
	if err != nil {
		if errs.Errno(err) == unix.ENOENT {
			return cr, unix.ESRCH // the caller is gone: decide nothing for it
		}
		return cr, errs.Errno(err)
	}
	cr.groups = st.Groups
	same, e := inDaemonUserNS(pid)
	if e != 0 {
		return cr, e
	}
	if same {
		cr.capEff = [2]uint32{uint32(st.CapEff), uint32(st.CapEff >> 32)}
	}
	return cr, 0
}

// daemonUserNS is the daemon's user namespace, as stat of /proc/self/ns/user.
var daemonUserNS = sync.OnceValues(func() (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Stat("/proc/self/ns/user", &st)
	return st, err
})

// inDaemonUserNS says whether the thread pid is in the daemon's user
// namespace (same nsfs inode). Anything it cannot tell counts as another
// namespace: the caller is then judged without capabilities.
func inDaemonUserNS(pid int) (bool, unix.Errno) {
	self, err := daemonUserNS()
	if err != nil {
		return false, 0
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(pid)+"/ns/user", &st); err != nil {
		if err == unix.ENOENT || err == unix.ESRCH {
			return false, unix.ESRCH
		}
		return false, 0
	}
	return st.Dev == self.Dev && st.Ino == self.Ino, 0
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

// asRequester runs fn as the caller of the request ctx serves; as the
// daemon itself when ctx names no request (a call from inside the daemon
// or a test that drives a node directly).
func asRequester(ctx context.Context, fn func() unix.Errno) unix.Errno {
	c, ok := requestCaller(ctx)
	if !ok {
		return fn()
	}
	return asCaller(c, fn)
}

// asCaller runs fn on a credThread that has taken the caller's file-system
// credentials.
//
// A daemon that is not root cannot take other credentials: it acts for
// callers of its own uid as itself and refuses the others (EACCES), which
// is never wider than the kernel would allow them.
func asCaller(c Caller, fn func() unix.Errno) unix.Errno {
	if os.Geteuid() != 0 {
		if int(c.UID) != os.Geteuid() {
			return unix.EACCES
		}
		return fn()
	}
	cr, e := credsOf(c)
	if e != 0 {
		return e
	}
	if cr.isDaemon() {
		return fn() // a thread taking cr would have the daemon's credentials
	}
	return runAs(cr, fn)
}

// daemonCreds are the credentials of the daemon's threads (every thread but
// a credThread in a job), read once.
var daemonCreds = sync.OnceValues(threadCreds)

// isDaemon says whether a thread that took cr would have exactly the
// daemon's credentials: same fsuid, fsgid and groups, and the daemon's
// effective capabilities (assume keeps of the caller's what the daemon
// may have).
func (cr callerCreds) isDaemon() bool {
	d, e := daemonCreds()
	if e != 0 || int(cr.fsuid) != d.fsuid || int(cr.fsgid) != d.fsgid || !slices.Equal(cr.groups, d.groups) {
		return false
	}
	for i := range d.caps {
		if cr.capEff[i]&d.caps[i].Permitted != d.caps[i].Effective {
			return false
		}
	}
	return true
}

// credJob is one function to run with a caller's credentials.
type credJob struct {
	cr   callerCreds
	fn   func() unix.Errno
	done chan unix.Errno
}

// credThread serves credJobs one at a time on its own OS thread.
type credThread struct{ jobs chan credJob }

// idleCredThreads holds the threads waiting for work; a thread finding it
// full ends instead, so a burst of creates leaves at most this many.
var idleCredThreads = make(chan *credThread, 16)

// runAs runs fn with cr on an idle credThread, or a new one.
func runAs(cr callerCreds, fn func() unix.Errno) unix.Errno {
	var t *credThread
	select {
	case t = <-idleCredThreads:
	default:
		t = &credThread{jobs: make(chan credJob, 1)}
		go t.serve()
	}
	done := make(chan unix.Errno, 1)
	t.jobs <- credJob{cr: cr, fn: fn, done: done}
	return <-done
}

// serve runs jobs on this goroutine's OS thread, which it never unlocks:
// returning ends the thread with whatever credentials it has.
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
	base, e := threadCreds()
	for job := range t.jobs {
		if e != 0 {
			job.done <- e
			return
		}
		e = job.cr.assume()
		if e == 0 {
			e = job.fn()
		}
		job.done <- e
		if e = base.restore(); e != 0 {
			return
		}
		select {
		case idleCredThreads <- t:
		default:
			return
		}
	}
}

// threadState is a thread's credentials as the kernel reports them.
type threadState struct {
	fsuid, fsgid int
	groups       []int
	caps         [2]unix.CapUserData
}

// threadCreds reads the calling thread's credentials.
func threadCreds() (threadState, unix.Errno) {
	var s threadState
	s.fsuid, _ = unix.SetfsuidRetUid(-1) // -1 changes nothing and reports the current value
	s.fsgid, _ = unix.SetfsgidRetGid(-1)
	g, err := unix.Getgroups()
	if err != nil {
		return s, toErrno(err)
	}
	s.groups = g
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capget(&hdr, &s.caps[0]); err != nil {
		return s, toErrno(err)
	}
	return s, 0
}

func (s threadState) equal(o threadState) bool {
	return s.fsuid == o.fsuid && s.fsgid == o.fsgid && slices.Equal(s.groups, o.groups) && s.caps == o.caps
}

// restore gives the calling thread back the credentials s and checks that
// it has them: first the effective capabilities (raising them within the
// permitted set needs none), which setgroups, setfsgid and setfsuid need;
// then the capabilities again, as a change of fsuid to 0 raises some.
func (s threadState) restore() unix.Errno {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	caps := s.caps
	if err := unix.Capset(&hdr, &caps[0]); err != nil {
		return toErrno(err)
	}
	if err := unix.Setgroups(s.groups); err != nil {
		return toErrno(err)
	}
	unix.Setfsgid(s.fsgid)
	unix.Setfsuid(s.fsuid)
	caps = s.caps
	if err := unix.Capset(&hdr, &caps[0]); err != nil {
		return toErrno(err)
	}
	now, e := threadCreds()
	if e != 0 {
		return e
	}
	if !now.equal(s) {
		return unix.EPERM
	}
	return 0
}

// assume gives the calling thread the credentials: groups, fsgid, fsuid,
// then the caller's effective capabilities (a change of fsuid away from 0
// drops the file-system ones; capset puts back exactly the caller's).
func (cr callerCreds) assume() unix.Errno {
	if err := unix.Setgroups(cr.groups); err != nil {
		return toErrno(err)
	}
	// setfsuid and setfsgid report no error; read the value back instead.
	unix.Setfsgid(int(cr.fsgid))
	unix.Setfsuid(int(cr.fsuid))
	if g, _ := unix.SetfsgidRetGid(-1); g != int(cr.fsgid) {
		return unix.EPERM
	}
	if u, _ := unix.SetfsuidRetUid(-1); u != int(cr.fsuid) {
		return unix.EPERM
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return toErrno(err)
	}
	for i := range data {
		data[i].Effective = cr.capEff[i] & data[i].Permitted
	}
	return toErrno(unix.Capset(&hdr, &data[0]))
}

// openAsCaller re-opens the inode fd refers to with flags, as the caller:
// EACCES (or whatever the kernel says) where the caller could not open it.
func openAsCaller(c Caller, fd int, flags int) (int, unix.Errno) {
	out := -1
	e := asCaller(c, func() unix.Errno {
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
// refers to with mask (unix.R_OK, W_OK, X_OK).
func accessAsCaller(c Caller, fd int, mask uint32) unix.Errno {
	return asCaller(c, func() unix.Errno {
		return toErrno(unix.Faccessat2(fd, "", mask, unix.AT_EACCESS|unix.AT_EMPTY_PATH))
	})
}

package fusefs

import (
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/internal/procfs"
)

// The daemon acts on backing files as root. Where it must decide whether a
// caller may do something that the kernel has not already checked on the
// FUSE inode (the user.phx.* xattrs read the file they name, ACCESS without
// default_permissions), it asks the kernel itself: the operation runs on a
// thread whose file-system credentials are the caller's, so mode bits, POSIX
// ACLs, capabilities and whatever a security module says are applied
// exactly as for the caller.

// callerCreds is what the kernel judges a file-system access by.
type callerCreds struct {
	fsuid, fsgid uint32
	groups       []int
	capEff       [2]uint32 // the caller's effective capabilities (CapEff)
}

// credsOf reads the caller's supplementary groups and effective capabilities
// from /proc; FUSE already reported its fsuid and fsgid.
func credsOf(c Caller) (callerCreds, unix.Errno) {
	cr := callerCreds{fsuid: c.UID, fsgid: c.GID}
	pid := c.Tid
	if pid <= 0 {
		pid = c.Tgid
	}
	if pid <= 0 {
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
	cr.capEff = [2]uint32{uint32(st.CapEff), uint32(st.CapEff >> 32)}
	return cr, 0
}

// asCaller runs fn on a new OS thread that takes the caller's file-system
// credentials. The thread is never given back to the Go scheduler (the
// goroutine exits still locked to it, so the runtime ends the thread):
// no other goroutine ever runs with the caller's credentials.
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
	done := make(chan unix.Errno, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if e := cr.assume(); e != 0 {
			done <- e
			return
		}
		done <- fn()
	}()
	return <-done
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

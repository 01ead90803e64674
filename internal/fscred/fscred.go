// Package fscred sets the file-system credentials of one thread: the
// fsuid, fsgid, supplementary groups and effective capabilities the kernel
// judges a file-system access by.
//
// The daemon runs as root and acts for callers. Where the kernel must
// judge what a caller may do, a thread takes the caller's credentials for
// the job (fusefs/ascaller.go). Where nothing is judged but the writer's
// identity still counts, a write of file data takes the writer identity
// (Writer): ext2/3/4 (and f2fs) lend the blocks they reserve to a writer
// whose fsuid is the reserve's owner, root by default, so a root daemon
// writing with fsuid 0 for an ordinary caller would fill the space the
// file system keeps for root.
//
// Credentials are per thread in Linux and a goroutine may move between
// threads: every function here acts on the calling thread, and its caller
// keeps the goroutine locked to it (runtime.LockOSThread) from before it
// takes credentials until after it has them back; a thread whose
// credentials could not be given back is never unlocked, so the runtime
// ends it with its goroutine.
package fscred

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// State is a thread's credentials as the kernel reports them.
type State struct {
	FSUID, FSGID int
	Groups       []int
	Caps         [2]unix.CapUserData
}

// Current reads the calling thread's credentials.
func Current() (State, unix.Errno) {
	var s State
	s.FSUID, _ = unix.SetfsuidRetUid(-1) // -1 changes nothing and reports the current value
	s.FSGID, _ = unix.SetfsgidRetGid(-1)
	g, err := unix.Getgroups()
	if err != nil {
		return s, errno(err)
	}
	s.Groups = g
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capget(&hdr, &s.Caps[0]); err != nil {
		return s, errno(err)
	}
	return s, 0
}

// Equal says whether two states are the same credentials.
func (s State) Equal(o State) bool {
	return s.FSUID == o.FSUID && s.FSGID == o.FSGID && slices.Equal(s.Groups, o.Groups) && s.Caps == o.Caps
}

// Effective is s's effective capability set, as Creds carry one.
func (s State) Effective() [2]uint32 {
	return [2]uint32{s.Caps[0].Effective, s.Caps[1].Effective}
}

// Restore gives the calling thread back the credentials s and checks that
// it has them: first the effective capabilities (raising them within the
// permitted set needs none), which setgroups, setfsgid and setfsuid need;
// then the capabilities again, as a change of fsuid to 0 raises some.
func (s State) Restore() unix.Errno {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	caps := s.Caps
	if err := unix.Capset(&hdr, &caps[0]); err != nil {
		return errno(err)
	}
	if err := unix.Setgroups(s.Groups); err != nil {
		return errno(err)
	}
	unix.Setfsgid(s.FSGID)
	unix.Setfsuid(s.FSUID)
	caps = s.Caps
	if err := unix.Capset(&hdr, &caps[0]); err != nil {
		return errno(err)
	}
	now, e := Current()
	if e != 0 {
		return e
	}
	if !now.Equal(s) {
		return unix.EPERM
	}
	return 0
}

// Creds are credentials a thread takes: its fsuid, fsgid and groups, and
// the effective capabilities it keeps (within its permitted set).
type Creds struct {
	FSUID, FSGID uint32
	Groups       []int
	CapEff       [2]uint32
}

// Assume gives the calling thread, whose credentials are base, c: groups,
// fsgid, fsuid, then c's effective capabilities within base's permitted
// set (a change of fsuid away from 0 drops the file-system ones; capset
// puts back exactly c's).
func (c Creds) Assume(base State) unix.Errno {
	if err := unix.Setgroups(c.Groups); err != nil {
		return errno(err)
	}
	// setfsuid and setfsgid report no error; read the value back instead.
	unix.Setfsgid(int(c.FSGID))
	unix.Setfsuid(int(c.FSUID))
	if g, _ := unix.SetfsgidRetGid(-1); g != int(c.FSGID) {
		return unix.EPERM
	}
	if u, _ := unix.SetfsuidRetUid(-1); u != int(c.FSUID) {
		return unix.EPERM
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := base.Caps
	for i := range data {
		data[i].Effective = c.CapEff[i] & data[i].Permitted
	}
	return errno(unix.Capset(&hdr, &data[0]))
}

// Writer is the identity a root daemon writes file data with where it
// cannot write as the caller: the kernel's overflow uid and gid
// (/proc/sys/fs/overflowuid, overflowgid: 65534, "nobody", by default),
// which own nothing and for which no file system reserves blocks, no
// supplementary group, and base's effective capabilities (permission was
// judged when the file was opened; nothing a write checks is decided by
// them but the set-user-ID bits the write clears, which stay the
// daemon's).
func Writer(base State) Creds {
	ids := overflow()
	return Creds{FSUID: ids[0], FSGID: ids[1], Groups: []int{}, CapEff: base.Effective()}
}

var overflow = sync.OnceValue(func() [2]uint32 {
	ids := [2]uint32{65534, 65534}
	for i, name := range []string{"overflowuid", "overflowgid"} {
		b, err := os.ReadFile("/proc/sys/fs/" + name)
		if err != nil {
			continue
		}
		if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32); err == nil {
			ids[i] = uint32(v)
		}
	}
	return ids
})

// As runs fn on the calling thread with c, then gives the thread its
// credentials back: the assume's or the restore's errno, or 0. The caller
// keeps its goroutine locked to the thread throughout, and for good when
// the restore failed (the thread may still have c).
func As(c Creds, fn func()) unix.Errno {
	base, e := Current()
	if e != 0 {
		return e
	}
	if e = c.Assume(base); e == 0 {
		fn()
	}
	if re := base.Restore(); re != 0 {
		return re
	}
	return e
}

// WithIDs runs fn on the calling thread, whose credentials are base with
// fsuid and fsgid 0, with fsuid uid and fsgid gid alone changed: all a
// write of file data is judged by (Writer says why), in five system calls
// and a capget where As makes nineteen (here each costs about a
// microsecond and a half; As about 30 us). The kernel drops the
// file-system capabilities while the fsuid is not 0 and raises them again
// from the permitted set when it is 0 again. took says that fn ran with
// uid and gid; back, that the thread has base's fsuid and capabilities
// again (the caller keeps its goroutine locked to the thread for good
// when not).
func WithIDs(base State, uid, gid uint32, fn func()) (took, back bool) {
	TakeIDs(base, uid, gid, false)
	fn()
	return GiveIDsBack(base, uid, gid)
}

// TakeIDs gives the calling thread, whose credentials are base (fsuid and
// fsgid 0), fsuid uid and fsgid gid; keepCaps puts back base's
// capabilities, which the kernel drops with the fsuid (a third system
// call). GiveIDsBack undoes it and says whether it held.
func TakeIDs(base State, uid, gid uint32, keepCaps bool) {
	unix.Setfsgid(int(gid))
	unix.Setfsuid(int(uid))
	if keepCaps {
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		caps := base.Caps
		unix.Capset(&hdr, &caps[0])
	}
}

// GiveIDsBack gives the calling thread base's fsuid, fsgid and
// capabilities back after TakeIDs(base, uid, gid): took says that the
// thread had uid and gid, back that it has base's again.
func GiveIDsBack(base State, uid, gid uint32) (took, back bool) {
	// Each call reports the value it replaces: what the thread had.
	u, _ := unix.SetfsuidRetUid(base.FSUID)
	g, _ := unix.SetfsgidRetGid(base.FSGID)
	took = u == int(uid) && g == int(gid)
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if unix.Capget(&hdr, &caps[0]) != nil {
		return took, false
	}
	if caps != base.Caps {
		// The raise gave back the permitted file-system capabilities,
		// not exactly base's effective ones: put base's back.
		caps = base.Caps
		if unix.Capset(&hdr, &caps[0]) != nil || unix.Capget(&hdr, &caps[0]) != nil || caps != base.Caps {
			return took, false
		}
	}
	nu, _ := unix.SetfsuidRetUid(-1)
	return took, nu == base.FSUID
}

func errno(err error) unix.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(unix.Errno); ok {
		return e
	}
	return unix.EIO
}

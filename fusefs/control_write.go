package fusefs

import (
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/internal/procfs"
)

// An ioctl write is the daemon's pwrite, done as root. To the caller it
// must look like its own write(2) through the mount:
//
//   - RLIMIT_FSIZE: an extent that starts at or past the caller's limit
//     fails with EFBIG and the calling thread gets SIGXFSZ; an extent that
//     crosses it is cut at the limit (a short result), as
//     generic_write_checks does;
//   - set-user-ID, and set-group-ID with group execute, are cleared before
//     the write unless the caller has CAP_FSETID, as file_remove_privs does
//     through the mount (the daemon has CAP_FSETID, so its own write keeps
//     them; file capabilities go with any write, the daemon's too);
//   - afterwards the kernel forgets its cached pages and attributes of the
//     written range (OpenFile.Changed), so readers through the mount see
//     the new bytes and size at once.

// capFsetid is CAP_FSETID's bit in a capability set.
const capFsetid = 4

// limitWrite applies the caller's RLIMIT_FSIZE to the extents that are not
// refused yet: refuse gets EFBIG, reqs get cut. It reports whether an
// extent was refused for the limit (the caller is then sent SIGXFSZ).
func limitWrite(c Caller, reqs []client.IOReq, refuse []unix.Errno) bool {
	if c.Tgid <= 0 {
		return false
	}
	limit, err := procfs.FileSizeLimit(c.Tgid)
	if err != nil || limit == procfs.Unlimited {
		return false
	}
	over := false
	for i := range reqs {
		r := &reqs[i]
		if refuse[i] != 0 || r.Length == 0 {
			continue
		}
		switch {
		case r.FileOffset >= limit:
			refuse[i] = unix.EFBIG
			over = true
		case r.Length > limit-r.FileOffset:
			r.Length = limit - r.FileOffset
		}
	}
	return over
}

// signalFileSize sends SIGXFSZ to the calling thread, as write(2) does when
// it refuses a write for RLIMIT_FSIZE.
func signalFileSize(c Caller) {
	if c.Tgid > 0 && c.Tid > 0 {
		unix.Tgkill(c.Tgid, c.Tid, unix.SIGXFSZ)
	}
}

// removePrivs clears what a write by the caller clears and the daemon's
// write would not: set-user-ID, and set-group-ID where group execute is
// set, when the caller lacks CAP_FSETID.
func removePrivs(c Caller, fd int) unix.Errno {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return toErrno(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0
	}
	mode := st.Mode & 07777
	kill := mode & unix.S_ISUID
	if mode&(unix.S_ISGID|unix.S_IXGRP) == unix.S_ISGID|unix.S_IXGRP {
		kill |= unix.S_ISGID
	}
	if kill == 0 {
		return 0
	}
	cr, e := credsOf(c)
	if e != 0 {
		return e
	}
	if cr.CapEff[0]&(1<<capFsetid) != 0 {
		return 0
	}
	return toErrno(unix.Fchmod(fd, mode&^kill))
}

// writtenSpan is the file range that results say was written: [lo, hi).
func writtenSpan(reqs []client.IOReq, res []int64) (lo, hi uint64) {
	lo = ^uint64(0)
	for i, r := range reqs {
		if res[i] > 0 {
			lo = min(lo, r.FileOffset)
			hi = max(hi, r.FileOffset+uint64(res[i]))
		}
	}
	return lo, hi
}

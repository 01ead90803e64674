// Package procfs reads the few facts the daemon needs about other
// processes from /proc: a thread's group, groups and capabilities, and a
// process's resource limits. /proc/<pid>/status and /proc/<pid>/limits are
// world-readable, so no capability is needed to read them (prlimit(2) of
// another user's process needs CAP_SYS_RESOURCE: FileSizeLimit asks it
// first, for speed, and reads the file where it may not).
package procfs

import (
	"bytes"
	"math"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// Root is where procfs is mounted; tests point it elsewhere.
var Root = "/proc"

// Status is what this package reads of /proc/<pid>/status.
type Status struct {
	Tgid   int
	Groups []int
	CapEff uint64 // effective capabilities, bit n = capability n
	EUID   int    // effective uid; -1 when the file has no Uid line
}

// ReadStatus reads /proc/<pid>/status (pid may be a thread id).
func ReadStatus(pid int) (Status, error) {
	var st Status
	b, err := os.ReadFile(Root + "/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return st, errs.Wrapf(err, "procfs: status of %d", pid)
	}
	v, ok := Field(b, "Tgid:")
	if st.Tgid, err = strconv.Atoi(string(v)); !ok || err != nil {
		return st, errs.New(unix.EIO, "procfs: status of %d: no Tgid", pid)
	}
	if v, ok := Field(b, "Groups:"); ok {
		for _, f := range bytes.Fields(v) {
			if n, err := strconv.Atoi(string(f)); err == nil {
				st.Groups = append(st.Groups, n)
			}
		}
	}
	v, ok = Field(b, "CapEff:")
	if st.CapEff, err = strconv.ParseUint(string(v), 16, 64); !ok || err != nil {
		return st, errs.New(unix.EIO, "procfs: status of %d: no CapEff", pid)
	}
	st.EUID = -1
	if v, ok := Field(b, "Uid:"); ok {
		if f := bytes.Fields(v); len(f) >= 2 { // real, effective, saved, filesystem
			if n, err := strconv.Atoi(string(f[1])); err == nil {
				st.EUID = n
			}
		}
	}
	return st, nil
}

// Field returns the value of a "Name:\tvalue" line of a status file.
func Field(b []byte, name string) ([]byte, bool) {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if bytes.HasPrefix(line, []byte(name)) {
			return bytes.TrimSpace(line[len(name):]), true
		}
	}
	return nil, false
}

// Unlimited is a limit of "unlimited".
const Unlimited = math.MaxUint64

// prlimit is prlimit(2); tests stand in for it.
var prlimit = unix.Prlimit

// FileSizeLimit is process pid's soft RLIMIT_FSIZE: one prlimit(2) call
// (every ioctl write asks, and reading /proc/<pid>/limits cost it tens of
// microseconds), or, where that is not allowed (another user's process,
// no CAP_SYS_RESOURCE), /proc/<pid>/limits.
func FileSizeLimit(pid int) (uint64, error) {
	var rl unix.Rlimit
	err := prlimit(pid, unix.RLIMIT_FSIZE, nil, &rl)
	switch {
	case err == nil && rl.Cur == unix.RLIM_INFINITY:
		return Unlimited, nil
	case err == nil:
		return rl.Cur, nil
	case err == unix.EPERM:
		return SoftLimit(pid, "Max file size")
	}
	return 0, errs.Wrapf(err, "procfs: RLIMIT_FSIZE of %d", pid)
}

// SoftLimit reads the soft limit named as in /proc/<pid>/limits (for
// example "Max file size") of process pid.
func SoftLimit(pid int, name string) (uint64, error) {
	b, err := os.ReadFile(Root + "/" + strconv.Itoa(pid) + "/limits")
	if err != nil {
		return 0, errs.Wrapf(err, "procfs: limits of %d", pid)
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte(name))
		if !ok || len(rest) == 0 || rest[0] != ' ' {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) == 0 {
			break
		}
		if string(f[0]) == "unlimited" {
			return Unlimited, nil
		}
		if n, err := strconv.ParseUint(string(f[0]), 10, 64); err == nil {
			return n, nil
		}
		break
	}
	return 0, errs.New(unix.EIO, "procfs: limits of %d: no %q", pid, name)
}

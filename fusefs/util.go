package fusefs

import (
	"bytes"
	"context"
	"log"
	"os"
	"strconv"
	"sync"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// procSelfFd names a descriptor of this process as a path that re-opens
// (or stats, or chmods) the very inode it refers to.
func procSelfFd(fd int) string {
	return "/proc/self/fd/" + strconv.Itoa(fd)
}

// toErrno maps an error to the errno FUSE returns.
func toErrno(err error) unix.Errno {
	if err == nil {
		return 0
	}
	return fs.ToErrno(err)
}

// fuseCaller extracts the raw caller of a request.
func fuseCaller(ctx context.Context) (fuse.Caller, bool) {
	if c, ok := ctx.(*fuse.Context); ok {
		return c.Caller, true
	}
	if c, ok := fuse.FromContext(ctx); ok {
		return *c, true
	}
	return fuse.Caller{}, false
}

// callerOf is the identity of a request's caller, with the thread id
// mapped to its thread group.
func callerOf(ctx context.Context) Caller {
	fc, ok := fuseCaller(ctx)
	if !ok {
		return Caller{Tgid: -1, Tid: -1, UID: ^uint32(0), GID: ^uint32(0)}
	}
	c := Caller{Tid: int(fc.Pid), UID: fc.Uid, GID: fc.Gid}
	c.Tgid = tgidOf(c.Tid)
	return c
}

// tgidCache remembers tid -> tgid: reading /proc/<tid>/status costs
// about 30 us here, once per ioctl, xattr and open. A cached entry is
// checked with a stat of /proc/<tgid>/task/<tid> (about 2 us), which
// exists exactly while tid is a live thread of tgid, so a tid reused by
// another process after its thread died is never mapped to the old group.
var tgidCache struct {
	sync.Mutex
	m map[int]int
}

const tgidCacheMax = 4096

// tgidOf maps a thread id to its thread-group id; 0 for the kernel, -1
// when the thread is gone.
func tgidOf(tid int) int {
	if tid <= 0 {
		return tid
	}
	tgidCache.Lock()
	g, ok := tgidCache.m[tid]
	tgidCache.Unlock()
	if ok {
		var st unix.Stat_t
		if unix.Stat("/proc/"+strconv.Itoa(g)+"/task/"+strconv.Itoa(tid), &st) == nil {
			return g
		}
	}
	g = tgidFromStatus(tid)
	tgidCache.Lock()
	if g > 0 {
		if tgidCache.m == nil || len(tgidCache.m) >= tgidCacheMax {
			tgidCache.m = make(map[int]int)
		}
		tgidCache.m[tid] = g
	} else {
		delete(tgidCache.m, tid)
	}
	tgidCache.Unlock()
	return g
}

// tgidFromStatus reads the Tgid: line of /proc/<tid>/status.
func tgidFromStatus(tid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		return -1
	}
	if v, ok := statusField(b, "Tgid:"); ok {
		if n, err := strconv.Atoi(string(v)); err == nil {
			return n
		}
	}
	return -1
}

// statusField returns the value of a "Name:\tvalue" line of a status file.
func statusField(b []byte, name string) ([]byte, bool) {
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

// callerGroups returns the supplementary groups of the caller's process.
func callerGroups(c Caller) []uint32 {
	pid := c.Tgid
	if pid <= 0 {
		pid = c.Tid
	}
	if pid <= 0 {
		return nil
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil
	}
	v, ok := statusField(b, "Groups:")
	if !ok {
		return nil
	}
	var out []uint32
	for _, f := range bytes.Fields(v) {
		if n, err := strconv.ParseUint(string(f), 10, 32); err == nil {
			out = append(out, uint32(n))
		}
	}
	return out
}

// mayAccess applies the classic permission bits of st to the caller for
// mask (unix.R_OK, W_OK, X_OK). Root may read and write anything and
// execute what has an execute bit. POSIX ACLs are not evaluated.
func mayAccess(st *unix.Stat_t, c Caller, mask uint32) bool {
	mode := st.Mode
	if c.UID == 0 {
		if mask&unix.X_OK != 0 && mode&unix.S_IFMT != unix.S_IFDIR && mode&0111 == 0 {
			return false
		}
		return true
	}
	var bits uint32
	switch {
	case c.UID == st.Uid:
		bits = (mode >> 6) & 7
	case c.GID == st.Gid || inGroups(st.Gid, c):
		bits = (mode >> 3) & 7
	default:
		bits = mode & 7
	}
	return bits&mask == mask
}

func inGroups(gid uint32, c Caller) bool {
	for _, g := range callerGroups(c) {
		if g == gid {
			return true
		}
	}
	return false
}

// accessMask is the access an open with flags needs.
func accessMask(flags int) uint32 {
	var m uint32
	switch flags & unix.O_ACCMODE {
	case unix.O_RDONLY:
		m = unix.R_OK
	case unix.O_WRONLY:
		m = unix.W_OK
	default:
		m = unix.R_OK | unix.W_OK
	}
	if flags&unix.O_TRUNC != 0 {
		m |= unix.W_OK
	}
	return m
}

// logAdapter gives go-fuse a *log.Logger that writes to logrus at debug
// level.
func logAdapter(e *logrus.Entry) *log.Logger {
	return log.New(e.WriterLevel(logrus.DebugLevel), "go-fuse: ", 0)
}

package fusefs

import (
	"context"
	"log"
	"strconv"
	"sync"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/procfs"
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
	st, err := procfs.ReadStatus(tid)
	if err != nil {
		return -1
	}
	return st.Tgid
}

// logAdapter gives go-fuse a *log.Logger that writes to logrus at debug
// level.
func logAdapter(e *logrus.Entry) *log.Logger {
	return log.New(e.WriterLevel(logrus.DebugLevel), "go-fuse: ", 0)
}

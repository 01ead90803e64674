package fusefs

import (
	"context"
	"sync"

	"golang.org/x/sys/unix"
)

// Every file or directory open through the mount holds one of the daemon's
// descriptors, and the daemon's table is every user's: natively, a user
// who opens a million files fills its own processes' tables; through the
// mount, the daemon's, and then every open, LOOKUP and REGISTER, by any
// user, failed with EMFILE. So each uid but root holds at most a quarter
// of the daemon's RLIMIT_NOFILE in open handles (EMFILE past it, as its
// own table would say; fdbudget.go shares the rest out). Its lock owners'
// descriptors (locks.go) count here too.

// userHandles counts the open handles of each uid but root.
type userHandles struct {
	mu sync.Mutex
	n  map[uint32]int
}

// handleRoom is how many handles one user may hold open: a quarter of the
// daemon's RLIMIT_NOFILE, read at each open (prlimit may change it). A
// variable: tests stand in for it.
var handleRoom = func() int { return shareOfNoFile(4, 16) }

// handleHolder is who a handle counts for: held is false for root's (and
// for a request that is not the kernel's), which are not counted.
type handleHolder struct {
	uid  uint32
	held bool
}

// takeHandle counts an open by ctx's caller, or refuses it with EMFILE
// when that user already holds handleRoom handles. The caller gives it
// back (giveHandle) when the open fails or the handle is released.
func (f *FS) takeHandle(ctx context.Context) (handleHolder, unix.Errno) {
	fc, ok := fuseCaller(ctx)
	if !ok || fc.Uid == 0 {
		return handleHolder{}, 0
	}
	u := &f.userHandles
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n[fc.Uid] >= handleRoom() {
		return handleHolder{}, unix.EMFILE
	}
	if u.n == nil {
		u.n = map[uint32]int{}
	}
	u.n[fc.Uid]++
	return handleHolder{uid: fc.Uid, held: true}, 0
}

// giveHandle takes back what takeHandle counted.
func (f *FS) giveHandle(h handleHolder) {
	if !h.held {
		return
	}
	u := &f.userHandles
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n[h.uid]--; u.n[h.uid] <= 0 {
		delete(u.n, h.uid)
	}
}

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
// user, failed with EMFILE. So each uid but root holds at most an eighth
// of the daemon's RLIMIT_NOFILE in open handles (EMFILE past it, as its
// own table would say), and all of them together at most a quarter
// (ENFILE past it, as a full system-wide table would say): four users at
// their limit no longer fill the table, and root and the daemon keep the
// rest (fdbudget.go shares it out). A user's lock owners' descriptors
// (locks.go) count here too.

// userHandles counts the open handles of each uid but root, and of all of
// them.
type userHandles struct {
	mu  sync.Mutex
	n   map[uint32]int
	all int
}

// handleRoom is how many handles one user may hold open, and
// handleRoomAll how many all users but root may: an eighth and a quarter
// of the daemon's RLIMIT_NOFILE, read at each open (prlimit may change
// it). Variables: tests stand in for them.
var (
	handleRoom    = func() int { return shareOfNoFile(8, 16) }
	handleRoomAll = func() int { return shareOfNoFile(4, 32) }
)

// handleHolder is who a handle counts for: held is false for root's (and
// for a request that is not the kernel's), which are not counted.
type handleHolder struct {
	uid  uint32
	held bool
}

// takeHandle counts an open by ctx's caller, or refuses it with EMFILE
// when that user already holds handleRoom handles, ENFILE when all users
// but root hold handleRoomAll. The caller gives it back (giveHandle) when
// the open fails or the handle is released.
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
	if u.all >= handleRoomAll() {
		return handleHolder{}, unix.ENFILE
	}
	if u.n == nil {
		u.n = map[uint32]int{}
	}
	u.n[fc.Uid]++
	u.all++
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
	u.all--
	if u.n[h.uid]--; u.n[h.uid] <= 0 {
		delete(u.n, h.uid)
	}
}

package fusefs

import (
	"context"
	"sync"

	"golang.org/x/sys/unix"
)

// A strided batch is 64 KiB of ioctl at most, but the daemon serves it as
// one planned transfer a piece: about 230 bytes of its memory for each of
// up to client.MaxPieces pieces, 15 MiB an ioctl, for as long as it is
// served. One bound an ioctl does not bound many: a process of uid 65534
// with 1,000 threads, each with a 65,536-piece batch in flight, took the
// daemon to 9 GB, and 3,000 would have taken all of this machine's memory.
// So the pieces the daemon serves at once (a plain batch's extents count
// as pieces: 409 an ioctl) are bounded, for each uid but root
// (ControlConfig.MaxPiecesInFlightPerUser) and for all callers
// (MaxPiecesInFlight): a batch past either waits, holding nothing but the
// 64 KiB it came in, until others end; a signal to the caller ends the
// wait with EINTR. A batch larger than a bound runs when nothing else
// counts against it.

// pieceGate counts the pieces of the batches served now.
type pieceGate struct {
	maxAll, maxUser int64

	mu   sync.Mutex
	all  int64
	user map[uint32]int64
	// left is closed, and replaced, whenever a batch leaves: the waiting
	// look again.
	left chan struct{}
}

func newPieceGate(maxAll, maxUser int64) *pieceGate {
	return &pieceGate{maxAll: maxAll, maxUser: maxUser, user: map[uint32]int64{}, left: make(chan struct{})}
}

// enter waits until n more pieces of uid fit, counts them and returns
// what gives them back; EINTR, counting nothing, when ctx ends first.
func (g *pieceGate) enter(ctx context.Context, uid uint32, n int64) (func(), unix.Errno) {
	for {
		g.mu.Lock()
		if g.fits(uid, n) {
			g.all += n
			if uid != 0 {
				g.user[uid] += n
			}
			g.mu.Unlock()
			return func() { g.leave(uid, n) }, 0
		}
		left := g.left
		g.mu.Unlock()
		select {
		case <-left:
		case <-ctx.Done():
			return nil, unix.EINTR
		}
	}
}

// fits says whether n more pieces of uid may run now; g.mu is held.
func (g *pieceGate) fits(uid uint32, n int64) bool {
	if g.all > 0 && g.all+n > g.maxAll {
		return false
	}
	u := g.user[uid]
	return uid == 0 || u == 0 || u+n <= g.maxUser
}

func (g *pieceGate) leave(uid uint32, n int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.all -= n
	if uid != 0 {
		if g.user[uid] -= n; g.user[uid] <= 0 {
			delete(g.user, uid)
		}
	}
	close(g.left)
	g.left = make(chan struct{})
}

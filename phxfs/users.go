package phxfs

import "sync"

// users counts what holds an object that is closed by waiting for its
// holders: a registration (the transfers using it) and a device (the I/O
// on any of its registrations). Once closing begins nothing new may hold
// it. Every users is guarded by Lib.mu, and Lib.changed is broadcast when a
// count drops to zero.
type users struct {
	n       int
	closing bool
}

// hold adds a holder; false once closing began.
func (u *users) hold() bool {
	if u.closing {
		return false
	}
	u.n++
	return true
}

// release drops a holder and wakes drain when it was the last.
func (u *users) release(changed *sync.Cond) {
	if u.n--; u.n == 0 {
		changed.Broadcast()
	}
}

// drain begins closing and waits (in changed, whose lock the caller holds)
// until no holder is left.
func (u *users) drain(changed *sync.Cond) {
	u.closing = true
	for u.n > 0 {
		changed.Wait()
	}
}

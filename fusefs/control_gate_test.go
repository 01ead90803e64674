package fusefs

import (
	"context"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPieceGate: the strided batches' pieces served at once stay within
// each uid's bound (root's only within the mount's) and the mount's; a
// batch past one waits until enough leave, a batch larger than a bound
// runs once nothing else counts against it, and a wait that its request's
// interruption ends gets EINTR and counts nothing.
func TestPieceGate(t *testing.T) {
	g := newPieceGate(100, 50)
	bg := context.Background()
	enter := func(uid uint32, n int64) (func(), unix.Errno) { return g.enter(bg, uid, n) }
	entered := func(uid uint32, n int64) <-chan func() {
		ch := make(chan func(), 1)
		go func() {
			release, e := enter(uid, n)
			if e != 0 {
				t.Errorf("uid %d, %d pieces: %v", uid, n, e)
			}
			ch <- release
		}()
		return ch
	}
	waiting := func(what string, ch <-chan func()) {
		t.Helper()
		select {
		case <-ch:
			t.Fatalf("%s ran at once", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
	ran := func(what string, ch <-chan func()) func() {
		t.Helper()
		select {
		case release := <-ch:
			return release
		case <-time.After(5 * time.Second):
			t.Fatalf("%s still waits", what)
			return nil
		}
	}
	first, _ := enter(1, 40)
	more := entered(1, 20)
	waiting("uid 1 past its 50", more)
	second, _ := enter(2, 50)
	third := entered(3, 20)
	waiting("uid 3 with the mount at 90 of 100", third)
	first()
	releaseMore := ran("uid 1's 20 after its 40 left", more)
	releaseThird := ran("uid 3's 20 with the mount at 70", third)
	root := entered(0, 60)
	waiting("root's 60 with the mount at 90", root)
	second()
	releaseMore()
	releaseThird()
	releaseRoot := ran("root's 60, past a user's 50, with the mount empty", root)
	big := entered(4, 500)
	waiting("500 pieces while root's 60 run", big)
	releaseRoot()
	ran("500 pieces, past both bounds, once nothing else counts", big)()

	hold, _ := enter(5, 50)
	ctx, cancel := context.WithCancel(bg)
	done := make(chan unix.Errno, 1)
	go func() {
		_, e := g.enter(ctx, 5, 1)
		done <- e
	}()
	time.Sleep(20 * time.Millisecond)
	cancel()
	if e := <-done; e != unix.EINTR {
		t.Errorf("an interrupted wait: %v, want EINTR", e)
	}
	hold()
	if g.all != 0 || len(g.user) != 0 {
		t.Errorf("counts left after every batch ended: all %d, users %v", g.all, g.user)
	}
}

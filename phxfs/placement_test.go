package phxfs

import "testing"

// TestPlacementSplitsThePool: one device loading gets every worker; two
// devices loading at once get disjoint halves, whatever the rotation.
func TestPlacementSplitsThePool(t *testing.T) {
	l, _ := newLib(t, setup{"sync", Staged}, 2, func(c *Config) { c.Workers = 8 })
	r0, k := l.loading.enter(0)
	if r0 != 0 || k != 1 {
		t.Fatalf("one device loading: rank %d of %d", r0, k)
	}
	if start, n := l.place(r0, k, 100); start != 0 || n != 8 {
		t.Fatalf("alone: workers %d+%d, want 0+8", start, n)
	}
	r1, k := l.loading.enter(1)
	if r1 != 1 || k != 2 {
		t.Fatalf("second device: rank %d of %d", r1, k)
	}
	for i := range 20 {
		for rank, lo := range []int{0, 4} {
			start, n := l.place(rank, 2, 1+i%6)
			if start < lo || start+n > lo+4 || n != min(1+i%6, 4) {
				t.Fatalf("rank %d of 2, %d wanted: workers %d+%d, outside [%d, %d)", rank, 1+i%6, start, n, lo, lo+4)
			}
		}
	}
	l.loading.leave(0)
	if r, k := l.loading.enter(1); r != 0 || k != 1 {
		t.Fatalf("after device 0 left: rank %d of %d", r, k)
	}
	l.loading.leave(1)
	l.loading.leave(1)
	if len(l.loading.active) != 0 {
		t.Fatalf("active left: %v", l.loading.active)
	}
}

// TestClaimerAndLeaving: a plan's xfers are handed out once each, in
// order, in chunks of about a slot; a worker the placement gives to another
// device may leave only while one of the plan's workers stays in its part.
func TestClaimerAndLeaving(t *testing.T) {
	xs := make([]xfer, 100)
	for i := range xs {
		xs[i].len = 1000
	}
	c := newClaimer(xs, 4, 10_000)
	seen := 0
	for idx := c.claim(); idx != nil; idx = c.claim() {
		if len(idx) != 10 || idx[0] != seen {
			t.Fatalf("chunk %v after %d xfers", idx, seen)
		}
		seen += len(idx)
	}
	if seen != 100 {
		t.Fatalf("%d xfers handed out", seen)
	}
	if c := newClaimer(xs, 50, 10_000); len(c.claim()) != 2 {
		t.Error("a plan on 50 workers is not spread by an even share")
	}

	l, _ := newLib(t, setup{"sync", Staged}, 2, func(c *Config) { c.Workers = 8 })
	l.loading.enter(1) // device 1 alone: its plan took every worker
	if l.mayLeave(1, 2, 0, 8) {
		t.Error("a worker left with one device loading")
	}
	l.loading.enter(0) // device 0 arrives: it gets workers 0-3
	if !l.mayLeave(1, 2, 0, 8) || l.mayLeave(1, 5, 0, 8) {
		t.Error("device 1's plan should give back workers 0-3, and keep 4-7")
	}
	if l.mayLeave(1, 2, 0, 3) {
		t.Error("a plan with no worker left in its part must keep its workers")
	}
}

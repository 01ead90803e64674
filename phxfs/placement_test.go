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

package defaults

import "testing"

func TestSet(t *testing.T) {
	a, b, c := 0, int64(-3), 7
	Set(&a, 4)
	Set(&b, 5)
	Set(&c, 9)
	if a != 4 || b != 5 || c != 7 {
		t.Errorf("%d %d %d, want 4 5 7", a, b, c)
	}
}

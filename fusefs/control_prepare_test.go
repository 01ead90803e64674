package fusefs

import (
	"testing"
)

// PrepareDevices readies the staged transport before any registration
// (issue 19: a mount's first client finds the GPU state made), and leaves
// host-addressable devices as they are.
func TestPrepareDevicesWarmsTheStagedTransport(t *testing.T) {
	for _, staged := range []bool{false, true} {
		e := newCtlEnv(t, staged, false)
		if e.lib.Warmed(0) {
			t.Fatalf("staged=%v: warmed before PrepareDevices", staged)
		}
		if err := e.s.PrepareDevices(); err != nil {
			t.Fatalf("staged=%v: %v", staged, err)
		}
		if got := e.lib.Warmed(0); got != staged {
			t.Errorf("staged=%v: Warmed(0) = %v after PrepareDevices", staged, got)
		}
		d, err := e.lib.Device(0)
		if err != nil {
			t.Fatal(err)
		}
		if d.Registrations != 0 {
			t.Errorf("staged=%v: %d registrations made by PrepareDevices", staged, d.Registrations)
		}
	}
}

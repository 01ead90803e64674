package fusefs

import (
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
)

// TestControlLogIsRateLimited: a client sending refused REGISTERs as fast
// as it can (any local user may) used to write a warning for each, about
// 15 MiB of log a minute from one process; registering and deregistering
// in a loop, a line for each. Each kind of line is now let through at
// most logBurst times every logInterval, and the first one after the
// interval says how many were held back.
func TestControlLogIsRateLimited(t *testing.T) {
	now := time.Unix(1e9, 0)
	defer func(f func() time.Time) { logClock = f }(logClock)
	logClock = func() time.Time { return now }

	e, _ := newLimitedCtl(t, ControlConfig{}, false)
	e.s.log.Logger.SetLevel(logrus.InfoLevel)
	hook := test.NewLocal(e.s.log.Logger)
	f, _ := patternFile(t, 4096, unix.O_RDONLY)
	lines := func(prefix string) (n int, suppressed any) {
		for _, en := range hook.AllEntries() {
			if strings.HasPrefix(en.Message, prefix) {
				n++
				if v, ok := en.Data["suppressed"]; ok {
					suppressed = v
				}
			}
		}
		return n, suppressed
	}

	var bad connector.Handle // not an emu handle: EINVAL
	for range 1000 {
		if _, errno := e.registerHandle(f, bad, 64<<10); errno != unix.EINVAL {
			t.Fatalf("REGISTER of a zero handle: %v", errno)
		}
	}
	if n, _ := lines("register refused"); n != logBurst {
		t.Errorf("1000 refused REGISTERs logged %d lines, want %d", n, logBurst)
	}
	m := e.alloc(t, 64<<10)
	for range 100 {
		r, errno := e.register(t, e.me, f, m)
		if errno != 0 {
			t.Fatal(errno)
		}
		if errno := e.s.deregister(e.me, r.ID); errno != 0 {
			t.Fatal(errno)
		}
	}
	if n, _ := lines("registered"); n != logBurst {
		t.Errorf("100 registrations logged %d lines, want %d", n, logBurst)
	}

	now = now.Add(logInterval)
	e.registerHandle(f, bad, 64<<10)
	if n, suppressed := lines("register refused"); n != logBurst+1 || suppressed != 1000-logBurst {
		t.Errorf("the next interval: %d refusals logged, the last saying %v were held back; want %d and %d", n, suppressed, logBurst+1, 1000-logBurst)
	}
}

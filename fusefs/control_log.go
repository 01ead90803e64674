package fusefs

import (
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// The control logs a line for what a client's request did to the mount:
// a REGISTER refused, a buffer registered (with its transport), a buffer
// released by its owner's death, a user.phx.load. Any local user sends
// these requests, as fast as it likes (a refused REGISTER costs it about
// 10 us): each kind of line is rate limited as the kernel's
// printk_ratelimited is, at most logBurst lines every logInterval, and
// the first line let through after some were held back says how many
// (field "suppressed").

const (
	logInterval = 5 * time.Second
	logBurst    = 10
)

// logClock is the limiter's time; tests stand in for it.
var logClock = time.Now

// logLimit is the rate limit of one kind of line.
type logLimit struct {
	mu     sync.Mutex
	start  time.Time // of the current interval
	n      int       // lines let through in it
	missed int       // lines held back since the last let through
}

// allow says whether a line may be logged now, and how many were held
// back before it.
func (l *logLimit) allow() (ok bool, missed int) {
	now := logClock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.start) >= logInterval || now.Before(l.start) {
		l.start, l.n = now, 0
	}
	if l.n >= logBurst {
		l.missed++
		return false, 0
	}
	l.n++
	missed, l.missed = l.missed, 0
	return true, missed
}

// limitedLog logs a line at level through lim.
func limitedLog(lim *logLimit, e *logrus.Entry, level logrus.Level, format string, args ...any) {
	if !e.Logger.IsLevelEnabled(level) {
		return
	}
	ok, missed := lim.allow()
	if !ok {
		return
	}
	if missed > 0 {
		e = e.WithField("suppressed", missed)
	}
	e.Logf(level, format, args...)
}

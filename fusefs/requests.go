package fusefs

import (
	"sync/atomic"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"
)

// Request timing. The requests every program blocks in (LOOKUP, GETATTR,
// OPEN, CREATE, FLUSH at each close, RELEASE after the last) should take
// microseconds; one that waits behind something (a lock, a long ioctl,
// the backing file system) stalls the caller and is otherwise invisible.
// The daemon times each, hands the time to Options.ObserveRequest (the
// metrics' histogram), and warns when one took longer than SlowRequest,
// at most once per request kind every slowWarnEvery, saying how many
// more were slow meanwhile.

// SlowRequest is the service time above which a timed request is logged.
const SlowRequest = 50 * time.Millisecond

const slowWarnEvery = 10 * time.Second

// timedOp names a timed request kind.
type timedOp int

const (
	opLookup timedOp = iota
	opGetattr
	opOpen
	opCreate
	opFlush
	opRelease
	numTimedOps
)

// TimedRequests names the timed requests, as ObserveRequest receives them.
var TimedRequests = [numTimedOps]string{"lookup", "getattr", "open", "create", "flush", "release"}

// requestTimer times requests for one mount.
type requestTimer struct {
	observe func(op string, d time.Duration)
	log     *logrus.Entry
	slow    [numTimedOps]struct {
		warned atomic.Int64 // unix nanoseconds of the last warning
		hidden atomic.Int64 // slow requests since, not warned about
	}
}

// done records that a request of kind op, begun at start, has been served.
func (t *requestTimer) done(op timedOp, start time.Time) {
	d := time.Since(start)
	if t.observe != nil {
		t.observe(TimedRequests[op], d)
	}
	if d < SlowRequest {
		return
	}
	s := &t.slow[op]
	now := time.Now().UnixNano()
	last := s.warned.Load()
	if now-last < int64(slowWarnEvery) || !s.warned.CompareAndSwap(last, now) {
		s.hidden.Add(1)
		return
	}
	t.log.WithFields(logrus.Fields{"request": TimedRequests[op], "ms": d.Milliseconds(), "more_since_last": s.hidden.Swap(0)}).
		Warnf("slow FUSE request: %s took %v (over %v)", TimedRequests[op], d.Round(time.Millisecond), SlowRequest)
}

func (r *rawFS) GetAttr(c <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	defer r.fsys.requests.done(opGetattr, time.Now())
	return r.RawFileSystem.GetAttr(c, in, out)
}

func (r *rawFS) Open(c <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	defer r.fsys.requests.done(opOpen, time.Now())
	defer givePassthroughWriterBack() // writeas.go
	return r.RawFileSystem.Open(c, in, out)
}

func (r *rawFS) Release(c <-chan struct{}, in *fuse.ReleaseIn) {
	defer r.fsys.requests.done(opRelease, time.Now())
	r.RawFileSystem.Release(c, in)
}

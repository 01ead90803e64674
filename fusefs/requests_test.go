package fusefs

import (
	"strings"
	"testing"
	"time"

	logtest "github.com/sirupsen/logrus/hooks/test"
)

// TestSlowRequests: every timed request reaches the observer; one slower
// than SlowRequest is warned about, and further slow ones of the same kind
// within slowWarnEvery are counted into the next warning, not logged each.
func TestSlowRequests(t *testing.T) {
	l, logs := logtest.NewNullLogger()
	seen := map[string]int{}
	rt := &requestTimer{log: l.WithField("component", "test"), observe: func(op string, d time.Duration) { seen[op]++ }}

	rt.done(opOpen, time.Now())
	if seen["open"] != 1 || len(logs.AllEntries()) != 0 {
		t.Fatalf("a quick open: observed %v, logged %v", seen, logs.AllEntries())
	}
	slow := time.Now().Add(-2 * SlowRequest)
	rt.done(opFlush, slow)
	rt.done(opFlush, slow)
	rt.done(opFlush, slow)
	rt.done(opRelease, slow)
	es := logs.AllEntries()
	if seen["flush"] != 3 || seen["release"] != 1 || len(es) != 2 {
		t.Fatalf("observed %v; logged %d, want one line for flush and one for release: %v", seen, len(es), es)
	}
	if !strings.Contains(es[0].Message, "flush took") || es[0].Data["request"] != "flush" || es[0].Data["more_since_last"] != int64(0) {
		t.Errorf("first warning: %q %v", es[0].Message, es[0].Data)
	}
	// Once slowWarnEvery has passed, the next warning counts the two hidden.
	rt.slow[opFlush].warned.Add(-int64(slowWarnEvery))
	rt.done(opFlush, slow)
	if es = logs.AllEntries(); len(es) != 3 || es[2].Data["more_since_last"] != int64(2) {
		t.Errorf("after the quiet time: %d lines, last %v", len(es), es[len(es)-1].Data)
	}
}

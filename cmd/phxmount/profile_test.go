package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	logtest "github.com/sirupsen/logrus/hooks/test"
)

// TestProfile: PHXMOUNT_CPUPROFILE and PHXMOUNT_TRACE each name a file
// that holds its recording once the stop function has run; a path that
// cannot be created is a warning and no recording, never a failure to
// serve, and the other recording still starts.
func TestProfile(t *testing.T) {
	l, logs := logtest.NewNullLogger()
	log := l.WithField("component", "test")

	for _, r := range recorders {
		t.Setenv(r.env, "")
	}
	profile(log)()
	if len(logs.AllEntries()) != 0 {
		t.Fatalf("nothing asked for, yet: %v", logs.AllEntries())
	}

	dir := t.TempDir()
	for _, r := range recorders {
		t.Setenv(r.env, filepath.Join(dir, r.env))
	}
	stop := profile(log)
	for i := 0; i < 1e6; i++ { // something to sample
		_ = strings.Repeat("x", i%7)
	}
	stop()
	for _, r := range recorders {
		if st, err := os.Stat(filepath.Join(dir, r.env)); err != nil || st.Size() == 0 {
			t.Fatalf("no %s written: %v", r.what, err)
		}
	}

	logs.Reset()
	t.Setenv(EnvCPUProfile, filepath.Join(t.TempDir(), "no", "such", "dir", "p"))
	t.Setenv(EnvTrace, filepath.Join(dir, "trace-2"))
	profile(log)()
	if e := logs.AllEntries(); len(e) != 2 || !strings.Contains(e[0].Message, "no CPU profile") {
		t.Fatalf("an uncreatable profile path was not warned about: %v", e)
	}
	if st, err := os.Stat(filepath.Join(dir, "trace-2")); err != nil || st.Size() == 0 {
		t.Fatalf("the trace did not start beside a profile that could not: %v", err)
	}
}

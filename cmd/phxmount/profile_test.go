package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	logtest "github.com/sirupsen/logrus/hooks/test"
)

// TestCPUProfile: PHXMOUNT_CPUPROFILE names a file that holds a CPU profile
// once the stop function has run; a path that cannot be created is a
// warning and no profile, never a failure to serve.
func TestCPUProfile(t *testing.T) {
	l, logs := logtest.NewNullLogger()
	log := l.WithField("component", "test")

	t.Setenv(EnvCPUProfile, "")
	cpuProfile(log)()
	if len(logs.AllEntries()) != 0 {
		t.Fatalf("no profile asked for, yet: %v", logs.AllEntries())
	}

	path := filepath.Join(t.TempDir(), "daemon.prof")
	t.Setenv(EnvCPUProfile, path)
	stop := cpuProfile(log)
	for i := 0; i < 1e6; i++ { // something to sample
		_ = strings.Repeat("x", i%7)
	}
	stop()
	if st, err := os.Stat(path); err != nil || st.Size() == 0 {
		t.Fatalf("no profile written to %s: %v", path, err)
	}

	logs.Reset()
	t.Setenv(EnvCPUProfile, filepath.Join(t.TempDir(), "no", "such", "dir", "p"))
	cpuProfile(log)()
	if e := logs.LastEntry(); e == nil || !strings.Contains(e.Message, "no CPU profile") {
		t.Fatalf("an uncreatable profile path was not warned about: %v", logs.AllEntries())
	}
}

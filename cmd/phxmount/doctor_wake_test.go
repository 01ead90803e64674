package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFuseWakeNote(t *testing.T) {
	dir := t.TempDir()
	if _, ok := checkFuseWake(filepath.Join(dir, "absent")); ok {
		t.Fatal("a kernel without the parameter got a note")
	}
	for _, c := range []struct{ value, want string }{
		{"N\n", "N: this kernel can wake"},
		{"Y\n", "Y: FUSE wakes the daemon"},
		{"maybe\n", "unknown value maybe"},
	} {
		p := filepath.Join(dir, "wake_here")
		if err := os.WriteFile(p, []byte(c.value), 0o644); err != nil {
			t.Fatal(err)
		}
		f, ok := checkFuseWake(p)
		if !ok || !f.Note || f.Required || !strings.HasPrefix(f.Detail, c.want) {
			t.Errorf("%q: got %+v, %v; want a note starting %q", c.value, f, ok, c.want)
		}
	}
}

package logfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReopen: lines go to the file; after the file is moved away, Reopen
// starts a new one at the path and the moved one keeps what it had; a path
// that cannot be opened keeps the old file in use.
func TestReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "phxmount.log")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Write([]byte("one\n"))
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	l.Write([]byte("two\n")) // still the moved file: not reopened yet
	if err := l.Reopen(); err != nil {
		t.Fatal(err)
	}
	l.Write([]byte("three\n"))
	for p, want := range map[string]string{path + ".1": "one\ntwo\n", path: "three\n"} {
		if b, _ := os.ReadFile(p); string(b) != want {
			t.Errorf("%s: %q, want %q", p, b, want)
		}
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0640 {
		t.Errorf("mode %v", st.Mode())
	}
	os.Remove(path)
	os.Mkdir(path, 0755) // the path cannot be a log file now
	if err := l.Reopen(); err == nil || !strings.Contains(err.Error(), "log file") {
		t.Fatalf("reopen onto a directory: %v", err)
	}
	if _, err := l.Write([]byte("four\n")); err != nil {
		t.Errorf("the old file is no longer written: %v", err)
	}
	if _, err := Open(filepath.Join(dir, "no", "such")); err == nil {
		t.Errorf("opened a path in a missing directory")
	}
}

package integration

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMountSmoke checks the helper itself: a file written through the
// mount is on the backing directory, byte for byte.
func TestMountSmoke(t *testing.T) {
	backing, mnt := mountOverlay(t)
	want := []byte("hello through the overlay\n")
	if err := os.WriteFile(filepath.Join(mnt, "f"), want, 0644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(backing, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("backing has %q, want %q", got, want)
	}
}

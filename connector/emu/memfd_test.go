package emu

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCheckMemfd: Import accepts only what it opened being an emu memfd,
// whatever the exporter's descriptor named when it was looked at.
func TestCheckMemfd(t *testing.T) {
	ok, err := unix.MemfdCreate(memfdPrefix+"-ok", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ok)
	if err := checkMemfd(ok); err != nil {
		t.Fatalf("emu memfd refused: %v", err)
	}
	other, err := unix.MemfdCreate("other", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(other)
	if err := checkMemfd(other); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("memfd of another name: %v, want EINVAL", err)
	}
	// A file that only reads like a memfd (a bind mount in the client's
	// mount namespace) is on another mount.
	f, err := os.CreateTemp(t.TempDir(), memfdPrefix)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := onMemfdMount(int(f.Fd()), f.Name()); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("regular file: %v, want EINVAL", err)
	}
	if err := onMemfdMount(ok, "ok"); err != nil {
		t.Fatalf("memfd: %v", err)
	}
	// Import checks a path-only descriptor before it opens anything.
	path, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", ok), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(path)
	if err := checkMemfd(path); err != nil {
		t.Fatalf("O_PATH descriptor of an emu memfd refused: %v", err)
	}
}

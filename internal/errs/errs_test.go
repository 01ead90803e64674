package errs

import (
	"errors"
	"io/fs"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLayers: each layer adds what it knows, the errno is at the root once,
// and errors.Is and errors.As see through every layer.
func TestLayers(t *testing.T) {
	leaf := New(unix.EFAULT, "emu: %#x is not device memory", 0x10000)
	mid := Wrap("phxfs: register", "[0x10000, +65536) on device 0", leaf)
	top := Wrapf(mid, "control: REGISTER from process %d", 42)
	want := "control: REGISTER from process 42: phxfs: register [0x10000, +65536) on device 0: emu: 0x10000 is not device memory: bad address"
	if top.Error() != want {
		t.Errorf("message\n%s\nwant\n%s", top, want)
	}
	if strings.Count(top.Error(), unix.EFAULT.Error()) != 1 {
		t.Errorf("the errno is named more than once: %s", top)
	}
	if !errors.Is(top, unix.EFAULT) || Errno(top) != unix.EFAULT {
		t.Errorf("errors.Is(EFAULT) through the layers: %v, Errno %v", errors.Is(top, unix.EFAULT), Errno(top))
	}
	var e *Error
	if !errors.As(top, &e) || e.Op != "control: REGISTER from process 42" {
		t.Errorf("errors.As: %+v", e)
	}
	if !errors.As(mid, &e) || e.Subject != "[0x10000, +65536) on device 0" || e.Op != "phxfs: register" {
		t.Errorf("errors.As on the middle layer: %+v", e)
	}
	// A cause from another package keeps its own type and errno.
	pe := &fs.PathError{Op: "open", Path: "/x", Err: unix.ENOENT}
	w := Wrapf(pe, "emu: import")
	var got *fs.PathError
	if !errors.As(w, &got) || Errno(w) != unix.ENOENT || w.Error() != "emu: import: open /x: no such file or directory" {
		t.Errorf("wrapping a PathError: %v", w)
	}
	if Wrap("op", "s", nil) != nil || Wrapf(nil, "op") != nil || Errno(nil) != 0 || Errno(errors.New("plain")) != unix.EIO {
		t.Errorf("nil and errno-less causes")
	}
}

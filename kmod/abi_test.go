package kmod

import (
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// iow is the kernel's _IOW(type, nr, size) on x86-64 and arm64.
func iow(typ, nr, size uintptr) uintptr {
	const (
		nrShift   = 0
		typeShift = 8
		sizeShift = 16
		dirShift  = 30
		write     = 1
	)
	return write<<dirShift | size<<sizeShift | typ<<typeShift | nr<<nrShift
}

func TestMapArgsLayout(t *testing.T) {
	var a MapArgs
	if got := unsafe.Sizeof(a); got != MapArgsSize || MapArgsSize != 56 {
		t.Fatalf("sizeof MapArgs = %d, want 56", got)
	}
	for _, f := range []struct {
		name string
		got  uintptr
		want uintptr
	}{
		{"dev_id", unsafe.Offsetof(a.DevID), 0},
		{"c_vaddr", unsafe.Offsetof(a.HostAddr), 8},
		{"c_size", unsafe.Offsetof(a.HostSize), 16},
		{"n_vaddr", unsafe.Offsetof(a.DevAddr), 24},
		{"n_size", unsafe.Offsetof(a.DevSize), 32},
		{"end_addr", unsafe.Offsetof(a.EndAddr), 40},
		{"sbuf_block", unsafe.Offsetof(a.SbufBlock), 48},
	} {
		if f.got != f.want {
			t.Errorf("offset of %s = %d, want %d", f.name, f.got, f.want)
		}
	}
}

func TestIoctlNumbers(t *testing.T) {
	if want := iow(IoctlMagic, 1, MapArgsSize); IoctlMap != want {
		t.Errorf("IoctlMap = %#x, want %#x", IoctlMap, want)
	}
	if want := iow(IoctlMagic, 2, MapArgsSize); IoctlUnmap != want {
		t.Errorf("IoctlUnmap = %#x, want %#x", IoctlUnmap, want)
	}
}

func TestEmuDevAddr(t *testing.T) {
	if got := EmuDevAddr(0, 0); got != 0x100000000000 {
		t.Errorf("EmuDevAddr(0, 0) = %#x", got)
	}
	if got := EmuDevAddr(2, 0x10000); got != 0x100000000000+2<<40+0x10000 {
		t.Errorf("EmuDevAddr(2, 64K) = %#x", got)
	}
}

func TestPaths(t *testing.T) {
	if got := DevicePath(3); got != "/dev/phxfs_dev3" {
		t.Errorf("DevicePath(3) = %q", got)
	}
	if Available(-1) {
		t.Error("Available(-1)")
	}
	if _, err := Open(-1); !errors.Is(err, unix.EINVAL) {
		t.Errorf("Open(-1) = %v, want EINVAL", err)
	}
}

func TestOpenMissing(t *testing.T) {
	if Available(15) {
		t.Skip("phxfs_dev15 exists")
	}
	if _, err := Open(15); !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.ENXIO) {
		t.Errorf("Open(15) = %v, want ENOENT", err)
	}
}

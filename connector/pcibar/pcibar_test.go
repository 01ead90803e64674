package pcibar

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/procfs"
	"github.com/phxmount/phxmount/kmod"
)

const fakeBAR = 1 << 20

// fakeSysfs builds a PCI sysfs tree with one ivshmem device whose BAR 2 is
// a regular file, and points the package at it.
func fakeSysfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	const pci = "0000:00:04.0"
	dir := filepath.Join(root, pci)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("vendor", "0x1af4\n")
	write("device", "0x1110\n")
	const start = 0xfe000000
	res := "0x00000000fea00000 0x00000000fea000ff 0x0000000000040200\n" +
		"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" +
		fmt.Sprintf("0x%016x 0x%016x 0x000000000014220c\n", start, start+fakeBAR-1)
	write("resource", res)
	if err := os.WriteFile(filepath.Join(dir, "resource2"), make([]byte, fakeBAR), 0o644); err != nil {
		t.Fatal(err)
	}
	old := SysfsPCI
	SysfsPCI = root
	t.Cleanup(func() { SysfsPCI = old })
	allocMu.Lock()
	delete(allocators, pci)
	allocMu.Unlock()
	return pci
}

// newFake opens a connector on the fake device; it is closed when the test
// ends, after what openStream opened.
func newFake(t *testing.T) (*Connector, string) {
	pci := fakeSysfs(t)
	c, err := New(Config{PCIAddresses: []string{pci}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, pci
}

// openStream allocates size bytes of device 0's BAR and a stream on it,
// both closed when the test ends.
func openStream(t *testing.T, c *Connector, size int64) (connector.Memory, connector.Stream) {
	t.Helper()
	m, err := c.Alloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	s, err := c.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return m, s
}

func TestDevices(t *testing.T) {
	c, pci := newFake(t)
	devs, err := c.Devices()
	if err != nil || len(devs) != 1 {
		t.Fatalf("Devices = %v, %v", devs, err)
	}
	d := devs[0]
	if d.PCIAddress != pci || d.PageSize != PageSize || d.MemoryBytes != fakeBAR || d.Index != 0 {
		t.Errorf("device %+v", d)
	}
	if c.Vendor() != "pcibar" || c.HostAddressable() {
		t.Errorf("vendor %q, host addressable %v", c.Vendor(), c.HostAddressable())
	}
}

func TestNotStandIn(t *testing.T) {
	fakeSysfs(t)
	if _, err := New(Config{PCIAddresses: []string{"0000:00:05.0"}}); !errors.Is(err, unix.ENODEV) {
		t.Errorf("New(other device) = %v, want ENODEV", err)
	}
}

func TestAllocAlignedFirstFit(t *testing.T) {
	c, _ := newFake(t)
	if _, err := c.Alloc(0, 100); !errors.Is(err, unix.EINVAL) {
		t.Errorf("Alloc(100) = %v, want EINVAL", err)
	}
	if _, err := c.Alloc(1, PageSize); !errors.Is(err, unix.ENODEV) {
		t.Errorf("Alloc(dev 1) = %v, want ENODEV", err)
	}
	a, err := c.Alloc(0, PageSize)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Alloc(0, 2*PageSize)
	if err != nil {
		t.Fatal(err)
	}
	if a.Addr() != kmod.EmuDevAddr(0, 0) || b.Addr() != kmod.EmuDevAddr(0, PageSize) {
		t.Errorf("addresses %#x %#x", a.Addr(), b.Addr())
	}
	if _, err := c.Alloc(0, fakeBAR); !errors.Is(err, unix.ENOMEM) {
		t.Errorf("Alloc(whole BAR) with memory in use = %v, want ENOMEM", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); !errors.Is(err, unix.EINVAL) {
		t.Errorf("second Close = %v, want EINVAL", err)
	}
	a2, err := c.Alloc(0, PageSize)
	if err != nil || a2.Addr() != kmod.EmuDevAddr(0, 0) {
		t.Fatalf("first fit: %v %v", a2, err)
	}
	if err := c.Close(); !errors.Is(err, unix.EBUSY) {
		t.Errorf("Close with memory = %v, want EBUSY", err)
	}
	a2.Close()
	b.Close()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestExportImportResolve(t *testing.T) {
	c, pci := newFake(t)
	m, err := c.Alloc(0, 4*PageSize)
	if err != nil {
		t.Fatal(err)
	}
	h, err := m.Export()
	if err != nil {
		t.Fatal(err)
	}
	pid := os.Getpid()
	fakeProc(t, pid, "0\t0\t0\t0")
	im, err := c.Import(0, h, 2*PageSize, pid)
	if err != nil {
		t.Fatal(err)
	}
	if im.Addr() != m.Addr() || im.Size() != 2*PageSize {
		t.Errorf("imported %#x+%d, want %#x", im.Addr(), im.Size(), m.Addr())
	}
	if _, err := c.Import(0, h, 5*PageSize, pid); !errors.Is(err, unix.EINVAL) {
		t.Errorf("Import larger than exported = %v", err)
	}
	var bad connector.Handle
	if _, err := c.Import(0, bad, PageSize, pid); !errors.Is(err, unix.EINVAL) {
		t.Errorf("Import(zero handle) = %v", err)
	}
	out := h
	out[16] = 0xff // size past the BAR
	if _, err := c.Import(0, out, PageSize, pid); !errors.Is(err, unix.EINVAL) {
		t.Errorf("Import(out of bounds) = %v", err)
	}
	other := h
	copy(other[32:], "0000:00:09.0")
	if _, err := c.Import(0, other, PageSize, pid); !errors.Is(err, unix.EINVAL) {
		t.Errorf("Import(other device) = %v", err)
	}
	_ = pci

	if host, err := c.Resolve(0, m.Addr()+PageSize, PageSize); err != nil || host != 0 {
		t.Errorf("Resolve inside = %#x, %v", host, err)
	}
	if _, err := c.Resolve(0, m.Addr()+3*PageSize, 2*PageSize); !errors.Is(err, unix.EFAULT) {
		t.Errorf("Resolve past the end = %v", err)
	}
	if _, err := c.Resolve(0, kmod.EmuDevAddr(0, 8*PageSize), 1); !errors.Is(err, unix.EFAULT) {
		t.Errorf("Resolve unknown = %v", err)
	}
	im.Close()
	m.Close()
	c.Close()
}

func TestStreamCopies(t *testing.T) {
	c, pci := newFake(t)
	m, s := openStream(t, c, 2*PageSize)
	src := bytes.Repeat([]byte("phxfs-bar"), 1000)
	if err := s.CopyToDevice(m.Addr()+100, src); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(src))
	if err := s.CopyFromDevice(dst, m.Addr()+100); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("round trip differs")
	}
	// the bytes are in the BAR's resource file
	file, err := os.ReadFile(filepath.Join(SysfsPCI, pci, "resource2"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(file[100:100+len(src)], src) {
		t.Error("resource2 does not hold the copied bytes")
	}
	if err := s.CopyToDevice(kmod.EmuDevAddr(0, fakeBAR-10), src); !errors.Is(err, unix.EFAULT) {
		t.Errorf("copy past the BAR = %v", err)
	}
	// The failed copy's error was returned to it, and to no one after.
	if err := s.Synchronize(); err != nil {
		t.Errorf("Synchronize after a failed copy = %v", err)
	}
	if k, _, err := c.ViewKind(0); err != nil || k != ViewResource {
		t.Errorf("ViewKind = %q, %v", k, err)
	}
}

func TestAllocHost(t *testing.T) {
	c, _ := newFake(t)
	h, err := c.AllocHost(3 << 20)
	if err != nil {
		t.Fatal(err)
	}
	b := h.Bytes()
	b[0], b[len(b)-1] = 1, 2
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AllocHost(0); !errors.Is(err, unix.EINVAL) {
		t.Errorf("AllocHost(0) = %v", err)
	}
}

// TestRealBAR runs in the module-test VM: the ivshmem BAR driven by the
// phxfs module. Bytes copied in by a stream are seen through a module
// mapping, and the other way round.
func TestRealBAR(t *testing.T) {
	if !kmod.Available(0) {
		t.Skip("phxfs module not loaded (runs in the module-test VM)")
	}
	c, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	devs, _ := c.Devices()
	kd, err := kmod.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer kd.Close()
	if pci, _ := kd.PCIAddress(); pci != devs[0].PCIAddress {
		t.Fatalf("phxfs_dev0 %s, pcibar device 0 %s", pci, devs[0].PCIAddress)
	}
	m, err := c.Alloc(0, 4*PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	mp, err := kd.Map(m.Addr(), m.Size())
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Unmap()
	s, err := c.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src := bytes.Repeat([]byte{0x5a, 0x17}, PageSize)
	if err := s.CopyToDevice(m.Addr()+PageSize, src); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mp.Bytes()[PageSize:3*PageSize], src) {
		t.Fatal("stream copy not visible through the module mapping")
	}
	copy(mp.Bytes(), "written through the module")
	got := make([]byte, 26)
	if err := s.CopyFromDevice(got, m.Addr()); err != nil {
		t.Fatal(err)
	}
	if string(got) != "written through the module" {
		t.Fatalf("stream read %q", got)
	}
	view, why, err := c.ViewKind(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("BAR view: %s %s", view, why)
}

// fakeProc points the package at a /proc holding only pid's status, with
// the given Uid line (real, effective, saved, filesystem).
func fakeProc(t *testing.T, pid int, uids string) {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	status := "Name:\tclient\nTgid:\t" + strconv.Itoa(pid) + "\nUid:\t" + uids + "\nGid:\t0\t0\t0\t0\nCapEff:\t0\n"
	if err := os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
	old := procfs.Root
	procfs.Root = root
	t.Cleanup(func() { procfs.Root = old })
}

// naming returns h claiming to be exported by pid: what any process can
// forge, since a pcibar handle is only numbers.
func naming(h connector.Handle, pid int) connector.Handle {
	binary.LittleEndian.PutUint32(h[24:28], uint32(pid))
	return h
}

// TestImportClaimant: a handle is imported only by the process it names,
// and only when that process is root (effective uid 0): any process can
// forge a handle naming itself and any BAR range.
func TestImportClaimant(t *testing.T) {
	c, _ := newFake(t)
	m, err := c.Alloc(0, 2*PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	h, err := m.Export()
	if err != nil {
		t.Fatal(err)
	}
	pid := os.Getpid()
	if got := int(binary.LittleEndian.Uint32(h[24:28])); got != pid {
		t.Fatalf("handle names process %d, want the exporter %d", got, pid)
	}
	old := h
	copy(old[0:8], "PHXBAR01")
	if _, err := c.Import(0, old, PageSize, pid); !errors.Is(err, unix.EINVAL) {
		t.Errorf("Import(handle without an exporter) = %v, want EINVAL", err)
	}

	t.Run("fake proc", func(t *testing.T) {
		for _, tc := range []struct {
			uids string
			want error
		}{
			{"0\t0\t0\t0", nil},
			{"1000\t0\t1000\t1000", nil}, // a setuid-root program: effective uid 0
			{"1000\t1000\t1000\t1000", unix.EPERM},
			{"0\t1000\t0\t0", unix.EPERM}, // root that dropped its effective uid
			{"", unix.EIO},
		} {
			fakeProc(t, pid, tc.uids)
			im, err := c.Import(0, h, PageSize, pid)
			if tc.want == nil && err == nil {
				im.Close()
			} else if tc.want == nil || !errors.Is(err, tc.want) {
				t.Errorf("Uid %q: Import = %v, want %v", tc.uids, err, tc.want)
			}
			if _, err := c.Import(0, h, PageSize, pid+1); !errors.Is(err, unix.EPERM) {
				t.Errorf("Uid %q: Import claimed by another process = %v, want EPERM", tc.uids, err)
			}
		}
	})

	t.Run("real proc", func(t *testing.T) {
		im, err := c.Import(0, h, PageSize, pid)
		if os.Geteuid() != 0 {
			if !errors.Is(err, unix.EPERM) {
				t.Fatalf("Import by a non-root exporter = %v, want EPERM", err)
			}
			t.Skip("not root: the accepted case needs root")
		}
		if err != nil {
			t.Fatalf("Import by the root exporter = %v", err)
		}
		im.Close()
		if _, err := c.Import(0, h, PageSize, pid+1); !errors.Is(err, unix.EPERM) {
			t.Errorf("Import claimed by another process = %v, want EPERM", err)
		}

		// A process that is gone: ESRCH.
		done := exec.Command(os.Args[0], "-test.run=^$")
		if err := done.Run(); err != nil {
			t.Fatal(err)
		}
		gone := done.Process.Pid
		if _, err := c.Import(0, naming(h, gone), PageSize, gone); !errors.Is(err, unix.ESRCH) {
			t.Errorf("Import by a dead process = %v, want ESRCH", err)
		}

		// A live non-root process forging a handle that names itself.
		sleep, err := exec.LookPath("sleep")
		if err != nil {
			t.Skip("no sleep to run as another user")
		}
		user := exec.Command(sleep, "30")
		user.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		if err := user.Start(); err != nil { // returns once it has exec'd, as 65534
			t.Fatal(err)
		}
		defer func() { user.Process.Kill(); user.Wait() }()
		upid := user.Process.Pid
		if _, err := c.Import(0, naming(h, upid), PageSize, upid); !errors.Is(err, unix.EPERM) {
			t.Errorf("Import by a non-root process of a handle it forged = %v, want EPERM", err)
		}
	})
}

// TestStreamFaultIsEFAULT: a copy through a BAR mapping that faults (here
// the stand-in resource file shrinks) fails with EFAULT instead of killing
// the process with SIGBUS, and only that copy fails: the next transfer on
// the stream gets a clean fence and its bytes (issue 18, item 6).
func TestStreamFaultIsEFAULT(t *testing.T) {
	c, pci := newFake(t)
	m, s := openStream(t, c, 2*PageSize)
	if err := os.Truncate(filepath.Join(SysfsPCI, pci, "resource2"), PageSize); err != nil {
		t.Fatal(err)
	}
	src := bytes.Repeat([]byte{1}, 100)
	if err := s.CopyToDevice(m.Addr()+PageSize, src); !errors.Is(err, unix.EFAULT) {
		t.Errorf("copy to a gone page = %v, want EFAULT", err)
	}
	if err := s.CopyFromDevice(src, m.Addr()+PageSize); !errors.Is(err, unix.EFAULT) {
		t.Errorf("copy from a gone page = %v, want EFAULT", err)
	}
	want := bytes.Repeat([]byte{7}, 100)
	if err := s.CopyToDevice(m.Addr(), want); err != nil {
		t.Errorf("copy to a page still there = %v", err)
	}
	f, err := s.Fence()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Wait(); err != nil {
		t.Errorf("the next transfer's fence = %v", err)
	}
	got := make([]byte, 100)
	if err := s.CopyFromDevice(got, m.Addr()); err != nil || !bytes.Equal(got, want) {
		t.Errorf("the next transfer's bytes: %v, %v", err, got[:8])
	}
	if err := s.Synchronize(); err != nil {
		t.Errorf("Synchronize = %v", err)
	}
}

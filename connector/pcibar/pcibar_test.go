package pcibar

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"phxmount/connector"
	"phxmount/kmod"
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

func newFake(t *testing.T) (*Connector, string) {
	pci := fakeSysfs(t)
	c, err := New(Config{PCIAddresses: []string{pci}})
	if err != nil {
		t.Fatal(err)
	}
	return c, pci
}

func TestDevices(t *testing.T) {
	c, pci := newFake(t)
	defer c.Close()
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
	im, err := c.Import(0, h, 2*PageSize, 12345)
	if err != nil {
		t.Fatal(err)
	}
	if im.Addr() != m.Addr() || im.Size() != 2*PageSize {
		t.Errorf("imported %#x+%d, want %#x", im.Addr(), im.Size(), m.Addr())
	}
	if _, err := c.Import(0, h, 5*PageSize, 0); !errors.Is(err, unix.EINVAL) {
		t.Errorf("Import larger than exported = %v", err)
	}
	var bad connector.Handle
	if _, err := c.Import(0, bad, PageSize, 0); !errors.Is(err, unix.EINVAL) {
		t.Errorf("Import(zero handle) = %v", err)
	}
	out := h
	out[16] = 0xff // size past the BAR
	if _, err := c.Import(0, out, PageSize, 0); !errors.Is(err, unix.EINVAL) {
		t.Errorf("Import(out of bounds) = %v", err)
	}
	other := h
	copy(other[24:], "0000:00:09.0")
	if _, err := c.Import(0, other, PageSize, 0); !errors.Is(err, unix.EINVAL) {
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
	defer c.Close()
	m, err := c.Alloc(0, 2*PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := c.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
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
	if err := s.Synchronize(); !errors.Is(err, unix.EFAULT) {
		t.Errorf("Synchronize after a failed copy = %v", err)
	}
	if err := s.Synchronize(); err != nil {
		t.Errorf("second Synchronize = %v", err)
	}
	if k, _, err := c.ViewKind(0); err != nil || k != ViewResource {
		t.Errorf("ViewKind = %q, %v", k, err)
	}
}

func TestAllocHost(t *testing.T) {
	c, _ := newFake(t)
	defer c.Close()
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

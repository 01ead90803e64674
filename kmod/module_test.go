package kmod

// Tests against the real module: they run in the module-test VM
// (module/test/run-vm.sh) and skip where /dev/phxfs_dev0 is absent.

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/faultsafe"
)

const pg = 64 << 10

func needModule(t *testing.T) *Device {
	t.Helper()
	if !Available(0) {
		t.Skip("phxfs module not loaded (runs in the module-test VM)")
	}
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// base returns the device address of byte 0 of device 0 (emu backend).
func base(t *testing.T) uint64 {
	t.Helper()
	v, err := ReadAttrInt(0, "devaddr_base")
	if err != nil {
		t.Fatal(err)
	}
	if uint64(v) != EmuDevAddr(0, 0) {
		t.Fatalf("devaddr_base %#x, kmod.EmuDevAddr(0, 0) %#x", v, EmuDevAddr(0, 0))
	}
	return uint64(v)
}

func attr(t *testing.T, name string) int64 {
	t.Helper()
	v, err := ReadAttrInt(0, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestModuleAttributes(t *testing.T) {
	d := needModule(t)
	pci, err := d.PCIAddress()
	if err != nil || pci == "" {
		t.Fatalf("PCIAddress = %q, %v", pci, err)
	}
	if _, err := os.Stat("/sys/bus/pci/devices/" + pci); err != nil {
		t.Errorf("PCI address %s: %v", pci, err)
	}
	if s, _ := d.Attr("backend"); s != "emu" {
		t.Errorf("backend %q", s)
	}
	if attr(t, "mem_size") < 16<<20 {
		t.Errorf("mem_size %d", attr(t, "mem_size"))
	}
}

func TestModuleMapUnmap(t *testing.T) {
	d := needModule(t)
	b := base(t)
	regs, bytesBefore := attr(t, "registrations"), attr(t, "mapped_bytes")
	m, err := d.Map(b+16*pg, 16*pg)
	if err != nil {
		t.Fatal(err)
	}
	if m.Host == 0 || m.DevAddr != b+16*pg || m.Size != 16*pg {
		t.Errorf("mapping %+v", m)
	}
	if got := attr(t, "registrations"); got != regs+1 {
		t.Errorf("registrations %d, want %d", got, regs+1)
	}
	if got := attr(t, "mapped_bytes"); got != bytesBefore+16*pg {
		t.Errorf("mapped_bytes %d, want %d", got, bytesBefore+16*pg)
	}
	// CPU access to device memory through the module
	buf := m.Bytes()
	copy(buf[pg:], "device memory")
	m2, err := d.Map(b+16*pg, 16*pg) // the same device range, a second mapping
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m2.Bytes()[pg:pg+13], []byte("device memory")) {
		t.Error("two mappings of one device range do not share bytes")
	}
	if err := m2.Unmap(); err != nil {
		t.Fatal(err)
	}
	if err := m.Unmap(); err != nil {
		t.Fatal(err)
	}
	if err := m.Unmap(); !errors.Is(err, unix.EINVAL) {
		t.Errorf("second Unmap = %v, want EINVAL", err)
	}
	if got := attr(t, "registrations"); got != regs {
		t.Errorf("registrations %d after Unmap, want %d", got, regs)
	}
	if got := attr(t, "mapped_bytes"); got != bytesBefore {
		t.Errorf("mapped_bytes %d after Unmap, want %d", got, bytesBefore)
	}
}

func TestModuleCloseReleases(t *testing.T) {
	needModule(t)
	b := base(t)
	regs := attr(t, "registrations")
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if _, err := d.Map(b+uint64(i)*pg, pg); err != nil {
			t.Fatal(err)
		}
	}
	if got := attr(t, "registrations"); got != regs+4 {
		t.Errorf("registrations %d, want %d", got, regs+4)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if got := attr(t, "registrations"); got != regs {
		t.Errorf("registrations %d after Close, want %d", got, regs)
	}
	if _, err := d.Map(b, pg); !errors.Is(err, unix.EBADF) {
		t.Errorf("Map after Close = %v, want EBADF", err)
	}
	if err := d.Close(); !errors.Is(err, unix.EBADF) {
		t.Errorf("second Close = %v, want EBADF", err)
	}
}

// rawVMA mmaps size bytes of the device without MAP.
func rawVMA(t *testing.T, d *Device, size int) []byte {
	t.Helper()
	mem, err := unix.Mmap(d.Fd(), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return mem
}

func addr(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

func TestModuleTwoRegistrationsInOneVMA(t *testing.T) {
	d := needModule(t)
	b := base(t)
	regs := attr(t, "registrations")
	vma := rawVMA(t, d, 4*pg)
	a := MapArgs{DevID: 0, HostAddr: addr(vma), HostSize: 2 * pg, DevAddr: b + 64*pg, DevSize: 2 * pg}
	if err := d.Ioctl(IoctlMap, &a); err != nil {
		t.Fatal(err)
	}
	a2 := a
	a2.HostAddr += 2 * pg
	a2.DevAddr = b + 128*pg
	if err := d.Ioctl(IoctlMap, &a2); err != nil {
		t.Fatal(err)
	}
	overlap := a
	overlap.HostAddr += pg
	if err := d.Ioctl(IoctlMap, &overlap); !errors.Is(err, unix.EBUSY) {
		t.Errorf("overlapping MAP = %v, want EBUSY", err)
	}
	if got := attr(t, "registrations"); got != regs+2 {
		t.Errorf("registrations %d, want %d", got, regs+2)
	}
	wrong := a2
	wrong.DevAddr += pg
	if err := d.Ioctl(IoctlUnmap, &wrong); !errors.Is(err, unix.EINVAL) {
		t.Errorf("UNMAP naming another device range = %v, want EINVAL", err)
	}
	if err := d.Ioctl(IoctlUnmap, &a); err != nil {
		t.Fatal(err)
	}
	// the unmapped half faults (SIGBUS), the other half still works
	vma[2*pg] = 7
	if !faults(vma) {
		t.Error("access to an unmapped registration did not fault")
	}
	if err := d.Ioctl(IoctlUnmap, &a2); err != nil {
		t.Fatal(err)
	}
	if got := attr(t, "registrations"); got != regs {
		t.Errorf("registrations %d, want %d", got, regs)
	}
}

// faults reports whether reading the first byte of mem faults (SIGBUS or
// SIGSEGV, which faultsafe.Copy turns into EFAULT).
func faults(mem []byte) bool {
	err := faultsafe.Copy("kmod test: mapping", mem, make([]byte, 1), mem[:1])
	return errors.Is(err, unix.EFAULT)
}

func TestModuleErrors(t *testing.T) {
	d := needModule(t)
	b := base(t)
	size := attr(t, "mem_size")
	vma := rawVMA(t, d, 4*pg)
	good := MapArgs{DevID: 0, HostAddr: addr(vma), HostSize: pg, DevAddr: b, DevSize: pg}

	anon, err := unix.Mmap(-1, 0, pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(anon)

	for _, c := range []struct {
		name string
		mod  func(a *MapArgs)
		want unix.Errno
	}{
		{"zero size", func(a *MapArgs) { a.HostSize, a.DevSize = 0, 0 }, unix.EINVAL},
		{"sizes differ", func(a *MapArgs) { a.DevSize = 2 * pg }, unix.EINVAL},
		{"host misaligned", func(a *MapArgs) { a.HostAddr += 512 }, unix.EINVAL},
		{"size not pages", func(a *MapArgs) { a.HostSize, a.DevSize = 1000, 1000 }, unix.EINVAL},
		{"device misaligned", func(a *MapArgs) { a.DevAddr += 8 }, unix.EINVAL},
		{"other device id", func(a *MapArgs) { a.DevID = 1 }, unix.EINVAL},
		{"not a phxfs mapping", func(a *MapArgs) { a.HostAddr = addr(anon) }, unix.EINVAL},
		{"past the VMA", func(a *MapArgs) { a.HostSize, a.DevSize = 8*pg, 8*pg }, unix.EINVAL},
		{"below device memory", func(a *MapArgs) { a.DevAddr = b - pg }, unix.ERANGE},
		{"past device memory", func(a *MapArgs) { a.DevAddr = b + uint64(size) }, unix.ERANGE},
		{"runs past device memory", func(a *MapArgs) { a.DevAddr = b + uint64(size) - pg; a.HostSize, a.DevSize = 2*pg, 2*pg }, unix.ERANGE},
		{"address overflow", func(a *MapArgs) { a.DevAddr = ^uint64(0) &^ (pg - 1) }, unix.EINVAL},
	} {
		a := good
		c.mod(&a)
		if err := d.Ioctl(IoctlMap, &a); !errors.Is(err, c.want) {
			t.Errorf("MAP %s = %v, want %v", c.name, err, c.want)
		}
	}
	if err := d.Ioctl(IoctlUnmap, &good); !errors.Is(err, unix.EINVAL) {
		t.Errorf("UNMAP of nothing = %v, want EINVAL", err)
	}
	// unknown command, bad argument pointer
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(d.Fd()), IoctlMap+0x10, uintptr(unsafe.Pointer(&good))); e != unix.ENOTTY {
		t.Errorf("unknown ioctl = %v, want ENOTTY", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(d.Fd()), IoctlMap, 8); e != unix.EFAULT {
		t.Errorf("MAP with a bad pointer = %v, want EFAULT", e)
	}
	// mmap: shared only, offset 0 only
	if _, err := unix.Mmap(d.Fd(), 0, pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE); err != unix.EINVAL {
		t.Errorf("private mmap = %v, want EINVAL", err)
	}
	if _, err := unix.Mmap(d.Fd(), pg, pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != unix.EINVAL {
		t.Errorf("mmap at offset = %v, want EINVAL", err)
	}
	// the VMA cannot be split, grown or moved
	if err := unix.Munmap(vma[pg : 2*pg]); err != unix.EINVAL {
		t.Errorf("partial munmap = %v, want EINVAL", err)
	}
	if _, err := unix.Mremap(vma, 8*pg, unix.MREMAP_MAYMOVE); err == nil {
		t.Error("mremap grew the VMA")
	}
	if err := d.Ioctl(IoctlMap, &good); err != nil {
		t.Fatalf("MAP after the failures: %v", err)
	}
	if err := d.Ioctl(IoctlUnmap, &good); err != nil {
		t.Fatal(err)
	}
}

func TestModuleRevokedFaults(t *testing.T) {
	d := needModule(t)
	b := base(t)
	m, err := d.Map(b+200*pg, 2*pg)
	if err != nil {
		t.Fatal(err)
	}
	m.Bytes()[0] = 1
	f, err := os.OpenFile(SysfsDir(0)+"/revoke", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("0x" + hex(m.DevAddr) + " 0x" + hex(uint64(m.Size))); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if !faults(m.Bytes()[pg:]) {
		t.Error("access after revocation did not fault")
	}
	// MAP into the same host range is refused while the dead one stays
	a := MapArgs{HostAddr: uint64(m.Host), HostSize: pg, DevAddr: b, DevSize: pg}
	if err := d.Ioctl(IoctlMap, &a); !errors.Is(err, unix.EBUSY) {
		t.Errorf("MAP over a revoked registration = %v, want EBUSY", err)
	}
	if err := m.Unmap(); err != nil {
		t.Fatalf("Unmap after revocation: %v", err)
	}
}

func hex(v uint64) string {
	const digits = "0123456789abcdef"
	if v == 0 {
		return "0"
	}
	var b []byte
	for ; v > 0; v >>= 4 {
		b = append([]byte{digits[v&15]}, b...)
	}
	return string(b)
}

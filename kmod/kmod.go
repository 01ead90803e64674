// Package kmod is the user-space side of the phxfs kernel module: the
// /dev/phxfs_devN character devices, their sysfs attributes and the
// MAP/UNMAP ioctls (ABI compatible with the original Phoenix module; see
// docs/kernel-module.md).
//
// A registration is an mmap of the character device (an empty VMA) into
// which the MAP ioctl inserts device pages; O_DIRECT I/O on Mapping.Host is
// then DMA between storage and device memory.
package kmod

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// Ioctl magic and command numbers of the module (_IOW(0x88, n, MapArgs)).
const (
	IoctlMagic = 0x88
	IoctlMap   = 0x40388801 // _IOW(0x88, 1, struct phxfs_ioctl_map)
	IoctlUnmap = 0x40388802 // _IOW(0x88, 2, struct phxfs_ioctl_map)
)

// Emu device addresses: byte off of the emu backend's device n is
// EmuDevAddr(n, off). The kernel's emu backend and connector/pcibar agree
// on it; /sys/class/phxfs/phxfs_devN/devaddr_base reports it.
const (
	EmuDevAddrBase  = 0x100000000000
	EmuDevAddrShift = 40
)

// EmuDevAddr returns the emu backend's device address of byte off of
// device index.
func EmuDevAddr(index int, off uint64) uint64 {
	return EmuDevAddrBase + uint64(index)<<EmuDevAddrShift + off
}

// MapArgs is struct phxfs_ioctl_map: 56 bytes, the layout of the original
// packed, 8-byte aligned structure.
type MapArgs struct {
	DevID     uint64 // device index
	HostAddr  uint64 // c_vaddr: inside an mmap of the device
	HostSize  uint64 // c_size
	DevAddr   uint64 // n_vaddr
	DevSize   uint64 // n_size: equals HostSize
	EndAddr   uint64 // reserved
	SbufBlock uint32 // reserved
	Pad       uint32
}

// MapArgsSize is the size of MapArgs as the kernel sees it.
const MapArgsSize = 56

// Paths of the module's files.
const (
	DevDir   = "/dev"
	ClassDir = "/sys/class/phxfs"
)

// DevicePath returns the character device of device index.
func DevicePath(index int) string {
	return fmt.Sprintf("%s/phxfs_dev%d", DevDir, index)
}

// SysfsDir returns the sysfs directory of device index.
func SysfsDir(index int) string {
	return fmt.Sprintf("%s/phxfs_dev%d", ClassDir, index)
}

// Available reports whether the module serves device index: its character
// device exists and is a character device.
func Available(index int) bool {
	if index < 0 {
		return false
	}
	var st unix.Stat_t
	if err := unix.Stat(DevicePath(index), &st); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFCHR
}

// Device is an open phxfs character device.
type Device struct {
	index int

	mu     sync.Mutex
	fd     int // -1 once closed
	maps   map[*Mapping]struct{}
	closed bool
}

// Open opens device index.
func Open(index int) (*Device, error) {
	if index < 0 {
		return nil, errs.New(unix.EINVAL, "kmod: device index %d", index)
	}
	fd, err := unix.Open(DevicePath(index), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errs.New(errno(err), "kmod: open %s", DevicePath(index))
	}
	return &Device{index: index, fd: fd, maps: make(map[*Mapping]struct{})}, nil
}

// Index returns the device index.
func (d *Device) Index() int { return d.index }

// Attr reads a sysfs attribute of the device (trimmed).
func (d *Device) Attr(name string) (string, error) {
	return ReadAttr(d.index, name)
}

// ReadAttr reads a sysfs attribute of device index (trimmed).
func ReadAttr(index int, name string) (string, error) {
	p := SysfsDir(index) + "/" + name
	b, err := os.ReadFile(p)
	if err != nil {
		return "", errs.New(errno(err), "kmod: read %s", p)
	}
	return strings.TrimSpace(string(b)), nil
}

// ReadAttrInt reads a numeric sysfs attribute of device index (decimal or
// 0x-prefixed hexadecimal).
func ReadAttrInt(index int, name string) (int64, error) {
	s, err := ReadAttr(index, name)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(s, 0, 64)
	if err != nil {
		return 0, errs.New(unix.EIO, "kmod: %s/%s: %q is not a number", SysfsDir(index), name, s)
	}
	return v, nil
}

// PCIAddress returns the PCI address of the device ("0000:00:04.0"), read
// from sysfs. A device backed by reserved RAM has none: ENODEV.
func (d *Device) PCIAddress() (string, error) {
	s, err := d.Attr("pci_address")
	if err != nil {
		return "", err
	}
	if s == "none" || s == "" {
		return "", errs.New(unix.ENODEV, "kmod: phxfs_dev%d has no PCI address", d.index)
	}
	return s, nil
}

// Mapping is device memory mapped into this process by Map.
type Mapping struct {
	Host    uintptr // host address of the first byte
	DevAddr uint64
	Size    int64

	dev *Device
	mem []byte // the mmap of the character device
}

// Map maps size bytes of device memory at devAddr: an mmap of the
// character device followed by the MAP ioctl. size must be a multiple of
// the page size (and of the backend's alignment: 4 KiB for emu, 64 KiB for
// nvidia), devAddr aligned likewise. The mapping belongs to the caller's
// effective uid; with the emu backend, device memory another uid has
// mapped is refused with EACCES unless the caller has CAP_SYS_RAWIO
// (docs/kernel-module.md, "Who may map what").
func (d *Device) Map(devAddr uint64, size int64) (*Mapping, error) {
	if size <= 0 || int64(int(size)) != size {
		return nil, errs.New(unix.EINVAL, "kmod: map size %d", size)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errs.New(unix.EBADF, "kmod: phxfs_dev%d is closed", d.index)
	}
	mem, err := unix.Mmap(d.fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, errs.New(errno(err), "kmod: mmap %d bytes of phxfs_dev%d", size, d.index)
	}
	host := uintptr(unsafe.Pointer(&mem[0]))
	args := MapArgs{
		DevID:    uint64(d.index),
		HostAddr: uint64(host),
		HostSize: uint64(size),
		DevAddr:  devAddr,
		DevSize:  uint64(size),
	}
	if err := ioctl(d.fd, IoctlMap, &args); err != nil {
		unix.Munmap(mem)
		return nil, errs.New(errno(err), "kmod: MAP %#x+%#x on phxfs_dev%d", devAddr, size, d.index)
	}
	m := &Mapping{Host: host, DevAddr: devAddr, Size: size, dev: d, mem: mem}
	d.maps[m] = struct{}{}
	return m, nil
}

// Bytes returns the mapping as a byte slice (CPU access to device memory
// through the module). It is invalid after Unmap.
func (m *Mapping) Bytes() []byte { return m.mem }

// Unmap removes the mapping: the UNMAP ioctl (which releases the pin) and
// munmap. The mapping is gone afterwards even when an error is returned.
func (m *Mapping) Unmap() error {
	d := m.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if m.mem == nil {
		return errs.New(unix.EINVAL, "kmod: mapping %#x already unmapped", m.DevAddr)
	}
	return d.unmapLocked(m)
}

func (d *Device) unmapLocked(m *Mapping) error {
	var first error
	if d.fd >= 0 {
		args := MapArgs{
			DevID:    uint64(d.index),
			HostAddr: uint64(m.Host),
			HostSize: uint64(m.Size),
			DevAddr:  m.DevAddr,
			DevSize:  uint64(m.Size),
		}
		if err := ioctl(d.fd, IoctlUnmap, &args); err != nil {
			first = errs.New(errno(err), "kmod: UNMAP %#x+%#x on phxfs_dev%d", m.DevAddr, m.Size, d.index)
		}
	}
	// munmap releases the registration too (vm_ops close) if UNMAP failed.
	if err := unix.Munmap(m.mem); err != nil && first == nil {
		first = errs.New(errno(err), "kmod: munmap %#x", m.Host)
	}
	m.mem = nil
	delete(d.maps, m)
	return first
}

// Close unmaps every mapping still open on the device and closes it.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errs.New(unix.EBADF, "kmod: phxfs_dev%d already closed", d.index)
	}
	var first error
	for m := range d.maps {
		if err := d.unmapLocked(m); err != nil && first == nil {
			first = err
		}
	}
	if err := unix.Close(d.fd); err != nil && first == nil {
		first = errs.New(errno(err), "kmod: close phxfs_dev%d", d.index)
	}
	d.fd = -1
	d.closed = true
	return first
}

// Ioctl issues a raw MAP or UNMAP on the device (for tests of the ABI).
func (d *Device) Ioctl(cmd uint, args *MapArgs) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errs.New(unix.EBADF, "kmod: phxfs_dev%d is closed", d.index)
	}
	if err := ioctl(d.fd, cmd, args); err != nil {
		return errs.New(errno(err), "kmod: ioctl %#x on phxfs_dev%d", cmd, d.index)
	}
	return nil
}

// Fd returns the file descriptor of the device (for tests; -1 once closed).
func (d *Device) Fd() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fd
}

func ioctl(fd int, cmd uint, args *MapArgs) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(cmd), uintptr(unsafe.Pointer(args)))
	if e != 0 {
		return e
	}
	return nil
}

func errno(err error) unix.Errno {
	return errs.Errno(err)
}

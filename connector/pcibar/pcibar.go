// Package pcibar is a connector whose device memory is a PCI BAR standing
// in for GPU memory: the shared-memory BAR (BAR 2) of QEMU's ivshmem-plain
// device, as the phxfs kernel module's emu backend drives it. It exists to
// test the "kmod" transport for real in a VM (module/test/run-vm.sh).
//
// Device addresses are the emu backend's: byte off of device n's BAR is
// kmod.EmuDevAddr(n, off). The memory is not host-addressable (Resolve
// returns 0): the CPU reaches it through the kernel module, the way GPU
// memory is reached, while Stream copies go through an mmap of the BAR's
// sysfs resource file (or, where the kernel refuses that mapping, through a
// mapping of the whole BAR by the module).
//
// Allocation is first-fit in 64 KiB units and process-wide per BAR: two
// processes allocating from the same BAR are not coordinated, as two
// processes owning one GPU's memory would be by its driver.
package pcibar

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"phxmount/connector"
	"phxmount/internal/errs"
	"phxmount/kmod"
)

// The stand-in device: QEMU ivshmem-plain, its shared memory in BAR 2.
const (
	VendorID = 0x1af4
	DeviceID = 0x1110
	BAR      = 2
)

// PageSize is the allocation unit and alignment: the 64 KiB GPU page.
const PageSize = 64 << 10

// Vendor is the connector's name.
const Vendor = "pcibar"

// handleMagic names the handle layout (see Export). 01 was the layout
// without the exporter's pid; such handles are refused.
var handleMagic = [8]byte{'P', 'H', 'X', 'B', 'A', 'R', '0', '2'}

// procRoot is where Import reads the claiming process's credentials.
var procRoot = "/proc"

// SysfsPCI is where PCI devices are listed.
var SysfsPCI = "/sys/bus/pci/devices"

// Config configures the connector.
type Config struct {
	// PCIAddresses pins the devices (in index order); empty discovers them:
	// the phxfs module's devices when it is loaded, else every ivshmem
	// device in PCI address order.
	PCIAddresses []string
}

// Connector is the PCI-BAR vendor.
type Connector struct {
	devs []*device

	mu      sync.Mutex
	regions map[*Memory]struct{} // allocated and imported, this connector
	streams int
	closed  bool
}

var _ connector.Connector = (*Connector)(nil)

type device struct {
	index int
	pci   string
	size  int64
	alloc *allocator

	viewMu sync.Mutex
	view   *barView
}

// New discovers the BARs. It fails with ENODEV when there is none.
func New(cfg Config) (*Connector, error) {
	addrs := cfg.PCIAddresses
	if len(addrs) == 0 {
		var err error
		if addrs, err = discover(); err != nil {
			return nil, err
		}
	}
	if len(addrs) == 0 {
		return nil, errs.New(unix.ENODEV, "pcibar: no ivshmem device (vendor %#x device %#x)", VendorID, DeviceID)
	}
	c := &Connector{regions: make(map[*Memory]struct{})}
	for i, a := range addrs {
		if !isStandIn(a) {
			return nil, errs.New(unix.ENODEV, "pcibar: %s is not an ivshmem device", a)
		}
		size, err := barSize(a)
		if err != nil {
			return nil, err
		}
		if size < PageSize {
			return nil, errs.New(unix.ENODEV, "pcibar: %s BAR %d has %d bytes", a, BAR, size)
		}
		c.devs = append(c.devs, &device{index: i, pci: a, size: size, alloc: allocatorFor(a, size)})
	}
	return c, nil
}

// discover lists the stand-in devices: phxfs_dev0, 1, ... while they are
// ivshmem BARs (so connector index = module index), or without the module
// every ivshmem device in address order.
func discover() ([]string, error) {
	if _, err := os.Stat(kmod.ClassDir); err == nil {
		var out []string
		for i := 0; ; i++ {
			a, err := kmod.ReadAttr(i, "pci_address")
			if err != nil || !isStandIn(a) {
				break
			}
			out = append(out, a)
		}
		return out, nil
	}
	ents, err := os.ReadDir(SysfsPCI)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, errs.Wrapf(err, "pcibar: list %s", SysfsPCI)
	}
	var out []string
	for _, e := range ents {
		if isStandIn(e.Name()) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

func readHex(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 0, 64)
}

func isStandIn(pci string) bool {
	if pci == "" || strings.ContainsAny(pci, "/\x00") {
		return false
	}
	v, err1 := readHex(filepath.Join(SysfsPCI, pci, "vendor"))
	d, err2 := readHex(filepath.Join(SysfsPCI, pci, "device"))
	return err1 == nil && err2 == nil && v == VendorID && d == DeviceID
}

// barSize reads BAR's size from the device's sysfs "resource" table.
func barSize(pci string) (int64, error) {
	p := filepath.Join(SysfsPCI, pci, "resource")
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, errs.Wrapf(err, "pcibar: read %s", p)
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) <= BAR {
		return 0, errs.New(unix.EIO, "pcibar: %s has no BAR %d", p, BAR)
	}
	f := strings.Fields(lines[BAR])
	if len(f) < 2 {
		return 0, errs.New(unix.EIO, "pcibar: %s: bad line %q", p, lines[BAR])
	}
	start, err1 := strconv.ParseUint(f[0], 0, 64)
	end, err2 := strconv.ParseUint(f[1], 0, 64)
	if err1 != nil || err2 != nil || end < start || start == 0 {
		return 0, errs.New(unix.EIO, "pcibar: %s: bad line %q", p, lines[BAR])
	}
	return int64(end - start + 1), nil
}

// Vendor implements connector.Connector.
func (c *Connector) Vendor() string { return Vendor }

// HostAddressable implements connector.Connector: false, device memory is
// reached through the kernel module.
func (c *Connector) HostAddressable() bool { return false }

// Devices implements connector.Connector.
func (c *Connector) Devices() ([]connector.DeviceInfo, error) {
	out := make([]connector.DeviceInfo, len(c.devs))
	for i, d := range c.devs {
		out[i] = connector.DeviceInfo{
			Index:       i,
			Name:        fmt.Sprintf("ivshmem BAR %d at %s", BAR, d.pci),
			PCIAddress:  d.pci,
			PageSize:    PageSize,
			MemoryBytes: d.size,
		}
	}
	return out, nil
}

func (c *Connector) device(dev int) (*device, error) {
	if dev < 0 || dev >= len(c.devs) {
		return nil, errs.New(unix.ENODEV, "pcibar: no device %d (have %d)", dev, len(c.devs))
	}
	return c.devs[dev], nil
}

// Memory is a range of a BAR.
type Memory struct {
	c        *Connector
	dev      *device
	off      int64
	size     int64
	imported bool
	closed   bool
}

var _ connector.Memory = (*Memory)(nil)

// Device implements connector.Memory.
func (m *Memory) Device() int { return m.dev.index }

// Addr implements connector.Memory: the emu backend's device address.
func (m *Memory) Addr() uint64 { return kmod.EmuDevAddr(m.dev.index, uint64(m.off)) }

// Size implements connector.Memory.
func (m *Memory) Size() int64 { return m.size }

// Offset returns the offset of the memory in its BAR.
func (m *Memory) Offset() int64 { return m.off }

// Export implements connector.Memory: {magic, BAR offset u64, size u64,
// exporting pid u32, zero u32, PCI address char[32]} in the 64-byte handle.
func (m *Memory) Export() (connector.Handle, error) {
	var h connector.Handle
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	if m.closed {
		return h, errs.New(unix.EINVAL, "pcibar: export of closed memory")
	}
	copy(h[0:8], handleMagic[:])
	binary.LittleEndian.PutUint64(h[8:16], uint64(m.off))
	binary.LittleEndian.PutUint64(h[16:24], uint64(m.size))
	binary.LittleEndian.PutUint32(h[24:28], uint32(os.Getpid()))
	copy(h[32:], m.dev.pci)
	return h, nil
}

// Close implements connector.Memory.
func (m *Memory) Close() error {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	if m.closed {
		return errs.New(unix.EINVAL, "pcibar: memory %#x closed twice", m.Addr())
	}
	m.closed = true
	delete(m.c.regions, m)
	if !m.imported {
		m.dev.alloc.free(m.off, m.size)
	}
	return nil
}

// Alloc implements connector.Connector: size must be a positive multiple
// of PageSize.
func (c *Connector) Alloc(dev int, size int64) (connector.Memory, error) {
	d, err := c.device(dev)
	if err != nil {
		return nil, err
	}
	if size <= 0 || size%PageSize != 0 {
		return nil, errs.New(unix.EINVAL, "pcibar: allocation of %d bytes (must be a positive multiple of %d)", size, PageSize)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errs.New(unix.EINVAL, "pcibar: connector closed")
	}
	off, ok := d.alloc.alloc(size)
	if !ok {
		return nil, errs.New(unix.ENOMEM, "pcibar: no %d free bytes in the %d-byte BAR of %s", size, d.size, d.pci)
	}
	m := &Memory{c: c, dev: d, off: off, size: size}
	c.regions[m] = struct{}{}
	return m, nil
}

// Import implements connector.Connector. The handle must name pid as its
// exporter and pid must be root (see claimant); it is checked against the
// device and the BAR's bounds.
func (c *Connector) Import(dev int, h connector.Handle, size int64, pid int) (connector.Memory, error) {
	d, err := c.device(dev)
	if err != nil {
		return nil, err
	}
	if [8]byte(h[0:8]) != handleMagic {
		return nil, errs.New(unix.EINVAL, "pcibar: not a pcibar handle")
	}
	off := binary.LittleEndian.Uint64(h[8:16])
	hsize := binary.LittleEndian.Uint64(h[16:24])
	hpid := int(binary.LittleEndian.Uint32(h[24:28]))
	if hpid != pid {
		return nil, errs.New(unix.EPERM, "pcibar: handle exported by process %d, claimed by %d", hpid, pid)
	}
	if err := claimant(pid); err != nil {
		return nil, err
	}
	pci := strings.TrimRight(string(h[32:]), "\x00")
	if pci != d.pci {
		return nil, errs.New(unix.EINVAL, "pcibar: handle is for %q, device %d is %s", pci, dev, d.pci)
	}
	if off%PageSize != 0 || hsize == 0 || hsize%PageSize != 0 || off >= uint64(d.size) || hsize > uint64(d.size)-off {
		return nil, errs.New(unix.EINVAL, "pcibar: handle range %#x+%#x outside the %d-byte BAR", off, hsize, d.size)
	}
	if size <= 0 || uint64(size) > hsize {
		return nil, errs.New(unix.EINVAL, "pcibar: import of %d bytes from a %d-byte buffer", size, hsize)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errs.New(unix.EINVAL, "pcibar: connector closed")
	}
	m := &Memory{c: c, dev: d, off: int64(off), size: size, imported: true}
	c.regions[m] = struct{}{}
	return m, nil
}

// claimant checks that process pid may import BAR memory: it exists and
// its effective uid is 0. A pcibar handle is only numbers (a BAR range), so
// any process could write one naming itself, and naming the exporter alone
// would not stop it from reaching every other process's BAR memory; only
// root, which can map the whole BAR through sysfs anyway, may import.
func claimant(pid int) error {
	p := filepath.Join(procRoot, strconv.Itoa(pid), "status")
	b, err := os.ReadFile(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			return errs.New(unix.ESRCH, "pcibar: claiming process %d is gone", pid)
		}
		return errs.Wrapf(err, "pcibar: read %s", p)
	}
	for _, line := range strings.Split(string(b), "\n") {
		v, ok := strings.CutPrefix(line, "Uid:")
		if !ok {
			continue
		}
		f := strings.Fields(v) // real, effective, saved, filesystem
		if len(f) < 2 {
			break
		}
		euid, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			break
		}
		if euid != 0 {
			return errs.New(unix.EPERM, "pcibar: process %d (euid %d) may not import BAR memory: root only", pid, euid)
		}
		return nil
	}
	return errs.New(unix.EIO, "pcibar: %s has no Uid line", p)
}

// Resolve implements connector.Connector: it checks the range is memory
// this connector allocated or imported and returns host address 0.
func (c *Connector) Resolve(dev int, addr uint64, size int64) (uintptr, error) {
	if _, err := c.device(dev); err != nil {
		return 0, err
	}
	if size <= 0 {
		return 0, errs.New(unix.EINVAL, "pcibar: resolve of %d bytes", size)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for m := range c.regions {
		if m.dev.index != dev {
			continue
		}
		a := m.Addr()
		if addr >= a && addr-a < uint64(m.size) {
			if uint64(size) > uint64(m.size)-(addr-a) {
				return 0, errs.New(unix.EFAULT, "pcibar: [%#x, +%d) runs past its %d-byte buffer", addr, size, m.size)
			}
			return 0, nil
		}
	}
	return 0, errs.New(unix.EFAULT, "pcibar: %#x is not device memory of device %d", addr, dev)
}

// barOffset checks that [addr, addr+size) lies in device d's BAR and
// returns its offset.
func (d *device) barOffset(addr uint64, size int64) (int64, error) {
	base := kmod.EmuDevAddr(d.index, 0)
	if size < 0 || addr < base || addr-base > uint64(d.size) || uint64(size) > uint64(d.size)-(addr-base) {
		return 0, errs.New(unix.EFAULT, "pcibar: [%#x, +%d) is not in the BAR of device %d", addr, size, d.index)
	}
	return int64(addr - base), nil
}

// hostMemory is page-aligned anonymous memory.
type hostMemory struct{ b []byte }

func (h *hostMemory) Bytes() []byte { return h.b }

func (h *hostMemory) Close() error {
	if h.b == nil {
		return errs.New(unix.EINVAL, "pcibar: host memory closed twice")
	}
	err := unix.Munmap(h.b)
	h.b = nil
	if err != nil {
		return errs.Wrapf(err, "pcibar: munmap host memory")
	}
	return nil
}

// AllocHost implements connector.Connector: plain mmap'd memory.
func (c *Connector) AllocHost(size int64) (connector.HostMemory, error) {
	if size <= 0 || int64(int(size)) != size {
		return nil, errs.New(unix.EINVAL, "pcibar: host allocation of %d bytes", size)
	}
	b, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, errs.Wrapf(err, "pcibar: host allocation of %d bytes", size)
	}
	return &hostMemory{b: b}, nil
}

// Close implements connector.Connector.
func (c *Connector) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errs.New(unix.EINVAL, "pcibar: connector closed twice")
	}
	if len(c.regions) > 0 || c.streams > 0 {
		return errs.New(unix.EBUSY, "pcibar: %d memory regions and %d streams still open", len(c.regions), c.streams)
	}
	c.closed = true
	var first error
	for _, d := range c.devs {
		d.viewMu.Lock()
		if d.view != nil {
			if err := d.view.close(); err != nil && first == nil {
				first = err
			}
			d.view = nil
		}
		d.viewMu.Unlock()
	}
	return first
}

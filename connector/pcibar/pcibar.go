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
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/kmod"
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

package pcibar

import (
	"encoding/binary"
	"errors"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/internal/procfs"
	"github.com/phxmount/phxmount/kmod"
)

// BAR memory: allocation, export and import of ranges, and the check that
// a range is this process's.

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
	st, err := procfs.ReadStatus(pid)
	switch {
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH):
		return errs.New(unix.ESRCH, "pcibar: claiming process %d is gone", pid)
	case err != nil:
		return errs.Wrapf(err, "pcibar: credentials of process %d", pid)
	case st.EUID < 0:
		return errs.New(unix.EIO, "pcibar: process %d: its status has no Uid line", pid)
	case st.EUID != 0:
		return errs.New(unix.EPERM, "pcibar: process %d (euid %d) may not import BAR memory: root only", pid, st.EUID)
	}
	return nil
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

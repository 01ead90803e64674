package nvidia

import (
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
)

// Memory is device memory allocated (cuMemAlloc) or imported (CUDA IPC).
type Memory struct {
	c        *Connector
	dev      int
	addr     uint64
	size     int64
	imported bool

	mu     sync.Mutex
	closed bool
}

// Alloc allocates size bytes of device memory on dev (cuMemAlloc).
func (c *Connector) Alloc(dev int, size int64) (connector.Memory, error) {
	if err := c.acquireMemory(dev, size); err != nil {
		return nil, err
	}
	var p uint64
	err := c.onDev(dev, func() error {
		return c.d.call(c.d.cuMemAlloc, uintptr(unsafe.Pointer(&p)), uintptr(size))
	})
	if err != nil {
		c.release()
		return nil, err
	}
	return &Memory{c: c, dev: dev, addr: p, size: size}, nil
}

// Import opens a CUDA IPC handle exported by another process. pid is
// ignored: a CUDA IPC handle is a capability. size must not exceed the
// exported allocation. Importing a handle in the process that exported it
// fails in the driver.
func (c *Connector) Import(dev int, h connector.Handle, size int64, pid int) (connector.Memory, error) {
	if err := c.acquireMemory(dev, size); err != nil {
		return nil, err
	}
	var p uint64
	err := c.onDev(dev, func() error {
		r := c.d.ipcOpen(&p, ipcMemHandle{Reserved: h}, cuIpcMemLazyEnablePeerAcc)
		return c.d.check(c.d.cuIpcOpenMemHandle.name, r)
	})
	if err != nil {
		c.release()
		return nil, err
	}
	m := &Memory{c: c, dev: dev, addr: p, size: size, imported: true}
	a, err := c.attrs(dev, p)
	if err == nil && (a.memType != cuMemoryTypeDevice || a.start != p || uint64(size) > a.size) {
		err = errs.New(unix.EINVAL, "nvidia: handle names %d bytes at %#x, %d asked", a.size, a.start, size)
	}
	if err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// ptrAttrs holds the pointer attributes Resolve and Import check.
type ptrAttrs struct {
	memType uint32 // CUmemorytype; 0 when the driver does not know the pointer
	ordinal int32
	start   uint64
	size    uint64
}

// attrs queries addr's attributes in one cuPointerGetAttributes call, which
// (unlike cuPointerGetAttribute) succeeds with zero values for an unknown
// pointer.
func (c *Connector) attrs(dev int, addr uint64) (ptrAttrs, error) {
	a := &ptrAttrs{ordinal: -1}
	kinds := [4]uint32{cuPointerAttrMemoryType, cuPointerAttrDeviceOrdinal, cuPointerAttrRangeStart, cuPointerAttrRangeSize}
	data := [4]unsafe.Pointer{unsafe.Pointer(&a.memType), unsafe.Pointer(&a.ordinal), unsafe.Pointer(&a.start), unsafe.Pointer(&a.size)}
	err := c.onDev(dev, func() error {
		return c.d.call(c.d.cuPointerGetAttributes, uintptr(len(kinds)),
			uintptr(unsafe.Pointer(&kinds[0])), uintptr(unsafe.Pointer(&data[0])), uintptr(addr))
	})
	return *a, err
}

// Resolve checks that [addr, addr+size) lies inside one allocation of
// device memory on dev that this process knows (EFAULT otherwise). GPU
// memory has no host address, so it returns 0.
func (c *Connector) Resolve(dev int, addr uint64, size int64) (uintptr, error) {
	if err := c.checkDev(dev); err != nil {
		return 0, err
	}
	if err := checkSize(size); err != nil {
		return 0, err
	}
	if addr+uint64(size) < addr {
		return 0, errs.New(unix.EFAULT, "nvidia: range %#x+%d wraps", addr, size)
	}
	if err := c.checkOpen(); err != nil {
		return 0, err
	}
	a, err := c.attrs(dev, addr)
	if err != nil {
		return 0, errs.New(unix.EFAULT, "nvidia: %#x+%d: %v", addr, size, err)
	}
	switch {
	case a.memType != cuMemoryTypeDevice:
		return 0, errs.New(unix.EFAULT, "nvidia: %#x is not device memory (memory type %d)", addr, a.memType)
	case int(a.ordinal) != dev:
		return 0, errs.New(unix.EFAULT, "nvidia: %#x is memory of device %d, not %d", addr, a.ordinal, dev)
	case addr < a.start || addr+uint64(size) > a.start+a.size:
		return 0, errs.New(unix.EFAULT, "nvidia: %#x+%d runs outside its allocation %#x+%d", addr, size, a.start, a.size)
	}
	return 0, nil
}

// Device is the CUDA ordinal the memory was allocated or imported on.
func (m *Memory) Device() int { return m.dev }

// Addr is the device address in this process.
func (m *Memory) Addr() uint64 { return m.addr }

// Size is the size allocated, or the size given to Import.
func (m *Memory) Size() int64 { return m.size }

// Imported reports whether the memory came from Import.
func (m *Memory) Imported() bool { return m.imported }

// Export returns the CUDA IPC handle of the allocation (cuIpcGetMemHandle).
func (m *Memory) Export() (connector.Handle, error) {
	var h connector.Handle
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return h, errs.New(unix.EBADF, "nvidia: memory closed")
	}
	err := m.c.onDev(m.dev, func() error {
		return m.c.d.call(m.c.d.cuIpcGetMemHandle, uintptr(unsafe.Pointer(&h)), uintptr(m.addr))
	})
	return h, err
}

// Close frees allocated memory or closes the IPC mapping of imported
// memory. A second Close does nothing.
func (m *Memory) Close() error {
	return m.c.closeOnce(&m.mu, &m.closed, func() error {
		return m.c.onDev(m.dev, func() error {
			if m.imported {
				return m.c.d.call(m.c.d.cuIpcCloseMemHandle, uintptr(m.addr))
			}
			return m.c.d.call(m.c.d.cuMemFree, uintptr(m.addr))
		})
	})
}

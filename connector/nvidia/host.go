package nvidia

import (
	"sync"
	"unsafe"

	"github.com/phxmount/phxmount/connector"
)

// HostMemory is pinned host memory from AllocHost.
type HostMemory struct {
	c    *Connector
	p    unsafe.Pointer // C memory: the GC ignores it
	size int64

	mu     sync.Mutex
	closed bool
}

// AllocHost allocates pinned, portable host memory (cuMemHostAlloc): the
// copy engine reads it directly, so async copies from it overlap the host.
func (c *Connector) AllocHost(size int64) (connector.HostMemory, error) {
	if err := checkSize(size); err != nil {
		return nil, err
	}
	if err := c.acquire(); err != nil {
		return nil, err
	}
	var p unsafe.Pointer
	// Portable memory is pinned for every context; device 0's is current
	// only because the call needs one.
	err := c.onDev(0, func() error {
		return c.d.call(c.d.cuMemHostAlloc, uintptr(unsafe.Pointer(&p)), uintptr(size), cuMemHostAllocPortable)
	})
	if err != nil {
		c.release()
		return nil, err
	}
	return &HostMemory{c: c, p: p, size: size}, nil
}

// Bytes is the memory; nil once closed.
func (h *HostMemory) Bytes() []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	return unsafe.Slice((*byte)(h.p), h.size)
}

// Close frees the memory (cuMemFreeHost); slices from Bytes must no longer
// be used. A second Close does nothing.
func (h *HostMemory) Close() error {
	return h.c.closeOnce(&h.mu, &h.closed, func() error {
		return h.c.onDev(0, func() error {
			return h.c.d.call(h.c.d.cuMemFreeHost, uintptr(h.p))
		})
	})
}

// Package nvidia is the NVIDIA connector: the CUDA driver API (libcuda.so.1)
// loaded at run time with purego, so the project builds with CGO_ENABLED=0
// and runs on machines without the driver (Open then fails with ENODEV).
//
// CUDA's current context is per OS thread while goroutines migrate between
// threads, so every driver call that needs a context runs with the goroutine
// locked to its thread and the device's primary context made current first
// (cuCtxSetCurrent is a cheap thread-local store). This keeps calls from many
// goroutines parallel, unlike funnelling them through one locked goroutine.
package nvidia

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"phxmount/connector"
	"phxmount/internal/errs"
)

// gpuPageSize is the GPU page that P2P mappings (nv-p2p) pin: registrations
// must be aligned to it.
const gpuPageSize = 64 << 10

var (
	_ connector.Connector  = (*Connector)(nil)
	_ connector.Memory     = (*Memory)(nil)
	_ connector.HostMemory = (*HostMemory)(nil)
	_ connector.Stream     = (*Stream)(nil)
)

// Connector is the CUDA driver behind connector.Connector.
type Connector struct {
	d     *driver
	devs  []connector.DeviceInfo
	cudev []int32          // CUdevice of each index
	ctx   []atomic.Uintptr // retained primary context per device, 0 until first use

	sync string // PHX_CUDA_SYNC, checked at Open

	mu     sync.Mutex // guards ctx retention, live and closed
	live   int        // memory, host memory and streams not yet closed
	closed bool
}

// Open loads libcuda.so.1, initialises the driver and lists the devices.
// Without the driver it fails with an error wrapping ENODEV.
// A bad PHX_CUDA_SYNC is an error (EINVAL), never ignored.
func Open() (*Connector, error) {
	mode, err := ParseSyncMode(os.Getenv(EnvSync))
	if err != nil {
		return nil, err
	}
	d, err := load()
	if err != nil {
		return nil, err
	}
	c, err := newConnector(d)
	if err != nil {
		return nil, err
	}
	c.sync = mode
	return c, nil
}

// ParseSyncMode checks a PHX_CUDA_SYNC value: "" (the driver's choice),
// spin, yield or blocking.
func ParseSyncMode(v string) (string, error) {
	if _, ok := schedFlags[v]; !ok && v != "" {
		return "", errs.New(unix.EINVAL, "nvidia: %s=%q: want spin, yield or blocking (or unset: the driver's choice)", EnvSync, v)
	}
	return v, nil
}

// SyncMode reports how copy waits wait (PHX_CUDA_SYNC), "" for the
// driver's choice.
func (c *Connector) SyncMode() string { return c.sync }

func newConnector(d *driver) (*Connector, error) {
	if err := d.call(d.cuInit, 0); err != nil {
		return nil, err
	}
	var n int32
	if err := d.call(d.cuDeviceGetCount, uintptr(unsafe.Pointer(&n))); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, errs.New(unix.ENODEV, "nvidia: the driver sees no GPU")
	}
	c := &Connector{d: d, cudev: make([]int32, n), ctx: make([]atomic.Uintptr, n)}
	for i := range int(n) {
		var dev int32
		if err := d.call(d.cuDeviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(i)); err != nil {
			return nil, err
		}
		var name [256]byte
		if err := d.call(d.cuDeviceGetName, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)), uintptr(dev)); err != nil {
			return nil, err
		}
		var pci [64]byte
		if err := d.call(d.cuDeviceGetPCIBusId, uintptr(unsafe.Pointer(&pci[0])), uintptr(len(pci)), uintptr(dev)); err != nil {
			return nil, err
		}
		var mem uint64
		if err := d.call(d.cuDeviceTotalMem, uintptr(unsafe.Pointer(&mem)), uintptr(dev)); err != nil {
			return nil, err
		}
		c.cudev[i] = dev
		c.devs = append(c.devs, connector.DeviceInfo{
			Index:       i,
			Name:        cBuf(name[:]),
			PCIAddress:  normalizePCI(cBuf(pci[:])),
			PageSize:    gpuPageSize,
			MemoryBytes: int64(mem),
		})
	}
	return c, nil
}

// cBuf is the text of a NUL-terminated buffer the driver filled.
func cBuf(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// normalizePCI turns the driver's "00000000:3B:00.0" into the sysfs form
// "0000:3b:00.0" that the rest of the system (and phxfs) uses.
func normalizePCI(s string) string {
	var dom, bus, dev, fn uint32
	if n, err := fmt.Sscanf(s, "%x:%x:%x.%x", &dom, &bus, &dev, &fn); err != nil || n != 4 {
		return strings.ToLower(s)
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", dom, bus, dev, fn)
}

// Vendor is "nvidia".
func (c *Connector) Vendor() string { return "nvidia" }

// Devices lists the GPUs in CUDA ordinal order.
func (c *Connector) Devices() ([]connector.DeviceInfo, error) {
	return append([]connector.DeviceInfo(nil), c.devs...), nil
}

// HostAddressable is false: GPU memory is not mapped into the CPU's space.
func (c *Connector) HostAddressable() bool { return false }

func (c *Connector) checkDev(dev int) error {
	if dev < 0 || dev >= len(c.devs) {
		return errs.New(unix.ENODEV, "nvidia: no device %d (%d GPUs)", dev, len(c.devs))
	}
	return nil
}

func checkSize(size int64) error {
	if size <= 0 {
		return errs.New(unix.EINVAL, "nvidia: size %d must be positive", size)
	}
	return nil
}

func (c *Connector) checkOpen() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errs.New(unix.EBADF, "nvidia: connector closed")
	}
	return nil
}

// acquire counts an object that must be closed before the connector.
// acquireMemory checks a memory request's device and size, then counts the
// memory about to exist (release undoes it on failure).
func (c *Connector) acquireMemory(dev int, size int64) error {
	if err := c.checkDev(dev); err != nil {
		return err
	}
	if err := checkSize(size); err != nil {
		return err
	}
	return c.acquire()
}

func (c *Connector) acquire() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errs.New(unix.EBADF, "nvidia: connector closed")
	}
	c.live++
	return nil
}

func (c *Connector) release() {
	c.mu.Lock()
	c.live--
	c.mu.Unlock()
}

// context returns dev's primary context, retaining it on first use: a
// EnvSync chooses how a thread waiting for the GPU waits: "spin", "yield"
// or "blocking" (the driver's CU_CTX_SCHED_* flags); unset leaves the
// driver's choice (spin when there are fewer contexts than cores). Copy
// waits that spin take cores from the storage reads they overlap with.
const EnvSync = "PHX_CUDA_SYNC"

var schedFlags = map[string]uintptr{"spin": 1, "yield": 2, "blocking": 4}

// retain creates the context (slow, and it takes GPU memory), so listing
// devices does not.
func (c *Connector) context(dev int) (uintptr, error) {
	if ctx := c.ctx[dev].Load(); ctx != 0 {
		return ctx, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, errs.New(unix.EBADF, "nvidia: connector closed")
	}
	if ctx := c.ctx[dev].Load(); ctx != 0 {
		return ctx, nil
	}
	if flags, ok := schedFlags[c.sync]; ok && c.d.cuDevicePrimaryCtxSetFlags.addr != 0 {
		if err := c.d.call(c.d.cuDevicePrimaryCtxSetFlags, uintptr(c.cudev[dev]), flags); err != nil {
			return 0, err
		}
	}
	var ctx uintptr
	if err := c.d.call(c.d.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&ctx)), uintptr(c.cudev[dev])); err != nil {
		return 0, err
	}
	c.ctx[dev].Store(ctx)
	return ctx, nil
}

// onDev runs f on a locked OS thread with dev's context current, so that
// the driver calls inside f see that context whatever thread runs them.
func (c *Connector) onDev(dev int, f func() error) error {
	ctx, err := c.context(dev)
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.d.call(c.d.cuCtxSetCurrent, ctx); err != nil {
		return err
	}
	return f()
}

// Close releases the primary contexts this connector retained. Every
// memory, host memory and stream must be closed first (EBUSY otherwise).
// The driver library stays loaded; a second Close does nothing.
func (c *Connector) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	if c.live > 0 {
		return errs.New(unix.EBUSY, "nvidia: %d memory regions or streams still open", c.live)
	}
	c.closed = true
	var first error
	for i := range c.ctx {
		if c.ctx[i].Swap(0) == 0 {
			continue
		}
		if err := c.d.call(c.d.cuDevicePrimaryCtxRelease, uintptr(c.cudev[i])); err != nil && first == nil {
			first = err
		}
	}
	return first
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

// NewStream creates a non-blocking stream on dev: it does not serialise
// with the legacy default stream, so copies on different streams overlap.
func (c *Connector) NewStream(dev int) (connector.Stream, error) {
	if err := c.checkDev(dev); err != nil {
		return nil, err
	}
	if err := c.acquire(); err != nil {
		return nil, err
	}
	var h uintptr
	err := c.onDev(dev, func() error {
		return c.d.call(c.d.cuStreamCreate, uintptr(unsafe.Pointer(&h)), cuStreamNonBlocking)
	})
	if err != nil {
		c.release()
		return nil, err
	}
	return &Stream{c: c, dev: dev, h: h}, nil
}

// syncLegacy waits for the legacy default stream, where the synchronous
// copies and memsets below run: a pageable host-to-device copy or a memset
// may return before the device has the bytes.
func (c *Connector) syncLegacy() error {
	return c.d.call(c.d.cuStreamSynchronize, 0)
}

// CopyToHost copies len(dst) bytes of dev's memory at src into dst and
// returns once they are there. Copies queued on Streams are not waited for.
func (c *Connector) CopyToHost(dst []byte, src uint64, dev int) error {
	if err := c.checkDev(dev); err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	if err := c.checkOpen(); err != nil {
		return err
	}
	return c.onDev(dev, func() error {
		return c.d.call(c.d.cuMemcpyDtoH, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)))
	})
}

// CopyToDeviceSync copies src to dev's memory at dst and returns once the
// device holds the bytes.
func (c *Connector) CopyToDeviceSync(dev int, dst uint64, src []byte) error {
	if err := c.checkDev(dev); err != nil {
		return err
	}
	if len(src) == 0 {
		return nil
	}
	if err := c.checkOpen(); err != nil {
		return err
	}
	return c.onDev(dev, func() error {
		if err := c.d.call(c.d.cuMemcpyHtoD, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src))); err != nil {
			return err
		}
		return c.syncLegacy()
	})
}

// Memset sets n bytes of dev's memory at addr to b and returns once done.
func (c *Connector) Memset(dev int, addr uint64, b byte, n int64) error {
	if err := c.checkDev(dev); err != nil {
		return err
	}
	if n < 0 {
		return errs.New(unix.EINVAL, "nvidia: memset of %d bytes", n)
	}
	if n == 0 {
		return nil
	}
	if err := c.checkOpen(); err != nil {
		return err
	}
	return c.onDev(dev, func() error {
		if err := c.d.call(c.d.cuMemsetD8, uintptr(addr), uintptr(b), uintptr(n)); err != nil {
			return err
		}
		return c.syncLegacy()
	})
}

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
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	defer m.c.release()
	return m.c.onDev(m.dev, func() error {
		if m.imported {
			return m.c.d.call(m.c.d.cuIpcCloseMemHandle, uintptr(m.addr))
		}
		return m.c.d.call(m.c.d.cuMemFree, uintptr(m.addr))
	})
}

// HostMemory is pinned host memory from AllocHost.
type HostMemory struct {
	c    *Connector
	p    unsafe.Pointer // C memory: the GC ignores it
	size int64

	mu     sync.Mutex
	closed bool
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
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	defer h.c.release()
	return h.c.onDev(0, func() error {
		return h.c.d.call(h.c.d.cuMemFreeHost, uintptr(h.p))
	})
}

// Stream is a non-blocking CUDA stream on one device.
type Stream struct {
	c   *Connector
	dev int
	h   uintptr

	mu     sync.Mutex
	held   [][]byte // host buffers of queued copies: reachable until Synchronize
	err    error    // first enqueue error since the last Synchronize
	closed bool
}

func (s *Stream) enqueue(buf []byte, f func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errs.New(unix.EBADF, "nvidia: stream closed")
	}
	err := s.c.onDev(s.dev, f)
	if err != nil {
		if s.err == nil {
			s.err = err
		}
		return err
	}
	s.held = append(s.held, buf)
	return nil
}

// CopyToDevice queues a copy of src to device address dst. src must stay
// untouched until Synchronize returns; pinned memory (AllocHost) makes the
// copy truly asynchronous.
func (s *Stream) CopyToDevice(dst uint64, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return s.enqueue(src, func() error {
		return s.c.d.call(s.c.d.cuMemcpyHtoDAsync, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)), s.h)
	})
}

// CopyFromDevice queues a copy of len(dst) bytes at device address src into
// dst, which holds them once Synchronize returns.
func (s *Stream) CopyFromDevice(dst []byte, src uint64) error {
	if len(dst) == 0 {
		return nil
	}
	return s.enqueue(dst, func() error {
		return s.c.d.call(s.c.d.cuMemcpyDtoHAsync, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)), s.h)
	})
}

// Synchronize waits for every queued copy and returns the first error of
// an enqueue or of the copies since the last Synchronize.
func (s *Stream) Synchronize() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errs.New(unix.EBADF, "nvidia: stream closed")
	}
	return s.syncLocked()
}

func (s *Stream) syncLocked() error {
	err := s.c.onDev(s.dev, func() error {
		return s.c.d.call(s.c.d.cuStreamSynchronize, s.h)
	})
	if s.err != nil {
		err = s.err
	}
	s.err = nil
	clear(s.held)
	s.held = s.held[:0]
	return err
}

// Close waits for the queued copies (their host buffers may be Go memory)
// and destroys the stream. A second Close does nothing.
func (s *Stream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	defer s.c.release()
	err := s.syncLocked()
	if derr := s.c.onDev(s.dev, func() error {
		return s.c.d.call(s.c.d.cuStreamDestroy, s.h)
	}); err == nil {
		err = derr
	}
	return err
}

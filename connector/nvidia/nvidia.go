// Package nvidia is the NVIDIA connector: the CUDA driver API (libcuda.so.1)
// behind connector.Connector, loaded at run time with purego, so the project
// builds with CGO_ENABLED=0 and runs on machines without the driver (Open
// then fails with ENODEV).
//
// What it offers, one file each:
//
//   - nvidia.go: Open initialises the driver and lists the GPUs (name, PCI
//     address in sysfs form, memory); Close releases what the connector
//     retained, once every object it handed out is closed (EBUSY before).
//   - context.go: CUDA's current context is per OS thread while goroutines
//     migrate between threads, so every driver call that needs a context
//     runs with the goroutine locked to its thread and the device's primary
//     context made current first (cuCtxSetCurrent is a cheap thread-local
//     store). This keeps calls from many goroutines parallel, unlike
//     funnelling them through one locked goroutine. The primary context is
//     retained on first use, with PHX_CUDA_SYNC's wait flags.
//   - memory.go: device memory, allocated (cuMemAlloc) or imported from
//     another process through a CUDA IPC handle (Export makes one); Resolve
//     checks a range against the driver's pointer attributes.
//   - host.go: pinned, portable host memory (cuMemHostAlloc), which the copy
//     engine reads directly, so async copies from it overlap the host.
//   - stream.go: non-blocking streams queueing async copies, and the
//     synchronous copies and memset on the legacy default stream.
//   - driver.go and errors.go: the bound entry points, and a failed call as
//     a CUDAError that unwraps to an errno (errors.Is(err, unix.ENOMEM)).
package nvidia

import (
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/internal/pciaddr"
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

	sync    string       // PHX_CUDA_SYNC, checked at Open
	scatter atomic.Value // string: PHX_SCATTER, checked at Open (SetScatter)

	kern     []kernelState // per device, set when its context is retained
	pieceOps [methodCount]atomic.Int64

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
	scatter, err := ParseScatterMode(os.Getenv(EnvScatter))
	if err != nil {
		return nil, err
	}
	d, err := load()
	if err != nil {
		return nil, err
	}
	if scatter == "batch" && d.cuMemcpyBatchAsync.addr == 0 {
		return nil, errs.New(unix.EOPNOTSUPP, "nvidia: %s=batch, but the driver has no cuMemcpyBatchAsync (CUDA 12.8+)", EnvScatter)
	}
	c, err := newConnector(d)
	if err != nil {
		return nil, err
	}
	c.sync = mode
	c.scatter.Store(scatter)
	return c, nil
}

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
	c := &Connector{d: d, cudev: make([]int32, n), ctx: make([]atomic.Uintptr, n), kern: make([]kernelState, n)}
	c.scatter.Store("auto")
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
			PCIAddress:  pciaddr.Normalize(cBuf(pci[:])),
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

// acquire counts an object that must be closed before the connector.
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

// closeOnce closes one of the connector's objects: under the object's
// lock, the first call marks it closed, runs free and uncounts it (whatever
// free returns); later calls do nothing.
func (c *Connector) closeOnce(mu *sync.Mutex, closed *bool, free func() error) error {
	mu.Lock()
	defer mu.Unlock()
	if *closed {
		return nil
	}
	*closed = true
	defer c.release()
	return free()
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
		ctx := c.ctx[i].Swap(0)
		if ctx == 0 {
			continue
		}
		err := c.unloadKernel(i, ctx)
		if rerr := c.d.call(c.d.cuDevicePrimaryCtxRelease, uintptr(c.cudev[i])); err == nil {
			err = rerr
		}
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

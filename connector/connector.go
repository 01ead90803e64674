// Package connector puts accelerator vendors behind one interface: device
// discovery, device memory, shareable handles and host<->device copies.
// phxfs and the rest of the project never call a vendor API directly.
package connector

// HandleSize is the size of a shareable memory handle. A CUDA IPC memory
// handle is exactly this size; other vendors encode theirs into it.
const HandleSize = 64

// Handle names device memory exported by one process so that another can
// import it.
type Handle [HandleSize]byte

// DeviceInfo describes one accelerator.
type DeviceInfo struct {
	Index       int
	Name        string
	PCIAddress  string // domain:bus:device.function, lower case ("0000:3b:00.0")
	PageSize    int64  // registrations must be aligned to this
	MemoryBytes int64
}

// Connector is one vendor's device access.
type Connector interface {
	// Vendor names the connector ("emu", "nvidia").
	Vendor() string
	// Devices lists the accelerators, index order.
	Devices() ([]DeviceInfo, error)
	// HostAddressable reports whether device memory can be addressed by the
	// CPU (and so by O_DIRECT I/O) through Resolve's host address.
	HostAddressable() bool

	// Alloc allocates size bytes of device memory on dev.
	Alloc(dev int, size int64) (Memory, error)
	// Import maps memory that another process exported with Memory.Export.
	// pid is the process that claims the handle: connectors whose handles
	// name a process (emu, pcibar) refuse a handle that another process
	// exported (pcibar also a claimant that is not root); connectors whose
	// handles are capabilities (CUDA IPC) ignore it.
	Import(dev int, h Handle, size int64, pid int) (Memory, error)
	// Resolve checks that [addr, addr+size) is device memory of dev known to
	// this process (allocated or imported) and returns its host address, or
	// 0 when the connector is not host-addressable.
	Resolve(dev int, addr uint64, size int64) (host uintptr, err error)

	// AllocHost allocates host memory suited to asynchronous copies (pinned
	// where the vendor has the notion): the bounce buffers of the staged
	// transport.
	AllocHost(size int64) (HostMemory, error)
	// NewStream creates an ordered queue of asynchronous copies on dev.
	NewStream(dev int) (Stream, error)

	// Close releases the connector. Memory and streams must be closed first.
	Close() error
}

// Memory is a device memory region allocated or imported by this process.
type Memory interface {
	Device() int
	// Addr is the device address in this process: what I/O names.
	Addr() uint64
	Size() int64
	// Export returns a handle another process can Import.
	Export() (Handle, error)
	// Close frees allocated memory or unmaps imported memory.
	Close() error
}

// HostMemory is host memory from AllocHost.
type HostMemory interface {
	Bytes() []byte
	Close() error
}

// Piece is one run of a scatter or gather: Len bytes at offset Off of a
// host buffer, and the device memory at Dev they go to or come from.
type Piece struct {
	Off int64
	Dev uint64
	Len int64
}

// Stream is an ordered queue of asynchronous copies on one device. The host
// buffer of a copy must stay untouched until a Fence recorded after it has
// been waited for, or Synchronize returns.
//
// An error is reported to the transfer that caused it. A copy, scatter or
// gather that fails to enqueue returns its error and leaves nothing of
// itself in flight; no later Fence or Synchronize reports it again (the
// stream's next user may be another transfer). An error of a queued copy
// is reported by the Fence that covers it. An error that breaks the whole
// device (a sticky CUDA context error) is reported to every wait after it.
type Stream interface {
	CopyToDevice(dst uint64, src []byte) error
	CopyFromDevice(dst []byte, src uint64) error
	// ScatterToDevice queues the copy of every piece of src to its device
	// address: the KV-cache pattern, many blocks landing in scattered
	// slots. Connectors move them in as few device operations as they can
	// (NVIDIA: one copy and a scatter kernel, or one batched copy).
	ScatterToDevice(src []byte, pieces []Piece) error
	// GatherFromDevice queues the copy of every piece's device bytes into
	// dst at the piece's offset.
	GatherFromDevice(dst []byte, pieces []Piece) error
	// Fence marks the copies queued so far. Its Wait returns once they
	// have completed and reports the first error among the copies queued
	// since the previous Fence (or Synchronize): one stream serves several
	// bounce buffers, each ending with a Fence.
	Fence() (Fence, error)
	// Synchronize waits for every copy enqueued so far and reports the first
	// error among those no Fence has reported.
	Synchronize() error
	Close() error
}

// Fence is a point in a Stream. Wait may be called once; it releases the
// fence.
type Fence interface {
	Wait() error
}

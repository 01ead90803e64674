package nvidia

import (
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// libName is the driver library. The unversioned libcuda.so is often only
// the toolkit's stub, which fails every call; the .1 soname is the driver.
const libName = "libcuda.so.1"

// CUDA driver API constants used here (cuda.h).
const (
	cuStreamNonBlocking        = 0x1 // CU_STREAM_NON_BLOCKING
	cuMemHostAllocPortable     = 0x1 // CU_MEMHOSTALLOC_PORTABLE
	cuIpcMemLazyEnablePeerAcc  = 0x1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
	cuMemoryTypeDevice         = 2   // CU_MEMORYTYPE_DEVICE
	cuPointerAttrMemoryType    = 2   // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
	cuPointerAttrDeviceOrdinal = 9   // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
	cuPointerAttrRangeStart    = 11  // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
	cuPointerAttrRangeSize     = 12  // CU_POINTER_ATTRIBUTE_RANGE_SIZE
	cuEventDisableTiming       = 0x2 // CU_EVENT_DISABLE_TIMING
)

// ipcMemHandle is CUipcMemHandle: 64 opaque bytes that cuIpcOpenMemHandle
// takes by value (on the stack under the SysV ABI).
type ipcMemHandle struct {
	Reserved [64]byte
}

// fn is one bound driver entry point; the name goes into errors.
type fn struct {
	name string
	addr uintptr
}

// driver is libcuda's entry points. Plain-integer calls go through
// purego.SyscallN (no reflection on the copy path); the one call that takes
// a struct by value goes through a purego.RegisterFunc binding.
type driver struct {
	cuInit                    fn
	cuDeviceGetCount          fn
	cuDeviceGet               fn
	cuDeviceGetName           fn
	cuDeviceGetPCIBusId       fn
	cuDeviceTotalMem          fn
	cuDevicePrimaryCtxRetain  fn
	cuDevicePrimaryCtxRelease fn
	// optional: absent in old drivers
	cuDevicePrimaryCtxSetFlags fn
	cuCtxSetCurrent            fn
	cuCtxGetCurrent            fn
	cuMemAlloc                 fn
	cuMemFree                  fn
	cuMemHostAlloc             fn
	cuMemFreeHost              fn
	cuMemcpyHtoD               fn
	cuMemcpyDtoH               fn
	cuMemcpyHtoDAsync          fn
	cuMemcpyDtoHAsync          fn
	cuMemsetD8                 fn
	cuStreamCreate             fn
	cuStreamSynchronize        fn
	cuStreamDestroy            fn
	cuIpcGetMemHandle          fn
	cuIpcOpenMemHandle         fn
	cuIpcCloseMemHandle        fn
	cuPointerGetAttributes     fn
	cuGetErrorName             fn
	cuGetErrorString           fn
	cuEventCreate              fn
	cuEventRecord              fn
	cuEventSynchronize         fn
	cuEventDestroy             fn
	cuModuleLoadData           fn
	cuModuleGetFunction        fn
	cuModuleUnload             fn
	cuLaunchKernel             fn
	// optional: CUDA 12.8+ (13.0 renamed it _v2 and dropped failIdx)
	cuMemcpyBatchAsync fn

	ipcOpen func(dptr *uint64, h ipcMemHandle, flags uint32) uint32
}

// symbol is one entry point with the names to try, newest first: the
// versioned names are what cuda.h's macros resolve to. An optional one
// may be absent (its fn stays zero).
type symbol struct {
	f        *fn
	names    []string
	optional bool
}

// symbols lists the entry points bind resolves.
func (d *driver) symbols() []symbol {
	return []symbol{
		{f: &d.cuInit, names: []string{"cuInit"}},
		{f: &d.cuDeviceGetCount, names: []string{"cuDeviceGetCount"}},
		{f: &d.cuDeviceGet, names: []string{"cuDeviceGet"}},
		{f: &d.cuDeviceGetName, names: []string{"cuDeviceGetName"}},
		{f: &d.cuDeviceGetPCIBusId, names: []string{"cuDeviceGetPCIBusId"}},
		{f: &d.cuDeviceTotalMem, names: []string{"cuDeviceTotalMem_v2"}},
		{f: &d.cuDevicePrimaryCtxRetain, names: []string{"cuDevicePrimaryCtxRetain"}},
		{f: &d.cuDevicePrimaryCtxRelease, names: []string{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}},
		{f: &d.cuCtxSetCurrent, names: []string{"cuCtxSetCurrent"}},
		{f: &d.cuCtxGetCurrent, names: []string{"cuCtxGetCurrent"}},
		{f: &d.cuMemAlloc, names: []string{"cuMemAlloc_v2"}},
		{f: &d.cuMemFree, names: []string{"cuMemFree_v2"}},
		{f: &d.cuMemHostAlloc, names: []string{"cuMemHostAlloc"}},
		{f: &d.cuMemFreeHost, names: []string{"cuMemFreeHost"}},
		{f: &d.cuMemcpyHtoD, names: []string{"cuMemcpyHtoD_v2"}},
		{f: &d.cuMemcpyDtoH, names: []string{"cuMemcpyDtoH_v2"}},
		{f: &d.cuMemcpyHtoDAsync, names: []string{"cuMemcpyHtoDAsync_v2"}},
		{f: &d.cuMemcpyDtoHAsync, names: []string{"cuMemcpyDtoHAsync_v2"}},
		{f: &d.cuMemsetD8, names: []string{"cuMemsetD8_v2"}},
		{f: &d.cuStreamCreate, names: []string{"cuStreamCreate"}},
		{f: &d.cuStreamSynchronize, names: []string{"cuStreamSynchronize"}},
		{f: &d.cuStreamDestroy, names: []string{"cuStreamDestroy_v2", "cuStreamDestroy"}},
		{f: &d.cuIpcGetMemHandle, names: []string{"cuIpcGetMemHandle"}},
		{f: &d.cuIpcOpenMemHandle, names: []string{"cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"}},
		{f: &d.cuIpcCloseMemHandle, names: []string{"cuIpcCloseMemHandle"}},
		{f: &d.cuPointerGetAttributes, names: []string{"cuPointerGetAttributes"}},
		{f: &d.cuGetErrorName, names: []string{"cuGetErrorName"}},
		{f: &d.cuGetErrorString, names: []string{"cuGetErrorString"}},
		{f: &d.cuEventCreate, names: []string{"cuEventCreate"}},
		{f: &d.cuEventRecord, names: []string{"cuEventRecord"}},
		{f: &d.cuEventSynchronize, names: []string{"cuEventSynchronize"}},
		{f: &d.cuEventDestroy, names: []string{"cuEventDestroy_v2", "cuEventDestroy"}},
		{f: &d.cuModuleLoadData, names: []string{"cuModuleLoadData"}},
		{f: &d.cuModuleGetFunction, names: []string{"cuModuleGetFunction"}},
		{f: &d.cuModuleUnload, names: []string{"cuModuleUnload"}},
		{f: &d.cuLaunchKernel, names: []string{"cuLaunchKernel"}},
		{f: &d.cuDevicePrimaryCtxSetFlags, names: []string{"cuDevicePrimaryCtxSetFlags_v2"}, optional: true},
		{f: &d.cuMemcpyBatchAsync, names: []string{"cuMemcpyBatchAsync_v2", "cuMemcpyBatchAsync"}, optional: true},
	}
}

// bind resolves every entry point through lookup (0 = absent). It probes
// instead of using purego.RegisterLibFunc, which panics on a missing symbol.
func bind(lookup func(name string) uintptr) (*driver, error) {
	d := &driver{}
	for _, s := range d.symbols() {
		for _, n := range s.names {
			if a := lookup(n); a != 0 {
				*s.f = fn{name: n, addr: a}
				break
			}
		}
		if s.f.addr == 0 && !s.optional {
			return nil, errs.New(unix.ENOSYS, "%s: no %s in the driver (driver too old?)", libName, s.names[0])
		}
	}
	purego.RegisterFunc(&d.ipcOpen, d.cuIpcOpenMemHandle.addr)
	return d, nil
}

// openDriver dlopens lib and binds it.
func openDriver(lib string) (*driver, error) {
	h, err := purego.Dlopen(lib, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, errs.New(unix.ENODEV, "%s not found: no NVIDIA driver on this machine (%v)", lib, err)
	}
	// The library stays loaded for the life of the process: the driver
	// keeps threads of its own, and unloading it under them is unsafe.
	return bind(func(name string) uintptr {
		a, err := purego.Dlsym(h, name)
		if err != nil {
			return 0
		}
		return a
	})
}

var (
	loadOnce sync.Once
	loaded   *driver
	loadErr  error
)

// load binds libcuda once per process.
func load() (*driver, error) {
	loadOnce.Do(func() { loaded, loadErr = openDriver(libName) })
	return loaded, loadErr
}

// call invokes f and turns a non-zero CUresult into an error. The
// uintptrescapes directive keeps Go memory passed as uintptr(unsafe.Pointer(..))
// on the heap and alive for the whole call, as for syscall.Syscall.
//
//go:uintptrescapes
func (d *driver) call(f fn, args ...uintptr) error {
	if countCall != nil {
		countCall(f.name)
	}
	r, _, _ := purego.SyscallN(f.addr, args...)
	return d.check(f.name, uint32(r))
}

// countCall, when set (tests only, with nothing else calling the
// driver), sees the name of every driver call: how many calls a scatter,
// a fence and its wait cost is what KV-cache blocks pay per worker share.
var countCall func(name string)

// check turns CUresult code from the call named fname into an error.
func (d *driver) check(fname string, code uint32) error {
	if code == 0 {
		return nil
	}
	return newCUDAError(fname, code, d.errorName(code), d.errorString(code))
}

// errorName asks the driver for the CUresult's name; "" when it has none.
func (d *driver) errorName(code uint32) string {
	return d.errText(d.cuGetErrorName, code)
}

// errorString asks the driver for the CUresult's description.
func (d *driver) errorString(code uint32) string {
	return d.errText(d.cuGetErrorString, code)
}

func (d *driver) errText(f fn, code uint32) string {
	if f.addr == 0 {
		return ""
	}
	var p *byte
	r, _, _ := purego.SyscallN(f.addr, uintptr(code), uintptr(unsafe.Pointer(&p)))
	if r != 0 || p == nil {
		return ""
	}
	return cString(p)
}

// cString copies a NUL-terminated C string (the driver's static text).
func cString(p *byte) string {
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

package nvidia

import (
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"golang.org/x/sys/unix"

	"phxmount/internal/errs"
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

	ipcOpen func(dptr *uint64, h ipcMemHandle, flags uint32) uint32
}

// symbols lists each entry point with the names to try, newest first: the
// versioned names are what cuda.h's macros resolve to.
func (d *driver) symbols() []struct {
	f     *fn
	names []string
} {
	return []struct {
		f     *fn
		names []string
	}{
		{&d.cuInit, []string{"cuInit"}},
		{&d.cuDeviceGetCount, []string{"cuDeviceGetCount"}},
		{&d.cuDeviceGet, []string{"cuDeviceGet"}},
		{&d.cuDeviceGetName, []string{"cuDeviceGetName"}},
		{&d.cuDeviceGetPCIBusId, []string{"cuDeviceGetPCIBusId"}},
		{&d.cuDeviceTotalMem, []string{"cuDeviceTotalMem_v2"}},
		{&d.cuDevicePrimaryCtxRetain, []string{"cuDevicePrimaryCtxRetain"}},
		{&d.cuDevicePrimaryCtxRelease, []string{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}},
		{&d.cuCtxSetCurrent, []string{"cuCtxSetCurrent"}},
		{&d.cuCtxGetCurrent, []string{"cuCtxGetCurrent"}},
		{&d.cuMemAlloc, []string{"cuMemAlloc_v2"}},
		{&d.cuMemFree, []string{"cuMemFree_v2"}},
		{&d.cuMemHostAlloc, []string{"cuMemHostAlloc"}},
		{&d.cuMemFreeHost, []string{"cuMemFreeHost"}},
		{&d.cuMemcpyHtoD, []string{"cuMemcpyHtoD_v2"}},
		{&d.cuMemcpyDtoH, []string{"cuMemcpyDtoH_v2"}},
		{&d.cuMemcpyHtoDAsync, []string{"cuMemcpyHtoDAsync_v2"}},
		{&d.cuMemcpyDtoHAsync, []string{"cuMemcpyDtoHAsync_v2"}},
		{&d.cuMemsetD8, []string{"cuMemsetD8_v2"}},
		{&d.cuStreamCreate, []string{"cuStreamCreate"}},
		{&d.cuStreamSynchronize, []string{"cuStreamSynchronize"}},
		{&d.cuStreamDestroy, []string{"cuStreamDestroy_v2", "cuStreamDestroy"}},
		{&d.cuIpcGetMemHandle, []string{"cuIpcGetMemHandle"}},
		{&d.cuIpcOpenMemHandle, []string{"cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"}},
		{&d.cuIpcCloseMemHandle, []string{"cuIpcCloseMemHandle"}},
		{&d.cuPointerGetAttributes, []string{"cuPointerGetAttributes"}},
		{&d.cuGetErrorName, []string{"cuGetErrorName"}},
		{&d.cuGetErrorString, []string{"cuGetErrorString"}},
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
		if s.f.addr == 0 {
			return nil, errs.New(unix.ENOSYS, "%s: no %s in the driver (driver too old?)", libName, s.names[0])
		}
	}
	purego.RegisterFunc(&d.ipcOpen, d.cuIpcOpenMemHandle.addr)
	if a := lookup("cuDevicePrimaryCtxSetFlags_v2"); a != 0 {
		d.cuDevicePrimaryCtxSetFlags = fn{name: "cuDevicePrimaryCtxSetFlags_v2", addr: a}
	}
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
	r, _, _ := purego.SyscallN(f.addr, args...)
	return d.check(f.name, uint32(r))
}

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

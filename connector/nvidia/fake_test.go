package nvidia

import (
	"encoding/binary"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"golang.org/x/sys/unix"
)

// A fake libcuda made of purego callbacks: the connector calls it through
// the same SyscallN and struct-by-value paths as the real driver, so the
// plumbing (out-pointers, the 64-byte handle on the stack, error naming,
// context-per-thread discipline) is tested on machines without a GPU.

const (
	fakeDevs     = 2
	fakeMem      = 1 << 30
	fakeBase     = 0x7f0000000000
	fakeCtxBase  = 0xc0
	fakeHandleID = 0x50484658 // "PHFX"
)

type fakeAlloc struct {
	base uint64
	mem  []byte
	dev  int
}

// fakeGPU is the fake driver's state. Callbacks are process-wide (purego
// keeps at most 2000), so they are made once and read the current fake.
type fakeGPU struct {
	mu        sync.Mutex
	next      uint64
	allocs    []*fakeAlloc
	host      map[unsafe.Pointer][]byte
	current   map[int]uintptr // OS thread id -> current context, as in CUDA
	retained  [fakeDevs]int
	streams   map[uintptr]int // stream -> device
	nextStrm  uintptr
	allocFail uint32 // CUresult cuMemAlloc_v2 returns when non-zero

	noCtx      []string // calls that ran with no or the wrong context current
	openHandle ipcMemHandle
	openFlags  uint32
	streamFlag uint32
	ipcOpen    int
	ipcClose   int
	pieces     fakePieces
}

var (
	fakeMu    sync.Mutex // serialises tests that use the fake
	fake      *fakeGPU
	fakeSyms  map[string]uintptr
	fakeOnce  sync.Once
	fakeNames = map[uint32][2][]byte{
		1:   {[]byte("CUDA_ERROR_INVALID_VALUE\x00"), []byte("invalid argument\x00")},
		2:   {[]byte("CUDA_ERROR_OUT_OF_MEMORY\x00"), []byte("out of memory\x00")},
		100: {[]byte("CUDA_ERROR_NO_DEVICE\x00"), []byte("no CUDA-capable device is detected\x00")},
		201: {[]byte("CUDA_ERROR_INVALID_CONTEXT\x00"), []byte("invalid device context\x00")},
	}
)

func newFake() *fakeGPU {
	return &fakeGPU{
		next:     fakeBase,
		host:     map[unsafe.Pointer][]byte{},
		current:  map[int]uintptr{},
		streams:  map[uintptr]int{},
		nextStrm: 0x5000,
		pieces:   fakePieces{events: map[uintptr]bool{}},
	}
}

// find is the allocation holding [addr, addr+n); caller holds mu.
func (f *fakeGPU) find(addr uint64, n uint64) *fakeAlloc {
	for _, a := range f.allocs {
		if addr >= a.base && addr+n <= a.base+uint64(len(a.mem)) {
			return a
		}
	}
	return nil
}

// needCtx records a call made without a context current on this thread,
// or with another device's; caller holds mu. It returns the device.
func (f *fakeGPU) needCtx(name string) (int, bool) {
	ctx := f.current[unix.Gettid()]
	dev := int(ctx) - fakeCtxBase
	if ctx == 0 || dev < 0 || dev >= fakeDevs || f.retained[dev] == 0 {
		f.noCtx = append(f.noCtx, name)
		return 0, false
	}
	return dev, true
}

func (f *fakeGPU) needDev(name string, want int) {
	if dev, ok := f.needCtx(name); ok && dev != want {
		f.noCtx = append(f.noCtx, name+" (wrong device)")
	}
}

func bytesAt(p *byte, n uintptr) []byte { return unsafe.Slice(p, n) }

func putC(dst *byte, n int32, s string) {
	b := unsafe.Slice(dst, n)
	copy(b, s)
	b[len(s)] = 0
}

// fakeDriver binds a fresh fake through bind, as Open binds libcuda.
func fakeDriver(f *fakeGPU) *driver {
	fakeOnce.Do(makeFakeSyms)
	fake = f
	d, err := bind(func(name string) uintptr { return fakeSyms[name] })
	if err != nil {
		panic(err)
	}
	return d
}

func makeFakeSyms() {
	cb := purego.NewCallback
	lock := func() *fakeGPU { fake.mu.Lock(); return fake }
	// inCtx runs fn under the lock on the device whose context is current,
	// or fails with CUDA_ERROR_INVALID_CONTEXT when none is.
	inCtx := func(name string, fn func(f *fakeGPU, dev int) uintptr) uintptr {
		f := lock()
		defer f.mu.Unlock()
		dev, ok := f.needCtx(name)
		if !ok {
			return 201
		}
		return fn(f, dev)
	}
	// errorText is cuGetErrorName (0) or cuGetErrorString (1).
	errorText := func(which int) uintptr {
		return cb(func(code uint32, out **byte) uintptr {
			s, ok := fakeNames[code]
			if !ok {
				return 1
			}
			*out = &s[which][0]
			return 0
		})
	}
	fakeSyms = map[string]uintptr{
		"cuInit":           cb(func(flags uint32) uintptr { return 0 }),
		"cuDeviceGetCount": cb(func(n *int32) uintptr { *n = fakeDevs; return 0 }),
		"cuDeviceGet": cb(func(d *int32, i int32) uintptr {
			if i < 0 || i >= fakeDevs {
				return 101
			}
			*d = i
			return 0
		}),
		"cuDeviceGetName": cb(func(buf *byte, n int32, dev int32) uintptr {
			putC(buf, n, "Fake GPU "+string(rune('0'+dev)))
			return 0
		}),
		"cuDeviceGetPCIBusId": cb(func(buf *byte, n int32, dev int32) uintptr {
			putC(buf, n, "00000000:3B:0"+string(rune('0'+dev))+".0")
			return 0
		}),
		"cuDeviceTotalMem_v2": cb(func(p *uint64, dev int32) uintptr { *p = fakeMem; return 0 }),
		"cuDevicePrimaryCtxRetain": cb(func(ctx *uintptr, dev int32) uintptr {
			f := lock()
			defer f.mu.Unlock()
			f.retained[dev]++
			*ctx = fakeCtxBase + uintptr(dev)
			return 0
		}),
		"cuDevicePrimaryCtxRelease_v2": cb(func(dev int32) uintptr {
			f := lock()
			defer f.mu.Unlock()
			f.retained[dev]--
			return 0
		}),
		"cuCtxSetCurrent": cb(func(ctx uintptr) uintptr {
			f := lock()
			defer f.mu.Unlock()
			f.current[unix.Gettid()] = ctx
			return 0
		}),
		"cuCtxGetCurrent": cb(func(ctx *uintptr) uintptr {
			f := lock()
			defer f.mu.Unlock()
			*ctx = f.current[unix.Gettid()]
			return 0
		}),
		"cuMemAlloc_v2": cb(func(p *uint64, size uintptr) uintptr {
			return inCtx("cuMemAlloc_v2", func(f *fakeGPU, dev int) uintptr {
				if f.allocFail != 0 {
					return uintptr(f.allocFail)
				}
				f.allocs = append(f.allocs, &fakeAlloc{base: f.next, mem: make([]byte, size), dev: dev})
				*p = f.next
				f.next += (uint64(size) + 0xfffff) &^ 0xfffff
				return 0
			})
		}),
		"cuMemFree_v2": cb(func(p uint64) uintptr {
			f := lock()
			defer f.mu.Unlock()
			for i, a := range f.allocs {
				if a.base == p {
					f.needDev("cuMemFree_v2", a.dev)
					f.allocs = append(f.allocs[:i], f.allocs[i+1:]...)
					return 0
				}
			}
			return 1
		}),
		"cuMemHostAlloc": cb(func(pp *unsafe.Pointer, size uintptr, flags uint32) uintptr {
			f := lock()
			defer f.mu.Unlock()
			f.needCtx("cuMemHostAlloc")
			if flags != cuMemHostAllocPortable {
				return 1
			}
			b := make([]byte, size)
			*pp = unsafe.Pointer(&b[0])
			f.host[*pp] = b
			return 0
		}),
		"cuMemFreeHost": cb(func(p unsafe.Pointer) uintptr {
			f := lock()
			defer f.mu.Unlock()
			return forget(f.host, p, 1)
		}),
		"cuMemcpyHtoD_v2": cb(func(dst uint64, src *byte, n uintptr) uintptr { return fake.copyIn(dst, src, n) }),
		"cuMemcpyDtoH_v2": cb(func(dst *byte, src uint64, n uintptr) uintptr { return fake.copyOut(dst, src, n) }),
		"cuMemcpyHtoDAsync_v2": cb(func(dst uint64, src *byte, n uintptr, s uintptr) uintptr {
			if r := fake.injected("cuMemcpyHtoDAsync_v2"); r != 0 {
				return fake.onStream(s, r)
			}
			return fake.onStream(s, fake.copyIn(dst, src, n))
		}),
		"cuMemcpyDtoHAsync_v2": cb(func(dst *byte, src uint64, n uintptr, s uintptr) uintptr {
			return fake.onStream(s, fake.copyOut(dst, src, n))
		}),
		"cuMemsetD8_v2": cb(func(dst uint64, b uint8, n uintptr) uintptr {
			return fake.onDevice("cuMemsetD8_v2", dst, n, func(dev []byte) {
				for i := range dev[:n] {
					dev[i] = b
				}
			})
		}),
		"cuStreamCreate": cb(func(s *uintptr, flags uint32) uintptr {
			return inCtx("cuStreamCreate", func(f *fakeGPU, dev int) uintptr {
				f.streamFlag = flags
				f.nextStrm++
				f.streams[f.nextStrm] = dev
				*s = f.nextStrm
				return 0
			})
		}),
		"cuStreamSynchronize": cb(func(s uintptr) uintptr { return fake.waited(fake.onStream(s, 0)) }),
		"cuStreamDestroy_v2": cb(func(s uintptr) uintptr {
			f := lock()
			defer f.mu.Unlock()
			return forget(f.streams, s, 400)
		}),
		"cuIpcGetMemHandle": cb(func(h *[64]byte, p uint64) uintptr {
			f := lock()
			defer f.mu.Unlock()
			a := f.find(p, 1)
			if a == nil || a.base != p {
				return 1
			}
			f.needDev("cuIpcGetMemHandle", a.dev)
			// Every byte is set so that a shifted or truncated struct shows.
			for i := range h {
				h[i] = byte(0xa0 + i)
			}
			binary.LittleEndian.PutUint32(h[0:], fakeHandleID)
			binary.LittleEndian.PutUint64(h[8:], p)
			return 0
		}),
		"cuIpcOpenMemHandle_v2": cb(func(p *uint64, h ipcMemHandle, flags uint32) uintptr {
			f := lock()
			defer f.mu.Unlock()
			f.needCtx("cuIpcOpenMemHandle_v2")
			f.openHandle, f.openFlags = h, flags
			if binary.LittleEndian.Uint32(h.Reserved[0:]) != fakeHandleID {
				return 1
			}
			f.ipcOpen++
			*p = binary.LittleEndian.Uint64(h.Reserved[8:])
			return 0
		}),
		"cuIpcCloseMemHandle": cb(func(p uint64) uintptr {
			f := lock()
			defer f.mu.Unlock()
			f.needCtx("cuIpcCloseMemHandle")
			f.ipcClose++
			return 0
		}),
		"cuPointerGetAttributes": cb(func(n uint32, kinds *uint32, data *unsafe.Pointer, p uint64) uintptr {
			f := lock()
			defer f.mu.Unlock()
			a := f.find(p, 1)
			ks := unsafe.Slice(kinds, n)
			ds := unsafe.Slice(data, n)
			for i, k := range ks {
				var v uint64
				switch {
				case a == nil && k == cuPointerAttrDeviceOrdinal:
					v = ^uint64(1) // -2, what the driver reports for an unknown pointer
				case a == nil:
				case k == cuPointerAttrMemoryType:
					v = cuMemoryTypeDevice
				case k == cuPointerAttrDeviceOrdinal:
					v = uint64(a.dev)
				case k == cuPointerAttrRangeStart:
					v = a.base
				case k == cuPointerAttrRangeSize:
					v = uint64(len(a.mem))
				default:
					return 1
				}
				if k == cuPointerAttrMemoryType || k == cuPointerAttrDeviceOrdinal {
					*(*uint32)(ds[i]) = uint32(v)
				} else {
					*(*uint64)(ds[i]) = v
				}
			}
			return 0
		}),
		"cuGetErrorName":   errorText(0),
		"cuGetErrorString": errorText(1),
	}
	addFakePieceSyms(fakeSyms)
}

func (f *fakeGPU) copyIn(dst uint64, src *byte, n uintptr) uintptr {
	return f.onDevice("cuMemcpyHtoD", dst, n, func(dev []byte) { copy(dev, bytesAt(src, n)) })
}

func (f *fakeGPU) copyOut(dst *byte, src uint64, n uintptr) uintptr {
	return f.onDevice("cuMemcpyDtoH", src, n, func(dev []byte) { copy(bytesAt(dst, n), dev) })
}

// onDevice runs do, under the lock, on the device bytes from addr to the end
// of their allocation, which must hold [addr, addr+n); the allocation's
// device must be current.
func (f *fakeGPU) onDevice(name string, addr uint64, n uintptr, do func(dev []byte)) uintptr {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.find(addr, uint64(n))
	if a == nil {
		return 1
	}
	f.needDev(name, a.dev)
	do(a.mem[addr-a.base:])
	return 0
}

// forget deletes k from m, or returns missing when m does not hold it.
func forget[K comparable, V any](m map[K]V, k K, missing uintptr) uintptr {
	if _, ok := m[k]; !ok {
		return missing
	}
	delete(m, k)
	return 0
}

// onStream checks the stream's device is current (the legacy stream 0 is
// any device's).
func (f *fakeGPU) onStream(s uintptr, r uintptr) uintptr {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s == 0 {
		f.needCtx("cuStreamSynchronize(0)")
		return r
	}
	dev, ok := f.streams[s]
	if !ok {
		return 400
	}
	f.needDev("stream op", dev)
	return r
}

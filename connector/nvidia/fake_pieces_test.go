package nvidia

import (
	"encoding/binary"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The fake driver's events, module, kernel launch and batched copy. The
// launch decodes the parameter block by the offsets copy_pieces.ptx
// documents, not through the Go struct, so a layout mismatch between the
// two fails here.

const (
	fakeModule   = 0x6000
	fakeFunction = 0x7000
	fakeEvBase   = 0x8000
)

// fakePieces is the fake's record of the piece-moving calls.
type fakePieces struct {
	events   map[uintptr]bool
	nextEv   uintptr
	modules  int
	launches int
	batches  int
	badPTX   bool    // cuModuleLoadData fails, as for a PTX the driver rejects
	failCall string  // a call of this name fails with failCode
	failSkip int     // after this many of them have succeeded,
	failCode uintptr // once (an enqueue error)
	sticky   uintptr // every later wait fails with it: a broken context
	record   bool    // launches record their pieces (decoded) and move nothing
	decoded  []decodedPiece
}

// decodedPiece is one piece of a launch's parameter block, read at the
// offsets copy_pieces.ptx documents.
type decodedPiece struct {
	dev, off, len uint64
}

// injected is the error the named call returns now: failCode once, if it
// is the call to fail.
func (f *fakeGPU) injected(name string) uintptr {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pieces.failCall != name {
		return 0
	}
	if f.pieces.failSkip > 0 {
		f.pieces.failSkip--
		return 0
	}
	f.pieces.failCall = ""
	return f.pieces.failCode
}

// waited is what a stream or event wait returns: the sticky error, if the
// context is broken, or r.
func (f *fakeGPU) waited(r uintptr) uintptr {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pieces.sticky != 0 {
		return f.pieces.sticky
	}
	return r
}

func addFakePieceSyms(syms map[string]uintptr) {
	cb := purego.NewCallback
	syms["cuEventCreate"] = cb(func(ev *uintptr, flags uint32) uintptr {
		f := fake
		f.mu.Lock()
		defer f.mu.Unlock()
		f.needCtx("cuEventCreate")
		if flags != cuEventDisableTiming {
			return 1
		}
		f.pieces.nextEv++
		*ev = fakeEvBase + f.pieces.nextEv
		f.pieces.events[*ev] = true
		return 0
	})
	syms["cuEventRecord"] = cb(func(ev, s uintptr) uintptr { return fake.onEvent(ev, fake.onStream(s, 0)) })
	syms["cuEventSynchronize"] = cb(func(ev uintptr) uintptr { return fake.waited(fake.onEvent(ev, 0)) })
	syms["cuEventDestroy_v2"] = cb(func(ev uintptr) uintptr {
		f := fake
		f.mu.Lock()
		defer f.mu.Unlock()
		return forget(f.pieces.events, ev, 400)
	})
	syms["cuModuleLoadData"] = cb(fakeModuleLoad)
	syms["cuModuleGetFunction"] = cb(func(fn *uintptr, mod uintptr, name *byte) uintptr {
		if mod != fakeModule || cString(name) != kernelName {
			return 500 // CUDA_ERROR_NOT_FOUND
		}
		*fn = fakeFunction
		return 0
	})
	syms["cuModuleUnload"] = cb(func(mod uintptr) uintptr {
		f := fake
		f.mu.Lock()
		defer f.mu.Unlock()
		f.needCtx("cuModuleUnload")
		f.pieces.modules--
		return 0
	})
	syms["cuLaunchKernel"] = cb(fakeLaunch)
	syms["cuMemcpyBatchAsync_v2"] = cb(fakeBatch)
}

func (f *fakeGPU) onEvent(ev uintptr, r uintptr) uintptr {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.pieces.events[ev] {
		return 400
	}
	return r
}

func fakeModuleLoad(mod *uintptr, image *byte) uintptr {
	f := fake
	f.mu.Lock()
	defer f.mu.Unlock()
	f.needCtx("cuModuleLoadData")
	ptx := cString(image)
	if f.pieces.badPTX || !strings.Contains(ptx, ".entry "+kernelName+"(") {
		return 218 // CUDA_ERROR_INVALID_PTX
	}
	f.pieces.modules++
	*mod = fakeModule
	return 0
}

func fakeLaunch(fn uintptr, gx, gy, gz, bx, by, bz, shmem uint32, s uintptr, params *unsafe.Pointer, extra uintptr) uintptr {
	if r := fake.onStream(s, fake.injected("cuLaunchKernel")); r != 0 {
		return r
	}
	// The block is 4072 bytes: 16 of header, then 169 pieces of 24.
	blk := unsafe.Slice((*byte)(*params), 4072)
	le := binary.LittleEndian
	stage, n, gather := le.Uint64(blk), le.Uint32(blk[8:]), le.Uint32(blk[12:])
	if fn != fakeFunction || gx != n || n == 0 || n > 169 || gy != 1 || gz != 1 || bx != kernelThreads || extra != 0 {
		return 1
	}
	ps := make([]decodedPiece, n)
	for i := range ps {
		e := blk[16+24*i:]
		ps[i] = decodedPiece{dev: le.Uint64(e), off: le.Uint64(e[8:]), len: le.Uint64(e[16:])}
	}
	fake.mu.Lock()
	fake.pieces.launches++
	record := fake.pieces.record
	if record {
		fake.pieces.decoded = append(fake.pieces.decoded, ps...)
	}
	fake.mu.Unlock()
	if record {
		return 0
	}
	for _, p := range ps {
		ln := uintptr(p.len)
		src, dst := stage+p.off, p.dev
		if gather == 1 {
			src, dst = dst, src
		}
		buf := make([]byte, ln)
		if fake.copyOut(&buf[0], src, ln) != 0 || fake.copyIn(dst, &buf[0], ln) != 0 {
			return 700 // CUDA_ERROR_ILLEGAL_ADDRESS
		}
	}
	return 0
}

// fakeBatch takes the arrays as pointers: a host entry is one, a device
// entry a fake address outside Go's heap.
func fakeBatch(dsts, srcs *unsafe.Pointer, sizes *uintptr, count uintptr, attrs *memcpyAttributes, idxs *uintptr, nattrs uintptr, s uintptr) uintptr {
	if r := fake.onStream(s, fake.injected("cuMemcpyBatchAsync_v2")); r != 0 {
		return r
	}
	if nattrs != 1 || *idxs != 0 || attrs.srcAccessOrder != cuMemcpySrcAccessOrderStream || count == 0 {
		return 1
	}
	fake.mu.Lock()
	fake.pieces.batches++
	fake.mu.Unlock()
	ds, ss, ns := unsafe.Slice(dsts, count), unsafe.Slice(srcs, count), unsafe.Slice(sizes, count)
	for i := range ds {
		var r uintptr
		switch {
		case attrs.srcType == cuMemLocationTypeHost && attrs.dstType == cuMemLocationTypeDevice:
			r = fake.copyIn(uint64(uintptr(ds[i])), (*byte)(ss[i]), ns[i])
		case attrs.srcType == cuMemLocationTypeDevice && attrs.dstType == cuMemLocationTypeHost:
			r = fake.copyOut((*byte)(ds[i]), uint64(uintptr(ss[i])), ns[i])
		default:
			return 1
		}
		if r != 0 {
			return r
		}
	}
	return 0
}

package nvidia

import (
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
)

// The three ways of moving a scatter or gather (scatter.go picks one). Each
// runs inside Stream.enqueue: the stream's lock is held and its device's
// context is current.

// stageGrain rounds staging buffers up, so that a stream grows its buffer
// once or twice, not at every larger span.
const stageGrain = 1 << 20

// kernelCopy moves the pieces through the stream's staging buffer: for a
// scatter, one copy of host[lo:hi] into it and the kernel out of it; for a
// gather, the kernel into it and one copy of it into host[lo:hi].
func (s *Stream) kernelCopy(host []byte, ps []connector.Piece, lo, hi int64, gather bool) error {
	fn, err := s.c.kernel(s.dev)
	if err != nil {
		return err
	}
	if err := s.growStage(hi - lo); err != nil {
		return err
	}
	d, st := s.c.d, &s.pieces
	if !gather {
		if err := d.call(d.cuMemcpyHtoDAsync, uintptr(st.stage), uintptr(unsafe.Pointer(&host[lo])), uintptr(hi-lo), s.h); err != nil {
			return err
		}
	}
	for i := 0; i < len(ps); i += kernelMaxPieces {
		if err := s.launch(fn, ps[i:min(i+kernelMaxPieces, len(ps))], lo, gather); err != nil {
			return err
		}
	}
	if gather {
		return d.call(d.cuMemcpyDtoHAsync, uintptr(unsafe.Pointer(&host[lo])), uintptr(st.stage), uintptr(hi-lo), s.h)
	}
	return nil
}

// growStage makes the staging buffer at least n bytes. The old one may
// still be read by queued work, so the stream drains first.
func (s *Stream) growStage(n int64) error {
	st, d := &s.pieces, s.c.d
	if st.stageSize >= n {
		return nil
	}
	if st.stage != 0 {
		if err := d.call(d.cuStreamSynchronize, s.h); err != nil {
			return err
		}
		if err := st.free(d); err != nil {
			return err
		}
	}
	size := (n + stageGrain - 1) / stageGrain * stageGrain
	if err := d.call(d.cuMemAlloc, uintptr(unsafe.Pointer(&st.stage)), uintptr(size)); err != nil {
		st.stage = 0
		return err
	}
	st.stageSize = size
	return nil
}

// launch queues one kernel launch for at most kernelMaxPieces pieces;
// the driver copies the parameter block at the call.
func (s *Stream) launch(fn uintptr, ps []connector.Piece, lo int64, gather bool) error {
	st, d := &s.pieces, s.c.d
	a := &st.args
	a.stage, a.n, a.gather = st.stage, uint32(len(ps)), 0
	if gather {
		a.gather = 1
	}
	for i, p := range ps {
		a.p[i] = kernelPiece{dev: p.Dev, off: uint64(p.Off - lo), len: uint64(p.Len)}
	}
	st.params[0] = uintptr(unsafe.Pointer(a))
	return d.call(d.cuLaunchKernel, fn, uintptr(len(ps)), 1, 1, kernelThreads, 1, 1, 0, s.h,
		uintptr(unsafe.Pointer(&st.params[0])), 0)
}

// memcpyAttributes is CUmemcpyAttributes (CUDA 12.8+).
type memcpyAttributes struct {
	srcAccessOrder uint32
	srcType        uint32 // srcLocHint: CUmemLocation{type, id}
	srcID          int32
	dstType        uint32
	dstID          int32
	flags          uint32
}

const (
	cuMemcpySrcAccessOrderStream = 1
	cuMemLocationTypeDevice      = 1
	cuMemLocationTypeHost        = 2
)

// batchCopy moves all pieces with one cuMemcpyBatchAsync call; the driver
// reads the arrays during the call.
func (s *Stream) batchCopy(host []byte, ps []connector.Piece, gather bool) error {
	d, st := s.c.d, &s.pieces
	if d.cuMemcpyBatchAsync.addr == 0 {
		return errs.New(unix.EOPNOTSUPP, "nvidia: the driver has no cuMemcpyBatchAsync (CUDA 12.8+)")
	}
	st.dsts, st.srcs, st.sizes = st.dsts[:0], st.srcs[:0], st.sizes[:0]
	st.attr = memcpyAttributes{srcAccessOrder: cuMemcpySrcAccessOrderStream,
		srcType: cuMemLocationTypeHost, dstType: cuMemLocationTypeDevice, dstID: s.c.cudev[s.dev]}
	if gather {
		st.attr.srcType, st.attr.srcID = cuMemLocationTypeDevice, s.c.cudev[s.dev]
		st.attr.dstType, st.attr.dstID = cuMemLocationTypeHost, 0
	}
	for _, p := range ps {
		h, dv := uintptr(unsafe.Pointer(&host[p.Off])), uintptr(p.Dev)
		if gather {
			h, dv = dv, h
		}
		st.dsts, st.srcs, st.sizes = append(st.dsts, dv), append(st.srcs, h), append(st.sizes, uintptr(p.Len))
	}
	// Every array lives in the stream (the heap), not on a stack that may
	// move while the driver reads it.
	st.attrIdx = 0
	args := []uintptr{uintptr(unsafe.Pointer(&st.dsts[0])), uintptr(unsafe.Pointer(&st.srcs[0])),
		uintptr(unsafe.Pointer(&st.sizes[0])), uintptr(len(ps)), uintptr(unsafe.Pointer(&st.attr)),
		uintptr(unsafe.Pointer(&st.attrIdx)), 1}
	if d.cuMemcpyBatchAsync.name != "cuMemcpyBatchAsync_v2" {
		// CUDA 12.8 and 12.9 take one more argument: where a failure was.
		args = append(args, uintptr(unsafe.Pointer(&st.failIdx)))
	}
	return d.call(d.cuMemcpyBatchAsync, append(args, s.h)...)
}

// eachCopy queues one async copy per piece.
func (s *Stream) eachCopy(host []byte, ps []connector.Piece, gather bool) error {
	d := s.c.d
	for _, p := range ps {
		h := uintptr(unsafe.Pointer(&host[p.Off]))
		var err error
		if gather {
			err = d.call(d.cuMemcpyDtoHAsync, h, uintptr(p.Dev), uintptr(p.Len), s.h)
		} else {
			err = d.call(d.cuMemcpyHtoDAsync, uintptr(p.Dev), h, uintptr(p.Len), s.h)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

package nvidia

import (
	_ "embed"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
)

// A scatter (or gather) moves many pieces between one host buffer and
// scattered device addresses: KV-cache blocks landing in their slots. One
// async copy per piece costs a driver call and a DMA set-up each, which
// small blocks cannot amortise. Two ways do better, and EnvScatter picks:
//
//   - kernel: one copy of the buffer's span into a device staging buffer,
//     then the phx_copy_pieces kernel (kernels/copy_pieces.ptx) moves every
//     piece to its address on the GPU;
//   - batch: one cuMemcpyBatchAsync call (CUDA 12.8+) for all the pieces.
//
// auto uses one plain copy for one piece, batch for large pieces (where
// the copy engine beats a second pass through device memory), and the
// kernel for small ones.

// EnvScatter names the variable that chooses how scatters and gathers move:
// auto (or unset), kernel, batch or copies (one async copy per piece).
const EnvScatter = "PHX_SCATTER"

// pieceMethod is one way of moving a scatter or gather.
type pieceMethod int

const (
	methodCopies pieceMethod = iota
	methodBatch
	methodKernel
	methodCount
)

var methodNames = [methodCount]string{"copies", "batch", "kernel"}

// autoStageMax is the widest span auto moves through the kernel: the
// staging buffer is as large as the span, and a few small pieces far
// apart are not worth that much device memory.
const autoStageMax = 1 << 32

// batchMinPiece is auto's threshold: pieces of at least this average size
// go as one batched copy, smaller ones through the kernel (kv_blocks.cu's
// crossover on an H200).
const batchMinPiece = 256 << 10

// ParseScatterMode checks a PHX_SCATTER value: "" or auto, kernel, batch or
// copies.
func ParseScatterMode(v string) (string, error) {
	switch v {
	case "", "auto":
		return "auto", nil
	case "kernel", "batch", "copies":
		return v, nil
	}
	return "", errs.New(unix.EINVAL, "nvidia: %s=%q: want auto, kernel, batch or copies", EnvScatter, v)
}

// CheckEnv checks the connector's tuning variables (PHX_CUDA_SYNC,
// PHX_SCATTER) as Open will, so a bad value stops a mount before it starts.
func CheckEnv() error {
	if _, err := ParseSyncMode(os.Getenv(EnvSync)); err != nil {
		return err
	}
	_, err := ParseScatterMode(os.Getenv(EnvScatter))
	return err
}

//go:embed kernels/copy_pieces.ptx
var copyPiecesPTX string

const (
	kernelName      = "phx_copy_pieces"
	kernelMaxPieces = 169 // the parameter block stays under 4 KiB
	kernelThreads   = 256
)

// kernelPiece and kernelArgs are the kernel's parameter block; the layout
// is documented in copy_pieces.ptx. Offsets and lengths are 64-bit, so
// that a span of 4 GiB or more is not truncated.
type kernelPiece struct {
	dev uint64
	off uint64
	len uint64
}

type kernelArgs struct {
	stage  uint64
	n      uint32
	gather uint32
	p      [kernelMaxPieces]kernelPiece
}

// kernelState is the copy kernel in one device's context.
type kernelState struct {
	mod, fn uintptr
	err     error // why the kernel is not there
}

// pieceState is one stream's scatter and gather state.
type pieceState struct {
	stage     uint64 // device staging buffer of the kernel method
	stageSize int64
	args      kernelArgs
	params    [1]uintptr // cuLaunchKernel's kernelParams: &args
	dsts      []uintptr  // the batch method's arguments
	srcs      []uintptr
	sizes     []uintptr
	attr      memcpyAttributes
	attrIdx   uintptr
	failIdx   uintptr
}

// free releases the staging buffer; the stream's context is current.
func (ps *pieceState) free(d *driver) error {
	if ps.stage == 0 {
		return nil
	}
	err := d.call(d.cuMemFree, uintptr(ps.stage))
	ps.stage, ps.stageSize = 0, 0
	return err
}

// loadKernel loads the copy kernel into dev's context ctx, just retained;
// a failure is kept (auto then uses the batch or copies method, and
// ScatterReport says why). Caller holds mu.
func (c *Connector) loadKernel(dev int, ctx uintptr) {
	k := &c.kern[dev]
	if m := c.scatterMode(); m != "auto" && m != "kernel" {
		k.err = errs.New(unix.EOPNOTSUPP, "%s=%s", EnvScatter, m)
		return
	}
	k.err = c.inContext(ctx, func() error {
		image := append([]byte(copyPiecesPTX), 0)
		if err := c.d.call(c.d.cuModuleLoadData, uintptr(unsafe.Pointer(&k.mod)), uintptr(unsafe.Pointer(&image[0]))); err != nil {
			return err
		}
		name := append([]byte(kernelName), 0)
		if err := c.d.call(c.d.cuModuleGetFunction, uintptr(unsafe.Pointer(&k.fn)), k.mod, uintptr(unsafe.Pointer(&name[0]))); err != nil {
			c.d.call(c.d.cuModuleUnload, k.mod)
			k.mod = 0
			return err
		}
		return nil
	})
}

// unloadKernel unloads dev's copy kernel before its context goes.
func (c *Connector) unloadKernel(dev int, ctx uintptr) error {
	k := &c.kern[dev]
	if k.mod == 0 {
		return nil
	}
	mod := k.mod
	*k = kernelState{err: errs.New(unix.EBADF, "nvidia: connector closed")}
	return c.inContext(ctx, func() error { return c.d.call(c.d.cuModuleUnload, mod) })
}

// kernel returns the copy kernel of dev, whose context exists.
func (c *Connector) kernel(dev int) (uintptr, error) {
	k := &c.kern[dev]
	if k.fn == 0 {
		return 0, errs.Wrapf(k.err, "nvidia: no %s kernel on device %d", kernelName, dev)
	}
	return k.fn, nil
}

// method picks how to move ps, span bytes from the first piece's start
// to the last one's end.
func (c *Connector) method(dev int, ps []connector.Piece, span int64) pieceMethod {
	switch c.scatterMode() {
	case "kernel":
		return methodKernel
	case "batch":
		return methodBatch
	case "copies":
		return methodCopies
	}
	if len(ps) == 1 {
		return methodCopies
	}
	var total int64
	for _, p := range ps {
		total += p.Len
	}
	hasBatch := c.d.cuMemcpyBatchAsync.addr != 0
	small := total/int64(len(ps)) < batchMinPiece
	switch {
	case small && c.kern[dev].fn != 0 && span <= autoStageMax:
		return methodKernel
	case hasBatch:
		return methodBatch
	}
	return methodCopies
}

// ScatterReport says how scatters and gathers move on each device whose
// context exists, and how many went each way.
func (c *Connector) ScatterReport() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s=%s, cuMemcpyBatchAsync %s", EnvScatter, c.scatterMode(), map[bool]string{true: "available", false: "absent"}[c.d.cuMemcpyBatchAsync.addr != 0])
	for dev := range c.kern {
		if c.ctx[dev].Load() == 0 {
			continue
		}
		if c.kern[dev].fn != 0 {
			fmt.Fprintf(&b, "; device %d: kernel loaded", dev)
		} else {
			fmt.Fprintf(&b, "; device %d: no kernel (%v)", dev, c.kern[dev].err)
		}
	}
	for m, n := range methodNames {
		fmt.Fprintf(&b, "; %s %d", n, c.pieceOps[m].Load())
	}
	return b.String()
}

// PieceOps is how many scatters and gathers have moved each way since
// Open: one copy each, one batched copy, or the kernel.
func (c *Connector) PieceOps() (copies, batch, kernel int64) {
	return c.pieceOps[methodCopies].Load(), c.pieceOps[methodBatch].Load(), c.pieceOps[methodKernel].Load()
}

// span checks every piece against the host buffer and returns where the
// first starts and the last ends.
func span(host []byte, ps []connector.Piece) (lo, hi int64, err error) {
	lo = int64(len(host))
	for _, p := range ps {
		if p.Off < 0 || p.Len <= 0 || p.Off > int64(len(host))-p.Len {
			return 0, 0, errs.New(unix.EINVAL, "nvidia: piece of %d bytes at %d outside a %d-byte host buffer", p.Len, p.Off, len(host))
		}
		lo, hi = min(lo, p.Off), max(hi, p.Off+p.Len)
	}
	return lo, hi, nil
}

// ScatterToDevice queues the copy of every piece of src to its device
// address (see EnvScatter for how).
func (s *Stream) ScatterToDevice(src []byte, ps []connector.Piece) error {
	return s.movePieces(src, ps, false)
}

// GatherFromDevice queues the copy of every piece's device bytes into dst.
// Bytes of dst between the pieces, inside their span, may be overwritten.
func (s *Stream) GatherFromDevice(dst []byte, ps []connector.Piece) error {
	return s.movePieces(dst, ps, true)
}

func (s *Stream) movePieces(host []byte, ps []connector.Piece, gather bool) error {
	lo, hi, err := span(host, ps)
	if err != nil || len(ps) == 0 {
		return err
	}
	m := s.c.method(s.dev, ps, hi-lo)
	s.c.pieceOps[m].Add(1)
	return s.enqueue(host, func() error {
		switch m {
		case methodKernel:
			return s.kernelCopy(host, ps, lo, hi, gather)
		case methodBatch:
			return s.batchCopy(host, ps, gather)
		}
		return s.eachCopy(host, ps, gather)
	})
}

// SetScatter changes how later scatters and gathers move (a PHX_SCATTER
// value): benchmarks compare the methods in one process. The kernel is
// loaded with each device's context, so kernel mode needs a connector
// opened in auto or kernel mode.
func (c *Connector) SetScatter(mode string) error {
	m, err := ParseScatterMode(mode)
	if err != nil {
		return err
	}
	if m == "batch" && c.d.cuMemcpyBatchAsync.addr == 0 {
		return errs.New(unix.EOPNOTSUPP, "nvidia: no cuMemcpyBatchAsync in the driver (CUDA 12.8+)")
	}
	c.scatter.Store(m)
	return nil
}

// scatterMode is the PHX_SCATTER mode in force.
func (c *Connector) scatterMode() string { return c.scatter.Load().(string) }

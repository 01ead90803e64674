package client

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/pciaddr"
)

// File is an open file on a phxmount mount. Every command can be sent on
// any file of the mount; READ and WRITE move bytes of this file.
type File struct {
	fd   int
	path string
	own  bool
	mu   sync.Mutex
	shut bool
}

// Open opens path (a file or directory on a phxmount mount) read-only.
func Open(path string) (*File, error) { return OpenFile(path, unix.O_RDONLY) }

// OpenFile opens path with the given flags (O_RDONLY, O_WRONLY, O_RDWR,
// O_DIRECT, ...); O_CLOEXEC is always added.
func OpenFile(path string, flags int) (*File, error) {
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return &File{fd: fd, path: path, own: true}, nil
}

// NewFile wraps a descriptor the caller keeps ownership of: Close does not
// close it.
func NewFile(fd int, name string) *File { return &File{fd: fd, path: name} }

// Fd returns the descriptor.
func (f *File) Fd() int { return f.fd }

// Name returns the path the file was opened with.
func (f *File) Name() string { return f.path }

// Close closes the file. Buffers registered through it are released by the
// daemon (the file they were registered on is gone).
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.shut {
		return nil
	}
	f.shut = true
	if !f.own {
		return nil
	}
	return unix.Close(f.fd)
}

// Error is an ioctl that failed; it unwraps to its unix.Errno.
type Error struct {
	Op    string
	Path  string
	Errno unix.Errno
}

func (e *Error) Error() string { return fmt.Sprintf("phx %s %s: %v", e.Op, e.Path, e.Errno) }

// Unwrap returns the errno.
func (e *Error) Unwrap() error { return e.Errno }

func (f *File) ioctl(op string, cmd uint32, b []byte) error {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	for {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(f.fd), uintptr(cmd), uintptr(p))
		switch e {
		case 0:
			return nil
		case unix.EINTR:
			continue
		}
		return &Error{Op: op, Path: f.path, Errno: e}
	}
}

// Ioctl sends a raw command with its payload (len(payload) must be the
// command's size); the reply overwrites payload. For tests and tools.
func (f *File) Ioctl(cmd uint32, payload []byte) error { return f.ioctl("ioctl", cmd, payload) }

// Buffer is a registered device buffer.
type Buffer struct {
	ID        uint64
	Token     Token
	Transport Transport
	Device    int
	Size      int64
}

// Register registers size bytes of device memory that this process exported
// as handle (an emu handle or a CUDA IPC handle) on device dev. The buffer
// belongs to this process and dies with it, with Deregister, or when this
// file is closed.
func (f *File) Register(vendor Vendor, dev int, handle [HandleSize]byte, size int64) (Buffer, error) {
	if dev < 0 || size <= 0 {
		return Buffer{}, &Error{Op: "register", Path: f.path, Errno: unix.EINVAL}
	}
	req := RegisterReq{Vendor: vendor, Device: uint32(dev), Size: uint64(size), Handle: handle}
	b := EncodeRegister(req)
	if err := f.ioctl("register", CmdRegister, b); err != nil {
		return Buffer{}, err
	}
	resp, err := DecodeRegisterResp(b)
	if err != nil {
		return Buffer{}, err
	}
	return Buffer{ID: resp.ID, Token: resp.Token, Transport: resp.Transport, Device: dev, Size: size}, nil
}

// Deregister releases a buffer; the daemon waits for I/O in flight on it.
func (f *File) Deregister(b Buffer) error { return f.DeregisterID(b.ID) }

// DeregisterID releases a buffer by id.
func (f *File) DeregisterID(id uint64) error {
	return f.ioctl("deregister", CmdDeregister, EncodeDeregister(id))
}

func (f *File) single(write bool, id uint64, bufOff, n, fileOff int64) (int64, error) {
	op, cmd := "read", CmdRead
	if write {
		op, cmd = "write", CmdWrite
	}
	if bufOff < 0 || n < 0 || fileOff < 0 {
		return 0, &Error{Op: op, Path: f.path, Errno: unix.EINVAL}
	}
	b := EncodeIO(IOReq{ID: id, BufOffset: uint64(bufOff), Length: uint64(n), FileOffset: uint64(fileOff)})
	if err := f.ioctl(op, cmd, b); err != nil {
		return 0, err
	}
	return DecodeIOResp(b)
}

// Read reads up to n bytes of the file at fileOff into the buffer at bufOff
// and returns the bytes read (fewer only at end of file).
func (f *File) Read(buf Buffer, bufOff, n, fileOff int64) (int64, error) {
	return f.single(false, buf.ID, bufOff, n, fileOff)
}

// Write writes n bytes from the buffer at bufOff to the file at fileOff.
func (f *File) Write(buf Buffer, bufOff, n, fileOff int64) (int64, error) {
	return f.single(true, buf.ID, bufOff, n, fileOff)
}

// Extent is one transfer of a batch. Result is filled in: the bytes moved,
// or a negative errno. Count, FileStride and BufStride are a strided
// extent's (ReadStrided, WriteStrided): Count pieces of Len bytes, piece j
// at FileOffset + j*FileStride and BufOffset + j*BufStride; leave them zero
// for a plain batch.
type Extent struct {
	Buffer     uint64 // buffer id
	BufOffset  int64
	Len        int64
	FileOffset int64
	Count      int64
	FileStride int64
	BufStride  int64
	Result     int64
}

// want is the bytes the extent moves when nothing falls short.
func (e Extent) want() int64 { return e.Len * max(e.Count, 1) }

// Err returns the extent's error: nil when it moved exactly its bytes (Len
// a piece), its errno when it failed, ErrShort when it stopped at end of
// file.
func (e Extent) Err() error {
	switch {
	case e.Result < 0:
		return unix.Errno(-e.Result)
	case e.Result != e.want():
		return ErrShort
	}
	return nil
}

// ErrShort is an extent that moved fewer bytes than asked (end of file).
var ErrShort = fmt.Errorf("phx: short transfer (end of file)")

// ReadBatch reads every extent, sending as many ioctls as the batch needs
// (at most MaxExtents extents each; the smallest of BatchClasses that
// holds them). It fills every Result and returns the number of extents that
// did not move exactly Len bytes; an error only when an ioctl failed as a
// whole (then the extents it carried have Result -errno).
func (f *File) ReadBatch(ext []Extent) (int, error) { return f.batch(plainBatch, false, ext) }

// WriteBatch is ReadBatch for writes.
func (f *File) WriteBatch(ext []Extent) (int, error) { return f.batch(plainBatch, true, ext) }

// ReadStrided is ReadBatch for strided extents (BATCH_READ_STRIDED, at
// most MaxStridedExtents extents and MaxPieces pieces an ioctl; an extent
// of more pieces is sent as several, and its Result sums theirs as one
// extent's would): one extent moves a column slice of every row. A Count
// of 0 is taken as 1.
func (f *File) ReadStrided(ext []Extent) (int, error) { return f.batch(stridedBatch, false, ext) }

// WriteStrided is ReadStrided for writes.
func (f *File) WriteStrided(ext []Extent) (int, error) { return f.batch(stridedBatch, true, ext) }

// classFor picks the capacity of the ioctl that carries n (<= 400) extents
// of layout l: the smallest class that holds them, within l's maximum.
func classFor(l batchLayout, n int) int {
	for _, c := range BatchClasses {
		if n <= c {
			return min(c, l.max)
		}
	}
	return min(BatchClasses[len(BatchClasses)-1], l.max)
}

// part is an extent as an ioctl carries it: the caller's extent of, or,
// for a strided extent of more than MaxPieces pieces, a run of its pieces.
type part struct {
	of  int
	req IOReq
	bad bool // a negative field: the ioctl carrying it is EINVAL
}

// partsOf cuts the caller's extents into the parts ioctls carry.
func partsOf(strided bool, ext []Extent) []part {
	parts := make([]part, 0, len(ext))
	for i, e := range ext {
		bad := e.BufOffset < 0 || e.Len < 0 || e.FileOffset < 0 || e.Count < 0 || e.FileStride < 0 || e.BufStride < 0
		r := IOReq{ID: e.Buffer, BufOffset: uint64(e.BufOffset), Length: uint64(e.Len), FileOffset: uint64(e.FileOffset)}
		if !strided {
			parts = append(parts, part{i, r, bad})
			continue
		}
		r.Count, r.FileStride, r.BufStride = uint64(max(e.Count, 1)), uint64(e.FileStride), uint64(e.BufStride)
		for j := uint64(0); j < r.Count; j += MaxPieces {
			p := r
			p.Count = min(MaxPieces, r.Count-j)
			p.FileOffset += j * r.FileStride
			p.BufOffset += j * r.BufStride
			parts = append(parts, part{i, p, bad})
		}
	}
	return parts
}

// nextGroup is how many parts from parts[0] one ioctl carries: up to the
// largest capacity, and, strided, up to MaxPieces pieces.
func nextGroup(l batchLayout, parts []part) int {
	maxc := classFor(l, l.max)
	var pieces uint64
	n := 0
	for n < len(parts) && n < maxc {
		p := parts[n].req.Pieces()
		if l.extent == StridedExtentSize && n > 0 && pieces+p > MaxPieces {
			break
		}
		pieces += p
		n++
	}
	return n
}

func (f *File) batch(l batchLayout, write bool, ext []Extent) (int, error) {
	op := l.what + " read"
	if write {
		op = l.what + " write"
	}
	parts := partsOf(l.extent == StridedExtentSize, ext)
	results := make([]int64, len(parts))
	var first error
	for start := 0; start < len(parts); {
		n := nextGroup(l, parts[start:])
		group, res := parts[start:start+n], results[start:start+n]
		if err := f.sendGroup(l, write, op, group, res); err != nil {
			if first == nil {
				first = err
			}
			en := int64(unix.EIO)
			if e, ok := err.(*Error); ok {
				en = int64(e.Errno)
			}
			for i := range res {
				res[i] = -en
			}
		}
		start += n
	}
	return foldParts(ext, parts, results), first
}

// sendGroup sends one ioctl of parts and fills res with their results.
func (f *File) sendGroup(l batchLayout, write bool, op string, group []part, res []int64) error {
	reqs := make([]IOReq, len(group))
	for i, p := range group {
		if p.bad {
			return &Error{Op: op, Path: f.path, Errno: unix.EINVAL}
		}
		reqs[i] = p.req
	}
	capacity := classFor(l, len(reqs))
	b, err := l.encode(capacity, reqs)
	if err == nil {
		err = f.ioctl(op, l.cmd(write, capacity), b)
	}
	if err == nil {
		_, err = l.decodeResp(b, res)
	}
	return err
}

// foldParts sets each extent's Result from its parts', in order, as the
// daemon folds pieces: their bytes up to the first that fell short, or the
// errno of a first part that failed. It returns the extents that did not
// move exactly their bytes.
func foldParts(ext []Extent, parts []part, results []int64) int {
	stopped := make([]bool, len(ext))
	for i := range ext {
		ext[i].Result = 0
	}
	for k, p := range parts {
		e, r := &ext[p.of], results[k]
		switch {
		case stopped[p.of]:
		case r < 0:
			if e.Result == 0 {
				e.Result = r
			}
			stopped[p.of] = true
		default:
			e.Result += r
			stopped[p.of] = uint64(r) != p.req.Bytes()
		}
	}
	failed := 0
	for i := range ext {
		if ext[i].Result != ext[i].want() {
			failed++
		}
	}
	return failed
}

// Info asks the daemon what a GPU-direct read through this file would do on
// device 0, and for its counters.
func (f *File) Info() (Info, error) { return f.InfoDevice(0) }

// InfoDevice is Info for device dev.
func (f *File) InfoDevice(dev int) (Info, error) {
	b := EncodeInfoReq(int32(dev))
	if err := f.ioctl("info", CmdInfo, b); err != nil {
		return Info{}, err
	}
	return DecodeInfo(b)
}

// DeviceByPCI returns the index, in this mount, of the device at PCI
// address pci. A client's device ordinal is its own (CUDA_VISIBLE_DEVICES
// renumbers GPUs, and the daemon may see others), while the PCI address is
// the machine's: a client registering a GPU buffer finds the mount's index
// of its GPU here. ENODEV when no device of the mount is at pci.
func (f *File) DeviceByPCI(pci string) (int, error) {
	want := pciaddr.Normalize(pci)
	in, err := f.InfoDevice(0)
	for dev := 0; err == nil && dev < int(in.Devices); dev++ {
		if dev > 0 {
			if in, err = f.InfoDevice(dev); err != nil {
				break
			}
		}
		if pciaddr.Normalize(in.PCIAddress) == want {
			return dev, nil
		}
	}
	if err != nil {
		return -1, err
	}
	return -1, &Error{Op: "device at " + want, Path: f.path, Errno: unix.ENODEV}
}

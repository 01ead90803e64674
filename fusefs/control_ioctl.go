package fusefs

import (
	"context"
	"errors"
	"runtime/trace"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/phxfs"
)

// The ioctls: decode and check (serve, checkMode), then the extents
// (move: a write is made the caller's write(2), control_write.go), their
// buffers (holdExtents) and the library's batch path (transfer).

// Ioctl implements Control.
func (s *ControlServer) Ioctl(ctx context.Context, c Caller, f *OpenFile, cmd uint32, in, out []byte) (int32, syscall.Errno) {
	ours, err := client.Known(cmd)
	if !ours {
		return 0, unix.ENOTTY
	}
	s.stats.calls.Add(1)
	e := unix.Errno(0)
	if err == nil {
		start := time.Now()
		e = s.serve(ctx, c, f, cmd, in, out)
		if name, ok := dataCommands[client.ParseCmd(cmd).Nr]; ok && s.cfg.ObserveIoctl != nil {
			s.cfg.ObserveIoctl(name, time.Since(start))
		}
	} else {
		e = unix.EINVAL
	}
	if e != 0 {
		s.stats.rejected.Add(1)
		if s.log.Logger.IsLevelEnabled(logrus.DebugLevel) {
			s.log.WithFields(logrus.Fields{"cmd": client.ParseCmd(cmd).String(), "pid": c.Tgid, "file": f.Name}).Debugf("ioctl refused: %v", e)
		}
	}
	return 0, e
}

// dataCommands are the ioctls that move bytes, by number, with the names
// ObserveIoctl gets.
var dataCommands = map[uint32]string{
	client.NrRead: "read", client.NrWrite: "write", client.NrBatchRead: "batch_read", client.NrBatchWrite: "batch_write",
	client.NrBatchReadStrided: "batch_read_strided", client.NrBatchWriteStrided: "batch_write_strided",
}

// request is one decoded ioctl: who sent it, on what, and its payloads;
// ctx ends when the kernel interrupts it.
type request struct {
	ctx     context.Context
	c       Caller
	f       *OpenFile
	nr      uint32
	in, out []byte
}

// handlers serve the commands, by number: decode, act, encode.
var handlers = map[uint32]func(s *ControlServer, r request) unix.Errno{
	client.NrRegister:   (*ControlServer).serveRegister,
	client.NrDeregister: (*ControlServer).serveDeregister,
	client.NrRead:       (*ControlServer).serveSingle,
	client.NrWrite:      (*ControlServer).serveSingle,
	client.NrBatchRead:  (*ControlServer).serveBatch,
	client.NrBatchWrite: (*ControlServer).serveBatch,
	client.NrInfo:       (*ControlServer).serveInfo,

	client.NrBatchReadStrided:  (*ControlServer).serveStridedBatch,
	client.NrBatchWriteStrided: (*ControlServer).serveStridedBatch,
}

func (s *ControlServer) serve(ctx context.Context, c Caller, f *OpenFile, cmd uint32, in, out []byte) unix.Errno {
	pc := client.ParseCmd(cmd)
	h := handlers[pc.Nr]
	switch {
	case h == nil:
		return unix.ENOTTY
	case len(in) != pc.Size:
		return unix.EINVAL
	case pc.Nr != client.NrDeregister && len(out) != len(in):
		return unix.EINVAL
	}
	// A region of the daemon's runtime trace (PHXMOUNT_TRACE): each
	// ioctl's service, around the library's own steps inside it.
	var e unix.Errno
	trace.WithRegion(ctx, "fusefs.ioctl", func() { e = h(s, request{ctx, c, f, pc.Nr, in, out}) })
	return e
}

func (s *ControlServer) serveRegister(r request) unix.Errno {
	req, err := client.DecodeRegister(r.in)
	if err != nil {
		return unix.EINVAL
	}
	resp, e := s.register(r.c, r.f, req)
	if e == 0 {
		client.EncodeRegisterResp(r.out, req, resp)
	}
	return e
}

func (s *ControlServer) serveDeregister(r request) unix.Errno {
	id, err := client.DecodeDeregister(r.in)
	if err != nil {
		return unix.EINVAL
	}
	return s.deregister(r.c, id)
}

// serveSingle is READ and WRITE: one extent, its result or its errno.
func (s *ControlServer) serveSingle(r request) unix.Errno {
	write := r.nr == client.NrWrite
	req, err := client.DecodeIO(r.in)
	if err != nil {
		return unix.EINVAL
	}
	if e := s.checkMode(r.f, write); e != 0 {
		return e
	}
	res := s.move(r.c, r.f, write, []client.IOReq{req}, make([]unix.Errno, 1))
	if res[0] < 0 {
		return unix.Errno(-res[0])
	}
	client.EncodeIOResp(r.out, req, res[0])
	return 0
}

// serveBatch is BATCH_READ and BATCH_WRITE: a result per extent.
func (s *ControlServer) serveBatch(r request) unix.Errno {
	_, write := client.IsBatch(r.nr)
	reqs, bad, err := client.DecodeBatch(r.in)
	if err != nil {
		return unix.EINVAL
	}
	if e := s.checkMode(r.f, write); e != 0 {
		return e
	}
	release, e := s.admit(r, reqs)
	if e != 0 {
		return e
	}
	defer release()
	client.EncodeBatchResp(r.out, r.in, s.move(r.c, r.f, write, reqs, refusals(bad)))
	return 0
}

// serveStridedBatch is BATCH_READ_STRIDED and BATCH_WRITE_STRIDED: a
// result per strided extent. Reads go to the library as they are (one
// request of many pieces); a write is the caller's write(2) of each piece
// (the file size limit and set-ID clearing apply piece by piece), and its
// result sums them. The decoder has bounded the pieces (client.MaxPieces,
// E2BIG), and a write's extents are checked against their buffers before
// any piece of them is made.
func (s *ControlServer) serveStridedBatch(r request) unix.Errno {
	_, write := client.IsBatch(r.nr)
	reqs, bad, err := client.DecodeStridedBatch(r.in)
	if err != nil {
		return decodeErrno(err)
	}
	if e := s.checkMode(r.f, write); e != 0 {
		return e
	}
	release, e := s.admit(r, reqs)
	if e != 0 {
		return e
	}
	defer release()
	refuse := refusals(bad)
	var res []int64
	if write {
		s.refuseUnserved(r.c, true, reqs, refuse)
		pieces, pieceRefuse, of := expandPieces(reqs, refuse)
		res = s.counted(reqs, foldPieces(len(reqs), of, pieces, s.moveExtents(r.c, r.f, true, pieces, pieceRefuse)))
	} else {
		res = s.move(r.c, r.f, false, reqs, refuse)
	}
	client.EncodeStridedBatchResp(r.out, r.in, res)
	return 0
}

// admit waits until the batch's pieces may be served beside the others
// (control_gate.go) and returns what gives them back. A plain extent is
// one piece; the decoder has bounded a strided batch's (client.MaxPieces).
func (s *ControlServer) admit(r request, reqs []client.IOReq) (func(), unix.Errno) {
	var pieces uint64
	for _, q := range reqs {
		pieces += q.Pieces()
	}
	return s.pieces.enter(r.ctx, r.c.UID, int64(pieces))
}

// One strided ioctl is one library batch: the ABI's bound on its pieces
// must fit the library's.
var _ [phxfs.MaxBatchPieces - client.MaxPieces]struct{}

// decodeErrno is the errno of a decoder's error: the one it wraps (E2BIG
// for too many pieces), EINVAL for any other malformed struct.
func decodeErrno(err error) unix.Errno {
	if errors.Is(err, unix.E2BIG) {
		return unix.E2BIG
	}
	return unix.EINVAL
}

// refusals turns the decoder's per-extent errors into errnos (EINVAL).
func refusals(bad []error) []unix.Errno {
	refuse := make([]unix.Errno, len(bad))
	for i := range bad {
		if bad[i] != nil {
			refuse[i] = unix.EINVAL
		}
	}
	return refuse
}

// refuseUnserved refuses (in refuse) the extents their buffers cannot
// serve, as holdExtents would, without holding anything: what is refused
// here costs nothing more.
func (s *ControlServer) refuseUnserved(c Caller, write bool, reqs []client.IOReq, refuse []unix.Errno) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range reqs {
		if refuse[i] == 0 {
			_, refuse[i] = s.bufferFor(c, write, r)
		}
	}
}

// expandPieces makes every piece of the strided extents a plain extent;
// of gives each piece's extent. A refused extent stays one refused piece.
func expandPieces(reqs []client.IOReq, refuse []unix.Errno) (pieces []client.IOReq, pieceRefuse []unix.Errno, of []int) {
	n := 0
	for i, r := range reqs {
		if refuse[i] != 0 {
			n++
		} else {
			n += int(r.Pieces()) // at most client.MaxPieces in all
		}
	}
	pieces, pieceRefuse, of = make([]client.IOReq, 0, n), make([]unix.Errno, 0, n), make([]int, 0, n)
	for i, r := range reqs {
		k := r.Pieces()
		if refuse[i] != 0 {
			k = 1
		}
		for j := uint64(0); j < k; j++ {
			pieces = append(pieces, client.IOReq{ID: r.ID, BufOffset: r.BufOffset + j*r.BufStride,
				Length: r.Length, FileOffset: r.FileOffset + j*r.FileStride})
			pieceRefuse = append(pieceRefuse, refuse[i])
			of = append(of, i)
		}
	}
	return pieces, pieceRefuse, of
}

// foldPieces is each extent's result from its pieces', in order: their
// bytes up to the first that fell short, or the errno of a first piece
// that failed, as one strided read reports.
func foldPieces(n int, of []int, pieces []client.IOReq, res []int64) []int64 {
	out := make([]int64, n)
	stopped := make([]bool, n)
	for k, r := range res {
		i := of[k]
		switch {
		case stopped[i]:
		case r < 0:
			if out[i] == 0 {
				out[i] = r
			}
			stopped[i] = true
		default:
			out[i] += r
			stopped[i] = uint64(r) < pieces[k].Length
		}
	}
	return out
}

func (s *ControlServer) serveInfo(r request) unix.Errno {
	dev, err := client.DecodeInfoReq(r.in)
	if err != nil {
		return unix.EINVAL
	}
	info, e := s.info(int(dev), r.f.Fd, r.f.Cache)
	if e == 0 {
		client.EncodeInfo(r.out, info)
	}
	return e
}

// checkMode refuses, before any I/O, what the open mode forbids.
func (s *ControlServer) checkMode(f *OpenFile, write bool) unix.Errno {
	acc := f.Flags & unix.O_ACCMODE
	switch {
	case f.Flags&unix.O_DIRECTORY != 0:
		return unix.EISDIR
	case write && s.cfg.ReadOnly:
		return unix.EROFS
	case write && acc == unix.O_RDONLY:
		return unix.EBADF
	case write && f.Flags&unix.O_APPEND != 0:
		return unix.EINVAL
	case !write && acc == unix.O_WRONLY:
		return unix.EBADF
	}
	return 0
}

// move serves the extents of one READ, WRITE or batch; refuse holds the
// extents already refused (their errno). A write is made to look like the
// caller's write(2) (control_write.go). Results: bytes or -errno.
func (s *ControlServer) move(c Caller, f *OpenFile, write bool, reqs []client.IOReq, refuse []unix.Errno) []int64 {
	return s.counted(reqs, s.moveExtents(c, f, write, reqs, refuse))
}

// counted adds the extents and those that did not move all their bytes to
// the counters, and returns res.
func (s *ControlServer) counted(reqs []client.IOReq, res []int64) []int64 {
	var failed uint64
	for i := range res {
		if res[i] < 0 || uint64(res[i]) != reqs[i].Bytes() {
			failed++
		}
	}
	s.stats.extents.Add(uint64(len(reqs)))
	s.stats.failedExtents.Add(failed)
	return res
}

func (s *ControlServer) moveExtents(c Caller, f *OpenFile, write bool, reqs []client.IOReq, refuse []unix.Errno) []int64 {
	if !write {
		return s.transfer(c, f, false, reqs, refuse)
	}
	// The file size limit cuts a copy of the extents: the reply and the
	// counters judge the results against the lengths asked for.
	reqs = append([]client.IOReq(nil), reqs...)
	if limitWrite(c, reqs, refuse) {
		signalFileSize(c)
	}
	if e := removePrivs(c, f.Fd); e != 0 {
		res := make([]int64, len(reqs))
		for i := range res {
			res[i] = -int64(e)
		}
		return res
	}
	res := s.transfer(c, f, true, reqs, refuse)
	if lo, hi := writtenSpan(reqs, res); hi > lo && f.Changed != nil {
		f.Changed(int64(lo), int64(hi-lo))
	}
	return res
}

// transfer checks every extent against its registration and the caller,
// then moves the bytes of those that pass. Results: bytes or -errno.
func (s *ControlServer) transfer(c Caller, f *OpenFile, write bool, reqs []client.IOReq, refuse []unix.Errno) []int64 {
	res := make([]int64, len(reqs))
	lr := libRequests.Get().(*libRequestArrays)
	preqs, idx := lr.reqs[:0], lr.idx[:0]
	if cap(preqs) < len(reqs) { // (not slices.Grow: see phxfs reserved)
		preqs, idx = make([]phxfs.Request, 0, len(reqs)), make([]int, 0, len(reqs))
	}

	held := s.holdExtents(c, f, write, reqs, refuse, res, &preqs, &idx)
	defer func() {
		for _, b := range held {
			b.reg.Release()
		}
		if cap(preqs) <= maxKeptRequests { // a strided write's pieces are not kept
			lr.reqs, lr.idx = preqs, idx
			libRequests.Put(lr)
		}
	}()

	// One extent or many, the library's batch path: it resolves each
	// request against its registration, coalesces and runs them.
	if len(preqs) > 0 {
		var err error
		if write {
			_, err = s.lib.WriteBatch(preqs)
		} else {
			_, err = s.lib.ReadBatch(preqs)
		}
		if err != nil {
			for i := range preqs {
				preqs[i].Result = -int64(errs.Errno(err))
			}
		}
		s.noteFallback()
	}

	var moved uint64
	for k, i := range idx {
		res[i] = preqs[k].Result
		if res[i] > 0 {
			moved += uint64(res[i])
		}
	}
	if write {
		s.stats.bytesWritten.Add(moved)
	} else {
		s.stats.bytesRead.Add(moved)
	}
	return res
}

// libRequestArrays is a batch's library requests and their extents'
// indices, kept for the next batch (a KV client's 409 extents an ioctl
// made 40 KB of them a batch, thousands of batches a second; phxfs keeps
// its plans' arrays the same way).
type libRequestArrays struct {
	reqs []phxfs.Request
	idx  []int
}

var libRequests = sync.Pool{New: func() any { return new(libRequestArrays) }}

// maxKeptRequests bounds the arrays kept: a plain batch's extents (and
// the allocator's rounding up).
const maxKeptRequests = 2 * client.MaxExtents

// holdExtents checks every extent that is not refused yet against its
// buffer and the caller (res gets -errno), holds the registration of each
// buffer named (once; the caller releases them) and appends a library
// request for each extent that passed, with its index.
func (s *ControlServer) holdExtents(c Caller, f *OpenFile, write bool, reqs []client.IOReq, refuse []unix.Errno, res []int64, preqs *[]phxfs.Request, idx *[]int) []*buffer {
	var held []*buffer
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range reqs {
		if refuse[i] != 0 {
			res[i] = -int64(refuse[i])
			continue
		}
		b, e := s.bufferFor(c, write, r)
		if e != 0 {
			res[i] = -int64(e)
			continue
		}
		if !slices.Contains(held, b) {
			// Under s.mu, where release unlinks the buffer: a buffer found
			// here is not closing yet, so this hold cannot fail.
			if b.reg.Hold() != nil {
				res[i] = -int64(unix.ENOENT)
				continue
			}
			held = append(held, b)
		}
		*idx = append(*idx, i)
		*preqs = append(*preqs, phxfs.Request{Fd: f.Fd, Device: b.reg.Device(), DevAddr: b.reg.Addr(),
			BufOffset: int64(r.BufOffset), Len: int64(r.Length), FileOffset: int64(r.FileOffset),
			Count: int64(r.Count), FileStride: int64(r.FileStride), BufStride: int64(r.BufStride)})
	}
	return held
}

// bufferFor is the live buffer extent r names, or the errno that refuses
// r (docs/abi.md's order): ENOENT no such buffer, EPERM another owner's,
// EACCES a read into memory shared read-only, EFAULT the extent leaves
// the buffer. The caller holds s.mu.
func (s *ControlServer) bufferFor(c Caller, write bool, r client.IOReq) (*buffer, unix.Errno) {
	b := s.bufs[r.ID]
	switch {
	case b == nil:
		return nil, unix.ENOENT
	case !b.ownedBy(c):
		return nil, unix.EPERM
	case !write && b.reg.ReadOnly():
		return nil, unix.EACCES
	case r.BufEnd() > uint64(b.reg.Size()):
		return nil, unix.EFAULT
	}
	return b, 0
}

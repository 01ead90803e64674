package fusefs

import (
	"context"
	"crypto/rand"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"phxmount/client"
	"phxmount/connector"
	"phxmount/internal/errs"
	"phxmount/phxfs"
)

// This file is the control protocol server: the project's ioctls (the ABI
// of package client, documented in docs/abi.md) over a phxfs library.
// control_buffers.go holds the registrations and their lifetime,
// control_xattr.go the user.phx.* names.

// ControlConfig configures NewControl.
type ControlConfig struct {
	// Lib performs the I/O. Required.
	Lib *phxfs.Lib
	// ReadOnly refuses every write ioctl with EROFS (a read-only mount).
	ReadOnly bool
	// Passthrough reports whether the overlay's kernel passthrough is
	// active, and why; nil reports "unknown" (see SetPassthrough).
	Passthrough func() (bool, string)
	// MaxBuffersPerProcess bounds the live buffers of one process (default
	// 4096; EMFILE past it).
	MaxBuffersPerProcess int
	// MaxBuffers bounds the live buffers of the mount (default 65536;
	// ENFILE past it).
	MaxBuffers int
	// MaxRegisteredBytes bounds the bytes the mount's live buffers register
	// (default 16 TiB, an eighth of the daemon's address space, which
	// imports map; ENOMEM past it).
	MaxRegisteredBytes int64
	// Log receives the control's log lines; nil uses logrus' standard logger.
	Log *logrus.Entry
}

// ControlServer implements Control. Create it with NewControl and Close it
// after the overlay is unmounted.
type ControlServer struct {
	cfg    ControlConfig
	lib    *phxfs.Lib
	conn   connector.Connector
	vendor client.Vendor
	log    *logrus.Entry
	pt     atomic.Pointer[func() (bool, string)]

	mu     sync.Mutex
	bufs   map[uint64]*buffer
	tokens map[client.Token]*buffer
	byFile map[uint64]map[*buffer]struct{}
	procs  map[int]*proc
	nextID uint64
	closed bool

	// Registrations in progress (reserve) and the bytes of live ones.
	pending      map[int]int // by tgid
	pendingCount int
	pendingBytes int64
	liveBytes    int64

	devMu   sync.Mutex
	devOpen map[int]bool

	watch *deathWatch
	stats ctlCounters

	fallbackLogged atomic.Bool
}

type ctlCounters struct {
	registered, relDereg, relClose, relDeath atomic.Uint64
	bytesRead, bytesWritten                  atomic.Uint64
	extents, failedExtents, rejected, calls  atomic.Uint64
	loads                                    atomic.Uint64
}

var _ Control = (*ControlServer)(nil)

// NewControl creates the control protocol server over a phxfs library.
func NewControl(cfg ControlConfig) (*ControlServer, error) {
	if cfg.Lib == nil {
		return nil, errs.New(unix.EINVAL, "control: no phxfs library")
	}
	if cfg.MaxBuffersPerProcess <= 0 {
		cfg.MaxBuffersPerProcess = 4096
	}
	if cfg.MaxBuffers <= 0 {
		cfg.MaxBuffers = 65536
	}
	if cfg.MaxRegisteredBytes <= 0 {
		cfg.MaxRegisteredBytes = 16 << 40
	}
	log := cfg.Log
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	s := &ControlServer{
		cfg:     cfg,
		lib:     cfg.Lib,
		conn:    cfg.Lib.Connector(),
		vendor:  client.VendorByName(cfg.Lib.Connector().Vendor()),
		log:     log,
		bufs:    map[uint64]*buffer{},
		tokens:  map[client.Token]*buffer{},
		byFile:  map[uint64]map[*buffer]struct{}{},
		procs:   map[int]*proc{},
		pending: map[int]int{},
		devOpen: map[int]bool{},
	}
	if cfg.Passthrough != nil {
		s.SetPassthrough(cfg.Passthrough)
	}
	w, err := newDeathWatch(s.ownerDied)
	if err != nil {
		return nil, err
	}
	s.watch = w
	return s, nil
}

// SetPassthrough sets the function that reports the overlay's passthrough
// state (the overlay exists only after the control is created).
func (s *ControlServer) SetPassthrough(fn func() (bool, string)) { s.pt.Store(&fn) }

func (s *ControlServer) passthrough() (known, active bool, why string) {
	p := s.pt.Load()
	if p == nil || *p == nil {
		return false, false, "the overlay does not report its passthrough state to the control"
	}
	active, why = (*p)()
	return true, active, why
}

// Close releases every buffer and stops watching their owners. The library
// is the caller's to close afterwards.
func (s *ControlServer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	var all []*buffer
	for _, b := range s.bufs {
		all = append(all, b)
	}
	s.mu.Unlock()
	var first error
	for _, b := range all {
		if err := s.release(b, releaseShutdown); err != nil && first == nil {
			first = err
		}
	}
	s.watch.close()
	return first
}

// openDevice opens device dev in the library once, for the server's life.
func (s *ControlServer) openDevice(dev int) error {
	s.devMu.Lock()
	defer s.devMu.Unlock()
	if s.devOpen[dev] {
		return nil
	}
	if err := s.lib.OpenDevice(dev); err != nil {
		return err
	}
	s.devOpen[dev] = true
	if d, err := s.lib.Device(dev); err == nil {
		s.log.WithFields(logrus.Fields{"device": dev, "transport": string(d.Transport)}).
			Infof("device %d (%s %s): transport %s: %s", dev, s.conn.Vendor(), d.PCIAddress, d.Transport, d.TransportWhy)
	}
	return nil
}

// noteFallback logs, once, the first staged read that fell back from
// O_DIRECT to the page cache (later ones are counted: staged_fallbacks).
func (s *ControlServer) noteFallback() {
	if s.fallbackLogged.Load() {
		return
	}
	if why := s.lib.StagedStats().FallbackWhy; why != "" && !s.fallbackLogged.Swap(true) {
		s.log.Warnf("staged read policy: %s; it was redone through the page cache (further ones are counted in staged_fallbacks)", why)
	}
}

// Ioctl implements Control.
func (s *ControlServer) Ioctl(ctx context.Context, c Caller, f *OpenFile, cmd uint32, in, out []byte) (int32, syscall.Errno) {
	ours, err := client.Known(cmd)
	if !ours {
		return 0, unix.ENOTTY
	}
	s.stats.calls.Add(1)
	e := unix.Errno(0)
	if err == nil {
		e = s.serve(c, f, cmd, in, out)
	} else {
		e = unix.EINVAL
	}
	if e != 0 {
		s.stats.rejected.Add(1)
		if s.log.Logger.IsLevelEnabled(logrus.DebugLevel) {
			s.log.WithFields(logrus.Fields{"cmd": cmdName(cmd), "pid": c.Tgid, "file": f.Name}).Debugf("ioctl refused: %v", e)
		}
	}
	return 0, e
}

func cmdName(cmd uint32) string {
	switch client.ParseCmd(cmd).Nr {
	case client.NrRegister:
		return "REGISTER"
	case client.NrDeregister:
		return "DEREGISTER"
	case client.NrRead:
		return "READ"
	case client.NrWrite:
		return "WRITE"
	case client.NrBatchRead:
		return "BATCH_READ"
	case client.NrBatchWrite:
		return "BATCH_WRITE"
	case client.NrInfo:
		return "INFO"
	}
	return "?"
}

func (s *ControlServer) serve(c Caller, f *OpenFile, cmd uint32, in, out []byte) unix.Errno {
	nr := client.ParseCmd(cmd).Nr
	if len(in) != client.ParseCmd(cmd).Size {
		return unix.EINVAL
	}
	wantOut := nr != client.NrDeregister
	if wantOut && len(out) != len(in) {
		return unix.EINVAL
	}
	switch nr {
	case client.NrRegister:
		req, err := client.DecodeRegister(in)
		if err != nil {
			return unix.EINVAL
		}
		resp, e := s.register(c, f, req)
		if e != 0 {
			return e
		}
		client.EncodeRegisterResp(out, req, resp)
		return 0
	case client.NrDeregister:
		id, err := client.DecodeDeregister(in)
		if err != nil {
			return unix.EINVAL
		}
		return s.deregister(c, id)
	case client.NrRead, client.NrWrite:
		write := nr == client.NrWrite
		req, err := client.DecodeIO(in)
		if err != nil {
			return unix.EINVAL
		}
		if e := s.checkMode(f, write); e != 0 {
			return e
		}
		res := s.move(c, f, write, []client.IOReq{req}, make([]unix.Errno, 1))
		if res[0] < 0 {
			return unix.Errno(-res[0])
		}
		client.EncodeIOResp(out, req, res[0])
		return 0
	case client.NrBatchRead, client.NrBatchWrite:
		write := nr == client.NrBatchWrite
		reqs, bad, err := client.DecodeBatch(in)
		if err != nil {
			return unix.EINVAL
		}
		if e := s.checkMode(f, write); e != 0 {
			return e
		}
		refuse := make([]unix.Errno, len(reqs))
		for i := range bad {
			if bad[i] != nil {
				refuse[i] = unix.EINVAL
			}
		}
		res := s.move(c, f, write, reqs, refuse)
		client.EncodeBatchResp(out, in, res)
		return 0
	case client.NrInfo:
		dev, err := client.DecodeInfoReq(in)
		if err != nil {
			return unix.EINVAL
		}
		info, e := s.info(int(dev), f.Fd)
		if e != 0 {
			return e
		}
		client.EncodeInfo(out, info)
		return 0
	}
	return unix.ENOTTY
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
	res := s.moveExtents(c, f, write, reqs, refuse)
	var failed uint64
	for i := range res {
		if res[i] < 0 || uint64(res[i]) != reqs[i].Length {
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
	preqs := make([]phxfs.Request, 0, len(reqs))
	idx := make([]int, 0, len(reqs))

	held := s.holdExtents(c, f, reqs, refuse, res, &preqs, &idx)
	defer func() {
		for _, b := range held {
			b.reg.Release()
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

// holdExtents checks every extent that is not refused yet against its
// buffer and the caller (res gets -errno), holds the registration of each
// buffer named (once; the caller releases them) and appends a library
// request for each extent that passed, with its index.
func (s *ControlServer) holdExtents(c Caller, f *OpenFile, reqs []client.IOReq, refuse []unix.Errno, res []int64, preqs *[]phxfs.Request, idx *[]int) []*buffer {
	var held []*buffer
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range reqs {
		if refuse[i] != 0 {
			res[i] = -int64(refuse[i])
			continue
		}
		b := s.bufs[r.ID]
		switch {
		case b == nil:
			res[i] = -int64(unix.ENOENT)
			continue
		case !b.ownedBy(c):
			res[i] = -int64(unix.EPERM)
			continue
		case r.BufOffset > uint64(b.reg.Size()) || r.Length > uint64(b.reg.Size())-r.BufOffset:
			res[i] = -int64(unix.EFAULT)
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
			BufOffset: int64(r.BufOffset), Len: int64(r.Length), FileOffset: int64(r.FileOffset)})
	}
	return held
}

// randomToken draws a capability token.
func randomToken() (client.Token, error) {
	var t client.Token
	_, err := rand.Read(t[:])
	return t, err
}

package fusefs

import (
	"crypto/rand"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/defaults"
	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/phxfs"
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
	// client.DefaultMaxBuffersPerProcess; EMFILE past it).
	MaxBuffersPerProcess int
	// MaxBuffersPerUser and MaxRegisteredBytesPerUser bound the live
	// buffers of one uid other than root, in all its processes, and the
	// bytes they register (defaults client.DefaultMaxBuffersPerUser and
	// client.DefaultMaxRegisteredBytesPerUser; EDQUOT past them): no user
	// takes the whole mount's room from the others.
	MaxBuffersPerUser         int
	MaxRegisteredBytesPerUser int64
	// MaxBuffers bounds the live buffers of the mount (default
	// client.DefaultMaxBuffers; ENFILE past it).
	MaxBuffers int
	// MaxRegisteredBytes bounds the bytes the mount's live buffers register
	// (default client.DefaultMaxRegisteredBytes, an eighth of the daemon's
	// address space, which imports map; ENOMEM past it).
	MaxRegisteredBytes int64
	// MaxPiecesInFlightPerUser and MaxPiecesInFlight bound the pieces of
	// the batches served at once (a plain batch's extents count as pieces), of one uid but root and of all
	// callers (defaults client.DefaultMaxPiecesInFlightPerUser and
	// client.DefaultMaxPiecesInFlight); a batch past them waits
	// (control_gate.go).
	MaxPiecesInFlightPerUser int64
	MaxPiecesInFlight        int64
	// Log receives the control's log lines; nil uses logrus' standard logger.
	Log *logrus.Entry
	// ObserveIoctl, when set, is told how long each data ioctl took to
	// serve (READ, WRITE, BATCH_READ, BATCH_WRITE), with the command's name
	// in lower case ("batch_read"): the metrics' latency histogram.
	ObserveIoctl func(command string, d time.Duration)
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
	// shutdown: the daemon began shutting down (BeginShutdown): new
	// registrations get ESHUTDOWN, live buffers serve until Close.
	shutdown bool

	// Registrations in progress (reserve) and the bytes of live ones.
	pending      map[int]int // by tgid
	pendingCount int
	pendingBytes int64
	liveBytes    int64
	// What each uid but root holds, its registrations in progress
	// included: the per-user limits' count.
	users map[uint32]userUse

	// pieces counts the batches' pieces served now (its own lock).
	pieces *pieceGate

	devMu   sync.Mutex
	devOpen map[int]bool

	reaper *reaper // releases the registrations of processes that exit
	stats  ctlCounters

	// The log lines clients' requests cause, rate limited (control_log.go).
	logRefused, logRegistered, logReleased, logLoad logLimit

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
	defaults.Set(&cfg.MaxBuffersPerProcess, client.DefaultMaxBuffersPerProcess)
	defaults.Set(&cfg.MaxBuffersPerUser, client.DefaultMaxBuffersPerUser)
	defaults.Set(&cfg.MaxRegisteredBytesPerUser, client.DefaultMaxRegisteredBytesPerUser)
	defaults.Set(&cfg.MaxBuffers, client.DefaultMaxBuffers)
	defaults.Set(&cfg.MaxRegisteredBytes, client.DefaultMaxRegisteredBytes)
	defaults.Set(&cfg.MaxPiecesInFlightPerUser, client.DefaultMaxPiecesInFlightPerUser)
	defaults.Set(&cfg.MaxPiecesInFlight, client.DefaultMaxPiecesInFlight)
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
		users:   map[uint32]userUse{},
		pieces:  newPieceGate(cfg.MaxPiecesInFlight, cfg.MaxPiecesInFlightPerUser),
		devOpen: map[int]bool{},
	}
	if cfg.Passthrough != nil {
		s.SetPassthrough(cfg.Passthrough)
	}
	r, err := newReaper(s.ownerExited)
	if err != nil {
		return nil, err
	}
	s.reaper = r
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

// BeginShutdown says that the daemon began shutting down (the unmount
// started): from now on REGISTER gets ESHUTDOWN, while the buffers already
// registered keep serving their owners' I/O, which Close drains. Clients
// still attached see their requests served until the mount goes.
func (s *ControlServer) BeginShutdown() {
	s.mu.Lock()
	first := !s.shutdown
	s.shutdown = true
	live := len(s.bufs)
	s.mu.Unlock()
	if first {
		s.log.Infof("shutting down: new registrations get ESHUTDOWN; %d live buffers serve until the unmount ends", live)
	}
}

// Close releases every buffer and stops the reaper. The library
// is the caller's to close afterwards.
func (s *ControlServer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed, s.shutdown = true, true
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
	s.reaper.close()
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
	if sr, ok := s.conn.(interface{ ScatterReport() string }); ok {
		s.log.Infof("scatter and gather of small extents: %s", sr.ScatterReport())
	}
	if gr, ok := s.conn.(interface{ GuardReport() (bool, string) }); ok {
		if guarded, why := gr.GuardReport(); guarded {
			s.log.Infof("device %d: %s", dev, why)
		} else {
			s.log.Warnf("device %d: %s", dev, why)
		}
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

// randomToken draws a capability token.
func randomToken() (client.Token, error) {
	var t client.Token
	_, err := rand.Read(t[:])
	return t, err
}

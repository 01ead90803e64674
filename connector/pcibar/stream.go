package pcibar

import (
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/internal/faultsafe"
	"github.com/phxmount/phxmount/kmod"
)

// View names how Stream copies reach a BAR.
const (
	ViewResource = "resource" // mmap of /sys/bus/pci/devices/ADDR/resource2
	ViewModule   = "module"   // the whole BAR mapped by the phxfs module
)

// barView is a CPU mapping of a whole BAR.
type barView struct {
	kind   string
	resErr error // why the resource file could not be mapped (ViewModule)
	b      []byte
	dev    *kmod.Device  // ViewModule
	m      *kmod.Mapping // ViewModule
}

func (v *barView) close() error {
	if v.kind == ViewModule {
		return v.dev.Close() // unmaps v.m
	}
	if err := unix.Munmap(v.b); err != nil {
		return errs.Wrapf(err, "pcibar: munmap BAR")
	}
	return nil
}

// openView maps d's BAR for the CPU: the sysfs resource file first; where
// the kernel refuses that (x86 PAT: the module's pages already map the
// range write-back), a module mapping of the whole BAR.
func (d *device) openView() (*barView, error) {
	d.viewMu.Lock()
	defer d.viewMu.Unlock()
	if d.view != nil {
		return d.view, nil
	}
	p := filepath.Join(SysfsPCI, d.pci, "resource"+strconv.Itoa(BAR))
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errs.Wrapf(err, "pcibar: open %s", p)
	}
	b, merr := unix.Mmap(fd, 0, int(d.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fd)
	if merr == nil {
		d.view = &barView{kind: ViewResource, b: b}
		return d.view, nil
	}
	if !kmod.Available(d.index) {
		return nil, errs.Wrapf(merr, "pcibar: mmap %s", p)
	}
	kd, err := kmod.Open(d.index)
	if err != nil {
		return nil, err
	}
	m, err := kd.Map(kmod.EmuDevAddr(d.index, 0), d.size)
	if err != nil {
		kd.Close()
		return nil, errs.Wrapf(err, "pcibar: mmap %s (%v), then map it through the module", p, merr)
	}
	d.view = &barView{kind: ViewModule, resErr: errs.Wrapf(merr, "pcibar: mmap %s", p), b: m.Bytes(), dev: kd, m: m}
	return d.view, nil
}

// ViewKind reports how Stream copies of device dev reach its BAR
// (ViewResource or ViewModule), mapping it if needed; for ViewModule,
// reason says why the resource file could not be mapped.
func (c *Connector) ViewKind(dev int) (kind, reason string, err error) {
	d, err := c.device(dev)
	if err != nil {
		return "", "", err
	}
	v, err := d.openView()
	if err != nil {
		return "", "", err
	}
	if v.resErr != nil {
		reason = v.resErr.Error()
	}
	return v.kind, reason, nil
}

// Stream copies synchronously through a CPU mapping of the BAR.
type Stream struct {
	c    *Connector
	dev  *device
	view *barView

	mu     sync.Mutex
	closed bool
}

var _ connector.Stream = (*Stream)(nil)

// NewStream implements connector.Connector.
func (c *Connector) NewStream(dev int) (connector.Stream, error) {
	d, err := c.device(dev)
	if err != nil {
		return nil, err
	}
	v, err := d.openView()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errs.New(unix.EINVAL, "pcibar: connector closed")
	}
	c.streams++
	return &Stream{c: c, dev: d, view: v}, nil
}

// open fails once the stream is closed.
func (s *Stream) open() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errs.New(unix.EINVAL, "pcibar: stream closed")
	}
	return nil
}

// CopyToDevice implements connector.Stream.
func (s *Stream) CopyToDevice(dst uint64, src []byte) error {
	return s.ScatterToDevice(src, []connector.Piece{{Dev: dst, Len: int64(len(src))}})
}

// CopyFromDevice implements connector.Stream.
func (s *Stream) CopyFromDevice(dst []byte, src uint64) error {
	return s.GatherFromDevice(dst, []connector.Piece{{Dev: src, Len: int64(len(dst))}})
}

// ScatterToDevice implements connector.Stream: the CPU copies each piece
// through the BAR mapping, now. A failure is the caller's alone: it is
// returned, and no Fence reports it again.
func (s *Stream) ScatterToDevice(src []byte, ps []connector.Piece) error {
	return s.pieces(src, ps, false)
}

// GatherFromDevice implements connector.Stream.
func (s *Stream) GatherFromDevice(dst []byte, ps []connector.Piece) error {
	return s.pieces(dst, ps, true)
}

func (s *Stream) pieces(host []byte, ps []connector.Piece, gather bool) error {
	if err := s.open(); err != nil {
		return err
	}
	for _, p := range ps {
		if p.Off < 0 || p.Len < 0 || p.Off > int64(len(host))-p.Len {
			return errs.New(unix.EINVAL, "pcibar: piece of %d bytes at %d outside a %d-byte host buffer", p.Len, p.Off, len(host))
		}
		off, err := s.dev.barOffset(p.Dev, p.Len)
		if err != nil {
			return err
		}
		bar, h := s.view.b[off:off+p.Len], host[p.Off:p.Off+p.Len]
		if gather {
			err = faultsafe.Copy("pcibar: BAR mapping", s.view.b, h, bar)
		} else {
			err = faultsafe.Copy("pcibar: BAR mapping", s.view.b, bar, h)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Fence implements connector.Stream: copies are done, and their errors
// returned, when enqueued, so a fence has nothing to wait for or report.
func (s *Stream) Fence() (connector.Fence, error) {
	if err := s.open(); err != nil {
		return nil, err
	}
	return doneFence{}, nil
}

// doneFence is a fence over copies that have completed.
type doneFence struct{}

func (doneFence) Wait() error { return nil }

// Synchronize implements connector.Stream: copies are done when enqueued.
func (s *Stream) Synchronize() error { return s.open() }

// Close implements connector.Stream.
func (s *Stream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errs.New(unix.EINVAL, "pcibar: stream closed twice")
	}
	s.closed = true
	s.mu.Unlock()
	s.c.mu.Lock()
	s.c.streams--
	s.c.mu.Unlock()
	return nil
}

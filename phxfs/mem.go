package phxfs

import (
	"sort"

	"golang.org/x/sys/unix"

	"phxmount/internal/errs"
)

// region is one live registration.
type region struct {
	dev       *device
	addr      uint64
	size      int64
	transport Transport
	host      uintptr // where I/O lands: the VMA (direct), the memory (host), 0 (staged)
	undo      func() error

	refs  int  // RegMem calls not yet DeregMem'd
	holds int  // in-flight requests using it
	dying bool // the last DeregMem waits for holds to drop
}

func (r *region) end() uint64 { return r.addr + uint64(r.size) }

func (r *region) unmap() error {
	if r.undo == nil {
		return nil
	}
	return r.undo()
}

// Registration is what RegMem returns.
type Registration struct {
	Device    int
	Addr      uint64
	Size      int64
	Transport Transport
	// Handle is the host address of the registration's mapping: an internal
	// handle for reference only (0 for the staged transport). I/O names the
	// buffer by Addr.
	Handle uintptr
}

// RegMem registers device memory [addr, addr+size) on device dev. Both must
// be non-zero multiples of the device page (64 KiB). Registering the same
// range again while it is live adds a reference; any other overlap with a
// live registration is EINVAL.
func (l *Lib) RegMem(dev int, addr uint64, size int64) (Registration, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d, err := l.openDevice(dev)
	if err != nil {
		return Registration{}, err
	}
	ps := uint64(d.info.PageSize)
	if addr == 0 || size <= 0 || addr%ps != 0 || uint64(size)%ps != 0 {
		return Registration{}, errs.New(unix.EINVAL, "phxfs: register [%#x, +%d): address and length must be non-zero multiples of %d", addr, size, ps)
	}
	if addr+uint64(size) < addr {
		return Registration{}, errs.New(unix.EINVAL, "phxfs: register [%#x, +%d) wraps the address space", addr, size)
	}
	i := sort.Search(len(d.regions), func(i int) bool { return d.regions[i].end() > addr })
	if i < len(d.regions) && d.regions[i].addr < addr+uint64(size) {
		r := d.regions[i]
		if r.addr != addr || r.size != size {
			return Registration{}, errs.New(unix.EINVAL, "phxfs: [%#x, +%d) overlaps registration [%#x, +%d)", addr, size, r.addr, r.size)
		}
		if r.dying {
			return Registration{}, errs.New(unix.EBUSY, "phxfs: [%#x, +%d) is being deregistered", addr, size)
		}
		r.refs++
		return r.registration(), nil
	}

	t, _, err := l.transportFor(d)
	if err != nil {
		return Registration{}, err
	}
	r := &region{dev: d, addr: addr, size: size, transport: t, refs: 1}
	host, err := l.conn.Resolve(dev, addr, size)
	if err != nil {
		return Registration{}, errs.New(errs.Errno(err), "phxfs: register [%#x, +%d) on device %d: %v", addr, size, dev, err)
	}
	switch t {
	case Direct:
		r.host, r.undo, err = d.kdev.Map(addr, size)
		if err != nil {
			return Registration{}, errs.New(errs.Errno(err), "phxfs: map [%#x, +%d) through the kernel module: %v", addr, size, err)
		}
	case Host:
		r.host = host
	}
	d.regions = append(d.regions, nil)
	copy(d.regions[i+1:], d.regions[i:])
	d.regions[i] = r
	return r.registration(), nil
}

func (r *region) registration() Registration {
	return Registration{Device: r.dev.index, Addr: r.addr, Size: r.size, Transport: r.transport, Handle: r.host}
}

// DeregMem drops one reference on the registration [addr, addr+size). The
// last one waits for in-flight I/O on the region, then unmaps it.
func (l *Lib) DeregMem(dev int, addr uint64, size int64) error {
	l.mu.Lock()
	d, err := l.openDevice(dev)
	if err != nil {
		l.mu.Unlock()
		return err
	}
	i := sort.Search(len(d.regions), func(i int) bool { return d.regions[i].addr >= addr })
	if i == len(d.regions) || d.regions[i].addr != addr || d.regions[i].size != size || d.regions[i].dying {
		l.mu.Unlock()
		return errs.New(unix.EINVAL, "phxfs: [%#x, +%d) is not registered on device %d", addr, size, dev)
	}
	r := d.regions[i]
	r.refs--
	if r.refs > 0 {
		l.mu.Unlock()
		return nil
	}
	r.dying = true
	for r.holds > 0 {
		l.changed.Wait()
	}
	// The device may have been closed while we waited; it then unmapped r.
	for j, x := range d.regions {
		if x == r {
			d.regions = append(d.regions[:j], d.regions[j+1:]...)
			l.mu.Unlock()
			if err := r.unmap(); err != nil {
				return errs.New(errs.Errno(err), "phxfs: unmap [%#x, +%d): %v", addr, size, err)
			}
			return nil
		}
	}
	l.mu.Unlock()
	return nil
}

// Transport reports the transport of the registration holding addr.
func (l *Lib) Transport(dev int, addr uint64) (Transport, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d, err := l.openDevice(dev)
	if err != nil {
		return "", err
	}
	r := d.find(addr, 1)
	if r == nil {
		return "", errs.New(unix.EFAULT, "phxfs: %#x is not registered on device %d", addr, dev)
	}
	return r.transport, nil
}

func (l *Lib) openDevice(dev int) (*device, error) {
	d := l.devices[dev]
	if d == nil || d.draining {
		return nil, errs.New(unix.ENODEV, "phxfs: device %d is not open", dev)
	}
	return d, nil
}

// find returns the live registration holding [addr, addr+n), or nil.
func (d *device) find(addr uint64, n int64) *region {
	i := sort.Search(len(d.regions), func(i int) bool { return d.regions[i].end() > addr })
	if i == len(d.regions) {
		return nil
	}
	r := d.regions[i]
	if r.dying || addr < r.addr || n < 0 || addr+uint64(n) > r.end() || addr+uint64(n) < addr {
		return nil
	}
	return r
}

// hold resolves a request's buffer and takes a reference on its registration
// for the transfer. The caller holds l.mu.
func (l *Lib) hold(dev int, buf uint64, off, n int64) (*region, error) {
	d := l.devices[dev]
	if d == nil || d.draining {
		return nil, errs.New(unix.EFAULT, "phxfs: device %d is not open", dev)
	}
	if off < 0 || uint64(off) > ^uint64(0)-buf {
		return nil, errs.New(unix.EFAULT, "phxfs: buffer offset %d", off)
	}
	// buf itself must lie inside the registration, and the transfer too.
	r := d.find(buf, 0)
	if r == nil || n < 0 || uint64(off) > r.end()-buf || uint64(n) > r.end()-buf-uint64(off) {
		return nil, errs.New(unix.EFAULT, "phxfs: [%#x+%d, +%d) is not inside a registration on device %d", buf, off, n, dev)
	}
	r.holds++
	d.inflight++
	return r, nil
}

// release drops a hold taken by hold. The caller holds l.mu.
func (l *Lib) release(r *region) {
	r.holds--
	r.dev.inflight--
	if r.holds == 0 || r.dev.inflight == 0 {
		l.changed.Broadcast()
	}
}

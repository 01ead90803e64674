package phxfs

import (
	"fmt"
	"slices"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
)

// region is device memory registered with the library: one object with
// one life. Registering the same range again while it lives adds a
// reference to the same region. Transfers hold it; the deregistration
// that drops the last reference waits for the holds to drain, then unmaps
// it and closes the memory the library imported for it. A device's last
// close does the same to every region left on it.
type region struct {
	dev       *device
	addr      uint64
	size      int64
	transport Transport
	host      uintptr            // where I/O lands: the VMA (kmod), the memory (host), 0 (staged)
	unmap     func() error       // undoes the kernel module's mapping; nil without one
	imported  []connector.Memory // memory Import brought in for it, closed with it
	readOnly  bool               // imported read-only: nothing may be read into it

	refs []*Registration // the references not yet closed, oldest first
	io   users           // transfers holding it
}

// Registration is one reference to registered device memory: what one
// RegMem or Import returned. References to the same range share the
// memory and its transfers; each has its own holds (Hold), and closing
// one waits for those of its own, so that a caller's deregistration
// returns only once its own I/O on the memory is done, even while others
// keep the memory registered.
type Registration struct {
	*region
	own    users // holds taken through this reference
	closed bool
}

// Device is the index of the device the memory belongs to.
func (r *region) Device() int { return r.dev.index }

// Addr is the device address of the memory: what requests name.
func (r *region) Addr() uint64 { return r.addr }

// Size is the registered length in bytes.
func (r *region) Size() int64 { return r.size }

// Transport is the path a transfer of this memory takes.
func (r *region) Transport() Transport { return r.transport }

// ReadOnly reports memory imported read-only (the exporter shared it so):
// a read into it is refused with EACCES; writes from it work.
func (r *region) ReadOnly() bool { return r.readOnly }

// HostAddr is where I/O lands in this process (the kernel module's VMA, or
// host-addressable memory; 0 for the staged transport): an internal handle
// for reference only, as the reference's target_addr. I/O names the memory
// by Addr.
func (r *region) HostAddr() uintptr { return r.host }

func (r *region) end() uint64 { return r.addr + uint64(r.size) }

func (r *region) String() string {
	return fmt.Sprintf("[%#x, +%d) on device %d", r.addr, r.size, r.dev.index)
}

// readOnlyMemory is what a connector's imported memory implements when it
// can be imported read-only.
type readOnlyMemory interface{ ReadOnly() bool }

// RegMem registers device memory [addr, addr+size) on device dev. Both must
// be non-zero multiples of the device page (64 KiB). Registering the same
// range again while it is live adds a reference to its memory; any other
// overlap with a live registration is EINVAL.
func (l *Lib) RegMem(dev int, addr uint64, size int64) (*Registration, error) {
	l.mu.Lock()
	r, err := l.regMem(dev, addr, size, nil)
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := l.ready(r); err != nil {
		return nil, err
	}
	return r, nil
}

// Import brings in memory that another process exported (connector.Memory
// Export; pid is the process presenting the handle) and registers it. The
// registration owns the import: it is closed when the registration goes.
func (l *Lib) Import(dev int, h connector.Handle, size int64, pid int) (*Registration, error) {
	mem, err := l.conn.Import(dev, h, size, pid)
	if err != nil {
		return nil, errs.Wrap("phxfs: import", fmt.Sprintf("%d bytes on device %d", size, dev), err)
	}
	l.mu.Lock()
	r, err := l.regMem(dev, mem.Addr(), size, mem)
	l.mu.Unlock()
	if err != nil {
		mem.Close()
		return nil, err
	}
	if err := l.ready(r); err != nil {
		return nil, err
	}
	return r, nil
}

// ready makes what transfers of r need before the first one, so that no
// timed load pays for it: for the staged transport, the bounce buffers and
// the device's copy streams (once per library and device). When they
// cannot be made, the registration is undone and the error returned.
func (l *Lib) ready(r *Registration) error {
	if r.transport != Staged {
		return nil
	}
	if _, err := l.warm(r.dev.index); err != nil {
		r.Close()
		return err
	}
	return nil
}

// regMem registers [addr, addr+size) on dev, owning mem when it is not
// nil, and returns the new reference. The caller holds l.mu.
func (l *Lib) regMem(dev int, addr uint64, size int64, mem connector.Memory) (*Registration, error) {
	d, err := l.openDevice(dev)
	if err != nil {
		return nil, err
	}
	subject := fmt.Sprintf("[%#x, +%d) on device %d", addr, size, dev)
	if err := checkRange(addr, size, uint64(d.info.PageSize)); err != nil {
		return nil, errs.Wrap("phxfs: register", subject, err)
	}
	i := sort.Search(len(d.regs), func(i int) bool { return d.regs[i].end() > addr })
	if i < len(d.regs) && d.regs[i].addr < addr+uint64(size) {
		return d.regs[i].again(addr, size, mem)
	}
	r, err := l.newRegion(d, addr, size)
	if err != nil {
		return nil, errs.Wrap("phxfs: register", subject, err)
	}
	if mem != nil {
		r.imported = append(r.imported, mem)
		ro, ok := mem.(readOnlyMemory)
		r.readOnly = ok && ro.ReadOnly()
	}
	d.regs = append(d.regs, nil)
	copy(d.regs[i+1:], d.regs[i:])
	d.regs[i] = r
	return r.newRef(), nil
}

// newRef adds a reference to r. The caller holds l.mu.
func (r *region) newRef() *Registration {
	ref := &Registration{region: r}
	r.refs = append(r.refs, ref)
	return ref
}

// checkRange refuses what cannot be a registration.
func checkRange(addr uint64, size int64, page uint64) error {
	switch {
	case addr == 0 || size <= 0 || addr%page != 0 || uint64(size)%page != 0:
		return errs.New(unix.EINVAL, "address and length must be non-zero multiples of %d", page)
	case addr+uint64(size) < addr:
		return errs.New(unix.EINVAL, "the range wraps the address space")
	}
	return nil
}

// again is a registration of a range overlapping r: the same range adds a
// reference (and the memory, to close with it), any other is EINVAL, and
// so is memory imported with another access than r's.
func (r *region) again(addr uint64, size int64, mem connector.Memory) (*Registration, error) {
	ro, _ := mem.(readOnlyMemory)
	switch {
	case r.addr != addr || r.size != size:
		return nil, errs.New(unix.EINVAL, "phxfs: [%#x, +%d) overlaps registration %v", addr, size, r)
	case r.io.closing:
		return nil, errs.New(unix.EBUSY, "phxfs: registration %v is being deregistered", r)
	case mem != nil && (ro != nil && ro.ReadOnly()) != r.readOnly:
		return nil, errs.New(unix.EINVAL, "phxfs: registration %v is already registered with another access", r)
	}
	if mem != nil {
		r.imported = append(r.imported, mem)
	}
	return r.newRef(), nil
}

// newRegion maps [addr, addr+size) for the transport d gives it.
func (l *Lib) newRegion(d *device, addr uint64, size int64) (*region, error) {
	t, _, err := l.transportFor(d)
	if err != nil {
		return nil, err
	}
	host, err := l.conn.Resolve(d.index, addr, size)
	if err != nil {
		return nil, err
	}
	r := &region{dev: d, addr: addr, size: size, transport: t}
	switch t {
	case Kmod:
		if r.host, r.unmap, err = d.kdev.Map(addr, size); err != nil {
			return nil, errs.Wrap("map through the kernel module", "", err)
		}
	case Host:
		r.host = host
	}
	return r, nil
}

// DeregMem closes one reference to the registration [addr, addr+size) (the
// newest): it waits for the holds taken through that reference, and the
// last reference for all in-flight I/O on the memory, then unmaps it.
func (l *Lib) DeregMem(dev int, addr uint64, size int64) error {
	l.mu.Lock()
	d, err := l.openDevice(dev)
	if err != nil {
		l.mu.Unlock()
		return err
	}
	i := sort.Search(len(d.regs), func(i int) bool { return d.regs[i].addr >= addr })
	if i == len(d.regs) || d.regs[i].addr != addr || d.regs[i].size != size || d.regs[i].io.closing || len(d.regs[i].refs) == 0 {
		l.mu.Unlock()
		return errs.New(unix.EINVAL, "phxfs: [%#x, +%d) is not registered on device %d", addr, size, dev)
	}
	refs := d.regs[i].refs
	return l.closeRef(refs[len(refs)-1]) // unlocks
}

// Close closes this reference (what its RegMem or Import took): it waits
// until no hold taken through it (Hold) is left, then drops the reference;
// the last reference also waits for every transfer on the memory and
// unmaps it.
func (r *Registration) Close() error {
	l := r.dev.lib
	l.mu.Lock()
	if r.closed || r.io.closing {
		l.mu.Unlock()
		return errs.New(unix.EINVAL, "phxfs: registration %v is already deregistered", r)
	}
	return l.closeRef(r) // unlocks
}

// closeRef closes ref: no new hold may be taken through it, its own holds
// drain, then its region loses the reference and, for the last, is
// drained and removed. The caller holds l.mu, which closeRef releases.
func (l *Lib) closeRef(ref *Registration) error {
	ref.closed = true
	ref.own.drain(l.changed)
	r := ref.region
	if i := slices.Index(r.refs, ref); i >= 0 {
		r.refs = slices.Delete(r.refs, i, i+1)
	}
	if len(r.refs) > 0 || r.io.closing {
		// Others keep the memory; or the device was closed while this
		// reference drained, and unmapped it.
		l.mu.Unlock()
		return nil
	}
	r.io.drain(l.changed)
	// The device may have been closed while we waited: it then unmapped r.
	d := r.dev
	for j, x := range d.regs {
		if x == r {
			d.regs = append(d.regs[:j], d.regs[j+1:]...)
			l.mu.Unlock()
			return r.release()
		}
	}
	l.mu.Unlock()
	return nil
}

// release undoes the mapping and closes the imports of a region no one
// holds any more.
func (r *region) release() error {
	var first error
	if r.unmap != nil {
		if err := r.unmap(); err != nil {
			first = errs.Wrap("phxfs: unmap", r.String(), err)
		}
	}
	for _, m := range r.imported {
		if err := m.Close(); err != nil && first == nil {
			first = errs.Wrap("phxfs: close the import of", r.String(), err)
		}
	}
	return first
}

// Hold keeps the registration registered until Release: a deregistration
// (Close of this reference, the last reference's, or the device's last
// close) waits for it. It fails with ENOENT once this reference or the
// memory is being deregistered. Transfers hold the memory themselves; Hold
// is for callers that must keep one between looking it up and using it.
func (r *Registration) Hold() error {
	l := r.dev.lib
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.closed {
		return errs.New(unix.ENOENT, "phxfs: registration %v is being deregistered", r)
	}
	if !r.dev.io.hold() {
		return errs.New(unix.ENOENT, "phxfs: device %d is closing", r.dev.index)
	}
	if !r.io.hold() {
		r.dev.io.release(l.changed)
		return errs.New(unix.ENOENT, "phxfs: registration %v is being deregistered", r)
	}
	r.own.hold()
	return nil
}

// Release drops a hold taken by Hold.
func (r *Registration) Release() {
	l := r.dev.lib
	l.mu.Lock()
	defer l.mu.Unlock()
	r.own.release(l.changed)
	l.release(r.region)
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
	if d == nil || d.io.closing {
		return nil, errs.New(unix.ENODEV, "phxfs: device %d is not open", dev)
	}
	return d, nil
}

// find returns the live region holding [addr, addr+n), or nil.
func (d *device) find(addr uint64, n int64) *region {
	i := sort.Search(len(d.regs), func(i int) bool { return d.regs[i].end() > addr })
	if i == len(d.regs) {
		return nil
	}
	r := d.regs[i]
	if r.io.closing || addr < r.addr || n < 0 || addr+uint64(n) > r.end() || addr+uint64(n) < addr {
		return nil
	}
	return r
}

// hold resolves a request's device buffer and takes a hold on its
// registration for the transfer. The caller holds l.mu.
func (l *Lib) hold(dev int, buf uint64, off, n int64) (*region, error) {
	d := l.devices[dev]
	if d == nil || d.io.closing {
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
	r.io.hold()
	d.io.hold()
	return r, nil
}

// release drops a hold on r (and on its device). The caller holds l.mu.
func (l *Lib) release(r *region) {
	r.io.release(l.changed)
	r.dev.io.release(l.changed)
}

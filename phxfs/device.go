package phxfs

import (
	"golang.org/x/sys/unix"

	"phxmount/connector"
	"phxmount/internal/errs"
)

// device is one open phxfs device.
type device struct {
	index    int
	info     connector.DeviceInfo
	refs     int  // client references (Open calls not yet Closed)
	draining bool // the last Close is waiting for in-flight I/O
	inflight int  // I/O requests holding one of its registrations
	regions  []*region
	kdev     kernelDevice // the kernel module's device, nil without it
}

// OpenDevice opens device index, or adds a client reference to it. An open
// racing the last close of the same device fails with EBUSY (retry).
func (l *Lib) OpenDevice(index int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errs.New(unix.EINVAL, "phxfs: library closed")
	}
	if d := l.devices[index]; d != nil {
		if d.draining {
			return errs.New(unix.EBUSY, "phxfs: device %d is closing", index)
		}
		d.refs++
		return nil
	}
	infos, err := l.conn.Devices()
	if err != nil {
		return errs.New(errs.Errno(err), "phxfs: list %s devices: %v", l.conn.Vendor(), err)
	}
	if index < 0 || index >= len(infos) {
		return errs.New(unix.ENODEV, "phxfs: no %s device %d (have %d)", l.conn.Vendor(), index, len(infos))
	}
	d := &device{index: index, info: infos[index], refs: 1}
	if d.info.PageSize <= 0 {
		d.info.PageSize = 64 << 10
	}
	if !l.cfg.NoKernelModule && (l.cfg.Transport == "" || l.cfg.Transport == Direct) {
		kdev, err := openKernelDevice(l.conn.Vendor(), d.info)
		switch {
		case err == nil:
			d.kdev = kdev
		case l.cfg.Transport == Direct:
			return errs.New(errs.Errno(err), "phxfs: direct transport asked for, but: %v", err)
		}
	}
	l.devices[index] = d
	return nil
}

// CloseDevice drops a client reference. The last one waits for in-flight I/O
// to drain, then removes every registration and closes the device.
func (l *Lib) CloseDevice(index int) error { return l.closeDevice(index, false) }

func (l *Lib) closeDevice(index int, all bool) error {
	l.mu.Lock()
	d := l.devices[index]
	if d == nil || d.draining {
		l.mu.Unlock()
		return errs.New(unix.ENODEV, "phxfs: device %d is not open", index)
	}
	d.refs--
	if all {
		d.refs = 0
	}
	if d.refs > 0 {
		l.mu.Unlock()
		return nil
	}
	d.draining = true
	for d.inflight > 0 {
		l.changed.Wait()
	}
	regions := d.regions
	d.regions = nil
	delete(l.devices, index)
	l.changed.Broadcast()
	l.mu.Unlock()

	var first error
	for _, r := range regions {
		if err := r.unmap(); err != nil && first == nil {
			first = err
		}
	}
	if d.kdev != nil {
		if err := d.kdev.Close(); err != nil && first == nil {
			first = errs.New(errs.Errno(err), "phxfs: close kernel device %d: %v", index, err)
		}
	}
	return first
}

// DeviceInfo describes an open device and the transport a registration on it
// gets, for diagnostics.
type DeviceInfo struct {
	connector.DeviceInfo
	Transport     Transport
	Registrations int
	Inflight      int
}

// Device reports an open device.
func (l *Lib) Device(index int) (DeviceInfo, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.devices[index]
	if d == nil {
		return DeviceInfo{}, errs.New(unix.ENODEV, "phxfs: device %d is not open", index)
	}
	t, _ := l.transportFor(d)
	return DeviceInfo{DeviceInfo: d.info, Transport: t, Registrations: len(d.regions), Inflight: d.inflight}, nil
}

// transportFor picks the transport of a new registration on d.
func (l *Lib) transportFor(d *device) (Transport, error) {
	switch {
	case l.cfg.Transport == Host && !l.conn.HostAddressable():
		return "", errs.New(unix.EINVAL, "phxfs: host transport asked for, but %s memory is not host-addressable", l.conn.Vendor())
	case l.cfg.Transport != "":
		return l.cfg.Transport, nil
	case d.kdev != nil:
		return Direct, nil
	case l.conn.HostAddressable():
		return Host, nil
	default:
		return Staged, nil
	}
}

// kernelDevice is the phxfs kernel module's view of one device: the direct
// transport maps device memory into a VMA through it.
type kernelDevice interface {
	// Map backs a new VMA with the device memory [addr, addr+size) and
	// returns the VMA's host address and how to undo it.
	Map(addr uint64, size int64) (host uintptr, unmap func() error, err error)
	Close() error
}

// openKernelDevice opens the module's device serving a connector device;
// ENODEV where the module is absent. Tests replace it.
var openKernelDevice = kernelDeviceFor

package phxfs

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
)

// device is one open phxfs device.
type device struct {
	lib   *Lib
	index int
	info  connector.DeviceInfo
	refs  int          // client references (Open calls not yet Closed)
	io    users        // I/O holding one of its registrations; closing: the last Close drains it
	regs  []*region    // by address
	kdev  kernelDevice // the kernel module's device, nil without it
	kerr  error        // why there is no kdev (the module's absence or refusal)
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
		if d.io.closing {
			return errs.New(unix.EBUSY, "phxfs: device %d is closing", index)
		}
		d.refs++
		return nil
	}
	infos, err := l.conn.Devices()
	if err != nil {
		return errs.Wrapf(err, "phxfs: list %s devices", l.conn.Vendor())
	}
	if index < 0 || index >= len(infos) {
		return errs.New(unix.ENODEV, "phxfs: no %s device %d (have %d)", l.conn.Vendor(), index, len(infos))
	}
	d := &device{lib: l, index: index, info: infos[index], refs: 1}
	if d.info.PageSize <= 0 {
		d.info.PageSize = 64 << 10
	}
	switch {
	case l.cfg.NoKernelModule:
		d.kerr = errs.New(unix.ENODEV, "the kernel module is ignored (Config.NoKernelModule)")
	case l.cfg.Transport != "" && l.cfg.Transport != Kmod:
		d.kerr = errs.New(unix.ENODEV, "transport %s asked for", l.cfg.Transport)
	default:
		d.kdev, d.kerr = openKernelDevice(l.conn.Vendor(), d.info)
		if d.kerr != nil && l.cfg.Transport == Kmod {
			return errs.Wrapf(d.kerr, "phxfs: kmod transport asked for, but")
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
	if d == nil || d.io.closing {
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
	d.io.drain(l.changed)
	regs := d.regs
	d.regs = nil
	for _, r := range regs {
		r.io.closing = true // deregistrations waiting on them find them gone
	}
	delete(l.devices, index)
	l.changed.Broadcast()
	l.mu.Unlock()

	var first error
	for _, r := range regs {
		if err := r.release(); err != nil && first == nil {
			first = err
		}
	}
	if d.kdev != nil {
		if err := d.kdev.Close(); err != nil && first == nil {
			first = errs.Wrapf(err, "phxfs: close kernel device %d", index)
		}
	}
	return first
}

// DeviceInfo describes an open device and the transport a registration on it
// gets, for diagnostics.
type DeviceInfo struct {
	connector.DeviceInfo
	Transport Transport
	// TransportWhy says why, in words fit for a log line and user.phx.info,
	// including why the kernel module is not used where it is not.
	TransportWhy  string
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
	t, why, err := l.transportFor(d)
	if err != nil {
		why = err.Error()
	}
	return DeviceInfo{DeviceInfo: d.info, Transport: t, TransportWhy: why, Registrations: len(d.regs), Inflight: d.io.n}, nil
}

// transportFor picks the transport of a new registration on d, and says why.
func (l *Lib) transportFor(d *device) (Transport, string, error) {
	if l.cfg.Transport == Host && !l.conn.HostAddressable() {
		return "", "", errs.New(unix.EINVAL, "phxfs: host transport asked for, but %s memory is not host-addressable", l.conn.Vendor())
	}
	t, why := chooseTransport(l.conn, d.info, d.kdev != nil, d.kerr)
	if l.cfg.Transport != "" && l.cfg.Transport != t {
		return l.cfg.Transport, fmt.Sprintf("transport %s asked for (the machine offers %s: %s)", l.cfg.Transport, t, why), nil
	}
	return t, why, nil
}

// chooseTransport is the fastest transport for a device of c, given
// whether the kernel module serves it (or why not), and why.
func chooseTransport(c connector.Connector, info connector.DeviceInfo, module bool, kerr error) (Transport, string) {
	switch {
	case module:
		return Kmod, fmt.Sprintf("the phxfs kernel module serves %s device %d (%s): O_DIRECT reads land in device memory by DMA", c.Vendor(), info.Index, info.PCIAddress)
	case c.HostAddressable():
		return Host, fmt.Sprintf("%s device memory is host-addressable: reads land in it directly (no kernel module: %v)", c.Vendor(), kerr)
	default:
		return Staged, fmt.Sprintf("%s memory is not host-addressable and there is no kernel module (%v): reads land in pinned bounce buffers and are copied to the device", c.Vendor(), kerr)
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

package phxfs

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/emu"
	"github.com/phxmount/phxmount/internal/errs"
)

// fakeKernel stands in for the module: Map returns the memory's own host
// address, the way the module's VMA would alias device pages.
type fakeKernel struct {
	c       connector.Connector
	dev     int
	maps    int
	unmaps  int
	closed  bool
	refused bool
}

func (k *fakeKernel) Map(addr uint64, size int64) (uintptr, func() error, error) {
	if k.refused {
		return 0, nil, unix.ENOMEM
	}
	host, err := k.c.Resolve(k.dev, addr, size)
	if err != nil {
		return 0, nil, err
	}
	k.maps++
	return host, func() error { k.unmaps++; return nil }, nil
}

func (k *fakeKernel) Close() error { k.closed = true; return nil }

// openLib makes a library on c with two workers and opens its first
// devices; it is closed when the test ends.
func openLib(t *testing.T, c connector.Connector, devices int) *Lib {
	t.Helper()
	l, err := New(Config{Connector: c, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	for i := range devices {
		if err := l.OpenDevice(i); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

func TestDirectTransportSeam(t *testing.T) {
	c, _ := emu.New(emu.Config{Devices: 2})
	kernels := map[string]*fakeKernel{}
	saved := openKernelDevice
	openKernelDevice = func(vendor string, info connector.DeviceInfo) (kernelDevice, error) {
		if info.Index == 1 {
			return nil, unix.ENODEV
		}
		k := &fakeKernel{c: c, dev: info.Index}
		kernels[info.PCIAddress] = k
		return k, nil
	}
	defer func() { openKernelDevice = saved }()

	l := openLib(t, c, 2)
	m0 := alloc(t, c, 0, 1*mib)
	m1 := alloc(t, c, 1, 1*mib)
	r0 := register(t, l, m0)
	r1 := register(t, l, m1)
	if r0.Transport() != Kmod || r1.Transport() != Host {
		t.Fatalf("transports %s and %s, want direct (module) and host (no module device)", r0.Transport(), r1.Transport())
	}
	name := patternFile(t, 1*mib)
	fd := openFile(t, name, unix.O_RDONLY|unix.O_DIRECT)
	if n, err := l.Read(fd, 0, m0.Addr(), 0, 1*mib, 0); err != nil || n != 1*mib {
		t.Fatalf("direct read: %d, %v", n, err)
	}
	checkPattern(t, deviceBytes(t, c, m0, 0, 1*mib), 0)
	k := kernels[connectorDevice(t, c, 0).PCIAddress]
	if err := l.DeregMem(0, m0.Addr(), m0.Size()); err != nil {
		t.Fatal(err)
	}
	if k.maps != 1 || k.unmaps != 1 {
		t.Fatalf("module saw %d maps and %d unmaps", k.maps, k.unmaps)
	}
	k.refused = true
	_, err := l.RegMem(0, m0.Addr(), m0.Size())
	wantErrno(t, err, unix.ENOMEM)
	if err := l.CloseDevice(0); err != nil || !k.closed {
		t.Fatalf("close: %v, module device closed %v", err, k.closed)
	}

	// The PCI mapping from a vendor ordinal to a device.
	if i, err := DeviceForPCI(c, connectorDevice(t, c, 1).PCIAddress); err != nil || i != 1 {
		t.Fatalf("DeviceForPCI: %d, %v", i, err)
	}
	_, err = DeviceForPCI(c, "0000:ff:1f.7")
	wantErrno(t, err, unix.ENODEV)

	// The module cannot map memory of a vendor it has no backend for.
	_, err = kernelDeviceFor("emu", connectorDevice(t, c, 0))
	wantErrno(t, err, unix.ENODEV)
}

// TestTransportReasonSaysWhatHappened: the reason a device's transport was
// chosen carries the module's own error (here a refused open), in Device
// and in TransportFor alike, instead of a fixed text.
func TestTransportReasonSaysWhatHappened(t *testing.T) {
	c, _ := emu.New(emu.Config{Staged: true})
	saved := openKernelDevice
	openKernelDevice = func(vendor string, info connector.DeviceInfo) (kernelDevice, error) {
		return nil, errs.New(unix.EACCES, "open /dev/phxfs_dev0")
	}
	defer func() { openKernelDevice = saved }()
	l := openLib(t, c, 1)
	d, err := l.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	tf, why := TransportFor(c, 0)
	for _, got := range []struct {
		t   Transport
		why string
	}{{d.Transport, d.TransportWhy}, {tf, why}} {
		if got.t != Staged || !strings.Contains(got.why, "open /dev/phxfs_dev0: permission denied") {
			t.Errorf("transport %s, why %q: want staged with the module's error", got.t, got.why)
		}
	}
}

// TestRegisterErrorNamesEachFactOnce: the registration's error says the
// operation, the range and the connector's reason, with the errno once
// (it used to end "bad address: bad address").
func TestRegisterErrorNamesEachFactOnce(t *testing.T) {
	c, _ := emu.New(emu.Config{})
	l := openLib(t, c, 1)
	_, err := l.RegMem(0, 0x10000, 64<<10)
	want := "phxfs: register [0x10000, +65536) on device 0: emu: 0x10000 is not device memory: bad address"
	if err == nil || err.Error() != want || !errors.Is(err, unix.EFAULT) {
		t.Errorf("RegMem of memory that is not the device's: %v\nwant %s", err, want)
	}
	var e *errs.Error
	if !errors.As(err, &e) || e.Op != "phxfs: register" {
		t.Errorf("errors.As: %+v", e)
	}
}

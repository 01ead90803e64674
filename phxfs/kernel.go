package phxfs

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/kmod"
)

// moduleDevice adapts kmod's device to the kmod transport.
type moduleDevice struct{ d *kmod.Device }

func (m moduleDevice) Map(addr uint64, size int64) (uintptr, func() error, error) {
	mp, err := m.d.Map(addr, size)
	if err != nil {
		return 0, nil, err
	}
	return mp.Host, mp.Unmap, nil
}

func (m moduleDevice) Close() error { return m.d.Close() }

// kernelDeviceIndexes lists the N of every /dev/phxfs_devN.
func kernelDeviceIndexes() []int {
	names, _ := filepath.Glob(filepath.Join(kmod.DevDir, "phxfs_dev*"))
	var out []int
	for _, n := range names {
		i, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(n), "phxfs_dev"))
		if err == nil && kmod.Available(i) {
			out = append(out, i)
		}
	}
	return out
}

// moduleBackends maps a connector vendor to the kernel backend that
// understands its device addresses: only then can the module map them.
var moduleBackends = map[string]string{"nvidia": "nvidia", "pcibar": "emu"}

// kernelDeviceFor finds the module's device for a connector device by PCI
// address (the reference's find_dev_for_cuda_gpu): a vendor's device
// ordinals need not follow the module's minors. A module device without a
// PCI address (reserved RAM) serves the connector device of the same index.
func kernelDeviceFor(vendor string, info connector.DeviceInfo) (kernelDevice, error) {
	idx := kernelDeviceIndexes()
	if len(idx) == 0 {
		return nil, errs.New(unix.ENODEV, "phxfs kernel module not loaded (no %s)", kmod.DevicePath(info.Index))
	}
	want, ok := moduleBackends[vendor]
	if !ok {
		return nil, errs.New(unix.ENODEV, "the phxfs kernel module cannot map %s device memory", vendor)
	}
	for _, i := range idx {
		pci, err := kmod.ReadAttr(i, "pci_address")
		if err != nil {
			continue
		}
		if backend, _ := kmod.ReadAttr(i, "backend"); backend != want {
			continue
		}
		if strings.EqualFold(pci, info.PCIAddress) || ((pci == "none" || pci == "") && i == info.Index) {
			d, err := kmod.Open(i)
			if err != nil {
				return nil, err
			}
			return moduleDevice{d}, nil
		}
	}
	return nil, errs.New(unix.ENODEV, "no phxfs kernel device with the %s backend serves %s (PCI %s) among %d module devices", want, info.Name, info.PCIAddress, len(idx))
}

// DeviceForPCI returns the index of the connector device at a PCI address,
// e.g. to map a CUDA ordinal's device to the phxfs device serving it.
func DeviceForPCI(c connector.Connector, pci string) (int, error) {
	infos, err := c.Devices()
	if err != nil {
		return -1, err
	}
	for _, d := range infos {
		if strings.EqualFold(d.PCIAddress, pci) {
			return d.Index, nil
		}
	}
	return -1, errs.New(unix.ENODEV, "no %s device at PCI address %s", c.Vendor(), pci)
}

// TransportFor says which transport a registration on device index of c
// would get and why, without opening anything for long: for diagnostics.
func TransportFor(c connector.Connector, index int) (Transport, string) {
	infos, err := c.Devices()
	if err != nil || index < 0 || index >= len(infos) {
		return "", fmt.Sprintf("no %s device %d", c.Vendor(), index)
	}
	kdev, kerr := openKernelDevice(c.Vendor(), infos[index])
	if kerr == nil {
		kdev.Close()
	}
	return chooseTransport(c, infos[index], kerr == nil, kerr)
}

// The lifetime checks: the module cannot be removed under a mapping, and
// the device can be unbound under one and bound again.
package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/faultsafe"
	"github.com/phxmount/phxmount/kmod"
)

// busyModule: the module cannot go while a mapping exists, even with the
// device file closed.
func busyModule(*env) error {
	before, err := kmod.ReadAttrInt(0, "registrations")
	if err != nil {
		return err
	}
	d2, err := kmod.Open(0)
	if err != nil {
		return err
	}
	mp, err := d2.Map(kmod.EmuDevAddr(0, 0), 64<<10)
	if err != nil {
		return err
	}
	// close the descriptor but keep the mapping
	if err := unix.Close(d2.Fd()); err != nil {
		return err
	}
	err = unix.DeleteModule("phxfs", unix.O_NONBLOCK)
	if err == nil {
		return errors.New("rmmod phxfs succeeded with a live mapping")
	}
	ok("rmmod refused while a mapping outlives its descriptor (%v)", err)
	b := mp.Bytes()
	_ = *(*byte)(unsafe.Pointer(&b[0]))
	if err := unix.Munmap(b); err != nil {
		return err
	}
	if n, _ := kmod.ReadAttrInt(0, "registrations"); n != before {
		return fmt.Errorf("registrations %d after munmap without UNMAP, %d before", n, before)
	}
	ok("munmap without UNMAP releases the registration (vm_ops close)")
	return nil
}

// unbind: the device goes away (PCI unbind) under a live mapping: its PTEs
// are zapped and access faults, the old descriptor refuses new mappings
// with ENODEV, UNMAP still releases; binding again brings phxfs_dev0 back
// over the same bytes.
func unbind(*env) error {
	const drv = "/sys/bus/pci/drivers/phxfs_emu/"
	d, err := kmod.Open(0)
	if err != nil {
		return err
	}
	defer d.Close()
	pci, err := d.PCIAddress()
	if err != nil {
		return err
	}
	mp, err := d.Map(kmod.EmuDevAddr(0, 0), 1<<20)
	if err != nil {
		return err
	}
	first := binary.LittleEndian.Uint64(mp.Bytes())
	if err := os.WriteFile(drv+"unbind", []byte(pci), 0); err != nil {
		return fmt.Errorf("unbind %s: %w", pci, err)
	}
	if kmod.Available(0) {
		return errors.New("/dev/phxfs_dev0 still there after unbind")
	}
	b := mp.Bytes()
	if err := faultsafe.Copy("unbound device", b, make([]byte, 1), b[4096:4097]); !errors.Is(err, unix.EFAULT) {
		return fmt.Errorf("access to a mapping of an unbound device: %v, want a fault", err)
	}
	ok("PCI unbind under a live mapping: PTEs zapped, access faults")
	if _, err := d.Map(kmod.EmuDevAddr(0, 0), 64<<10); !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("Map on an unbound device: %v, want ENODEV", err)
	}
	if err := mp.Unmap(); err != nil {
		return fmt.Errorf("Unmap on an unbound device: %w", err)
	}
	ok("after unbind: new mappings fail with ENODEV, UNMAP releases")
	if err := os.WriteFile(drv+"bind", []byte(pci), 0); err != nil {
		return fmt.Errorf("bind %s: %w", pci, err)
	}
	for i := 0; !kmod.Available(0); i++ {
		if i == 100 {
			return errors.New("/dev/phxfs_dev0 did not come back after bind")
		}
		time.Sleep(20 * time.Millisecond)
	}
	d2, err := kmod.Open(0)
	if err != nil {
		return err
	}
	defer d2.Close()
	mp2, err := d2.Map(kmod.EmuDevAddr(0, 0), 64<<10)
	if err != nil {
		return err
	}
	if got := binary.LittleEndian.Uint64(mp2.Bytes()); got != first {
		return fmt.Errorf("after rebind the BAR starts with %#x, was %#x", got, first)
	}
	ok("rebind: phxfs_dev0 back over the same device memory")
	return mp2.Unmap()
}

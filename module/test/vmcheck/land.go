// The landing checks: file bytes land in device pages by O_DIRECT pread
// and io_uring, past 2 GiB of the BAR and in reserved RAM, and device
// pages are written back to a file.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/ioengine"
	"github.com/phxmount/phxmount/kmod"
)

// landSync: O_DIRECT pread from the NVMe file straight into device pages.
func landSync(e *env) error {
	const size = 8 << 20
	const fileOff = 1 << 20
	m, mp, err := e.mapAlloc(size)
	if err != nil {
		return err
	}
	scribble(mp.Bytes())
	n, err := unix.Pread(e.fd, mp.Bytes(), fileOff)
	if err != nil || n != size {
		return fmt.Errorf("O_DIRECT pread into device pages: %d, %v", n, err)
	}
	if err := e.checkBoth(mp, 0, fileOff, size, "pread"); err != nil {
		return err
	}
	ok("O_DIRECT pread landed %d MiB from NVMe in device pages at BAR offset %#x", size>>20, m.Offset())
	landed(m.Offset(), fileOff, size)
	// m stays allocated: the host checks these bytes after the VM stops
	return mp.Unmap()
}

// landUring: io_uring reads, 1 MiB each, in reverse file order.
func landUring(e *env) error {
	const size = 16 << 20
	const chunk = 1 << 20
	const fileOff = 32 << 20
	eng, err := ioengine.New(ioengine.KindIOUring, 64)
	if err != nil {
		return fmt.Errorf("io_uring engine: %w", err)
	}
	defer eng.Close()
	m, mp, err := e.mapAlloc(size)
	if err != nil {
		return err
	}
	scribble(mp.Bytes())
	var ops []ioengine.Op
	for i := int64(0); i < size/chunk; i++ {
		ops = append(ops, ioengine.Op{
			Fd:   e.fd,
			Addr: mp.Host + uintptr(size-chunk-i*chunk),
			Len:  chunk,
			Off:  fileOff + i*chunk,
		})
	}
	if err := eng.Run(ops); err != nil {
		return err
	}
	for i, op := range ops {
		if op.Result != chunk {
			return fmt.Errorf("io_uring op %d: result %d", i, op.Result)
		}
		memOff := int64(op.Addr - mp.Host)
		if err := e.checkBoth(mp, memOff, op.Off, chunk, fmt.Sprintf("io_uring op %d", i)); err != nil {
			return err
		}
		landed(m.Offset()+memOff, op.Off, chunk)
	}
	ok("%s engine landed %d reads (%d MiB) from NVMe in device pages", eng.Name(), len(ops), size>>20)
	return mp.Unmap() // m stays allocated, as above
}

// landBeyond2G maps the whole BAR in one registration (past the 2 GiB and
// 4 GiB marks of the original module's descriptors) and reads into its end.
func landBeyond2G(e *env) error {
	devs, _ := e.conn.Devices()
	bar := devs[0].MemoryBytes
	if bar <= 2<<30 {
		ok("BAR of %d MiB: registration past 2 GiB not tried", bar>>20)
		return nil
	}
	before, err := kmod.ReadAttrInt(0, "registrations")
	if err != nil {
		return err
	}
	mp, err := e.dev.Map(kmod.EmuDevAddr(0, 0), bar)
	if err != nil {
		return fmt.Errorf("one registration of the whole %d MiB BAR: %w", bar>>20, err)
	}
	if n, _ := kmod.ReadAttrInt(0, "mapped_bytes"); n < bar {
		return fmt.Errorf("mapped_bytes %d after mapping %d", n, bar)
	}
	ok("one registration of %d MiB (the whole BAR)", bar>>20)
	const n = 4 << 20
	const fileOff = 60 << 20
	memOff := bar - n - 64<<10
	got, err := unix.Pread(e.fd, mp.Bytes()[memOff:memOff+n], fileOff)
	if err != nil || got != n {
		return fmt.Errorf("pread at BAR offset %#x: %d, %v", memOff, got, err)
	}
	if err := e.checkBoth(mp, memOff, fileOff, n, "pread past 2 GiB"); err != nil {
		return err
	}
	ok("O_DIRECT pread landed %d MiB at BAR offset %#x (past 2 GiB)", n>>20, memOff)
	landed(memOff, fileOff, n)
	if err := mp.Unmap(); err != nil {
		return err
	}
	after, err := kmod.ReadAttrInt(0, "registrations")
	if err != nil {
		return err
	}
	if after != before {
		return fmt.Errorf("registrations %d after unmap, %d before", after, before)
	}
	ok("registration released on UNMAP (registrations back to %d)", after)
	return nil
}

// writeBack: O_DIRECT pwrite from device pages to a file, read back.
func writeBack(e *env) error {
	const size = 2 << 20
	m, mp, err := e.mapAlloc(size)
	if err != nil {
		return err
	}
	want := make([]byte, size)
	patternAt(want, 7<<30)
	s, err := e.conn.NewStream(0)
	if err != nil {
		return err
	}
	if err := s.CopyToDevice(m.Addr(), want); err != nil {
		return err
	}
	if err := s.Synchronize(); err != nil {
		return err
	}
	s.Close()
	path := filepath.Join(e.scratch, "writeback.bin")
	wfd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	n, err := unix.Pwrite(wfd, mp.Bytes(), 0)
	unix.Close(wfd)
	if err != nil || n != size {
		return fmt.Errorf("O_DIRECT pwrite from device pages: %d, %v", n, err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return errors.New("file written from device pages differs")
	}
	ok("O_DIRECT pwrite stored %d MiB from device pages on NVMe", size>>20)
	if err := mp.Unmap(); err != nil {
		return err
	}
	return m.Close()
}

// reservedRAM: device 1 is reserved RAM (emu_ram=): O_DIRECT lands there
// too, checked through the module mapping (no host view of guest RAM).
func reservedRAM(e *env) error {
	if !kmod.Available(1) {
		ok("no reserved-RAM device: skipped")
		return nil
	}
	d, err := kmod.Open(1)
	if err != nil {
		return err
	}
	defer d.Close()
	if _, err := d.PCIAddress(); !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("PCIAddress of reserved RAM: %v, want ENODEV", err)
	}
	size, err := kmod.ReadAttrInt(1, "mem_size")
	if err != nil {
		return err
	}
	const n = 2 << 20
	const fileOff = 5 << 20
	mp, err := d.Map(kmod.EmuDevAddr(1, uint64(size-n)), n)
	if err != nil {
		return err
	}
	scribble(mp.Bytes())
	if got, err := unix.Pread(e.fd, mp.Bytes(), fileOff); err != nil || got != n {
		return fmt.Errorf("O_DIRECT pread into reserved RAM: %d, %v", got, err)
	}
	if err := checkPattern(mp.Bytes(), fileOff, "reserved RAM"); err != nil {
		return err
	}
	if _, err := d.Map(kmod.EmuDevAddr(0, 0), 64<<10); !errors.Is(err, unix.ERANGE) {
		return fmt.Errorf("device 0 address on device 1: %v, want ERANGE", err)
	}
	ok("reserved-RAM device: O_DIRECT pread landed %d MiB at its end", n>>20)
	return mp.Unmap()
}

// Command vmcheck lands file bytes from the VM's NVMe disk in the phxfs
// device pages of an ivshmem BAR, and checks them from both sides.
//
//	vmcheck pattern FILE SIZE            write the test file (host)
//	vmcheck verify SHMFILE BAROFF FILEOFF LEN
//	                                     check landed bytes in the BAR's
//	                                     backing file (host, after the VM)
//	vmcheck run FILE SCRATCHDIR          the in-VM checks
//
// The test file's every 8-byte little-endian word is its own offset. "run"
// prints "check ok: ..." per check and "PHXFS-LANDED BAROFF FILEOFF LEN"
// per range left in the BAR for the host to verify; it exits non-zero on
// the first failure. drain.go holds the checks that phxfs waits for
// holders of a registration's pages (UNMAP, munmap, revocation) without
// holding its locks.
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"phxmount/connector"
	"phxmount/connector/pcibar"
	"phxmount/ioengine"
	"phxmount/kmod"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "pattern":
		if len(os.Args) != 4 {
			usage()
		}
		err = writePattern(os.Args[2], parseInt(os.Args[3]))
	case "verify":
		if len(os.Args) != 6 {
			usage()
		}
		err = verifyShm(os.Args[2], parseInt(os.Args[3]), parseInt(os.Args[4]), parseInt(os.Args[5]))
	case "run":
		if len(os.Args) != 4 {
			usage()
		}
		err = run(os.Args[2], os.Args[3])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmcheck %s: FAIL: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: vmcheck pattern FILE SIZE | verify SHMFILE BAROFF FILEOFF LEN | run FILE SCRATCHDIR")
	os.Exit(2)
}

func parseInt(s string) int64 {
	v, err := strconv.ParseInt(s, 0, 64)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmcheck: bad number %q\n", s)
		os.Exit(2)
	}
	return v
}

// patternAt fills b with the test pattern as found at file offset off
// (off 8-byte aligned).
func patternAt(b []byte, off int64) {
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(off)+uint64(i))
	}
}

// checkPattern returns an error naming the first word of b that is not
// the pattern at file offset off.
func checkPattern(b []byte, off int64, what string) error {
	for i := 0; i+8 <= len(b); i += 8 {
		if got := binary.LittleEndian.Uint64(b[i:]); got != uint64(off)+uint64(i) {
			return fmt.Errorf("%s: word at +%#x is %#x, want %#x", what, i, got, uint64(off)+uint64(i))
		}
	}
	return nil
}

func writePattern(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		n := min(int64(len(buf)), size-off)
		patternAt(buf[:n], off)
		if _, err := w.Write(buf[:n]); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func verifyShm(path string, barOff, fileOff, n int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, barOff); err != nil {
		return err
	}
	return checkPattern(b, fileOff, fmt.Sprintf("%s at %#x", path, barOff))
}

// --- in the VM --------------------------------------------------------------

var checks int

func ok(format string, args ...any) {
	checks++
	fmt.Printf("check ok: "+format+"\n", args...)
}

func landed(barOff, fileOff, n int64) {
	fmt.Printf("PHXFS-LANDED %d %d %d\n", barOff, fileOff, n)
}

func run(file, scratch string) error {
	if !kmod.Available(0) {
		return errors.New("kmod: /dev/phxfs_dev0 not available")
	}
	conn, err := pcibar.New(pcibar.Config{})
	if err != nil {
		return err
	}
	defer conn.Close()
	devs, err := conn.Devices()
	if err != nil {
		return err
	}
	dev, err := kmod.Open(0)
	if err != nil {
		return err
	}
	defer dev.Close()
	pci, err := dev.PCIAddress()
	if err != nil {
		return err
	}
	if pci != devs[0].PCIAddress {
		return fmt.Errorf("phxfs_dev0 is %s, pcibar device 0 is %s", pci, devs[0].PCIAddress)
	}
	ok("phxfs_dev0 is the ivshmem device %s, BAR of %d MiB", pci, devs[0].MemoryBytes>>20)
	view, why, err := conn.ViewKind(0)
	if err != nil {
		return err
	}
	ok("pcibar streams reach the BAR through the %q view %s", view, why)

	fd, err := unix.Open(file, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s O_DIRECT: %w", file, err)
	}
	defer unix.Close(fd)

	steps := []func(*pcibar.Connector, *kmod.Device, int) error{
		landSync, landUring, landBeyond2G,
	}
	for _, step := range steps {
		if err := step(conn, dev, fd); err != nil {
			return err
		}
	}
	if err := writeBack(conn, dev, scratch); err != nil {
		return err
	}
	if err := revoke(conn, dev, fd); err != nil {
		return err
	}
	if err := drainChecks(conn, dev, fd); err != nil {
		return err
	}
	if err := busyModule(conn, dev); err != nil {
		return err
	}
	if err := reservedRAM(fd); err != nil {
		return err
	}
	if err := unbind(); err != nil {
		return err
	}
	fmt.Printf("vmcheck: %d checks passed\n", checks)
	return nil
}

// mapAlloc allocates size bytes of BAR and maps them through the module.
func mapAlloc(conn *pcibar.Connector, dev *kmod.Device, size int64) (*pcibar.Memory, *kmod.Mapping, error) {
	m, err := conn.Alloc(0, size)
	if err != nil {
		return nil, nil, err
	}
	mp, err := dev.Map(m.Addr(), size)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return m.(*pcibar.Memory), mp, nil
}

// checkBoth checks the pattern in device memory through the module
// mapping (CPU) and through a pcibar stream (the BAR view).
func checkBoth(conn connector.Connector, mp *kmod.Mapping, memOff, fileOff, n int64, what string) error {
	if err := checkPattern(mp.Bytes()[memOff:memOff+n], fileOff, what+" (module mapping)"); err != nil {
		return err
	}
	s, err := conn.NewStream(0)
	if err != nil {
		return err
	}
	defer s.Close()
	b := make([]byte, n)
	if err := s.CopyFromDevice(b, mp.DevAddr+uint64(memOff)); err != nil {
		return err
	}
	if err := s.Synchronize(); err != nil {
		return err
	}
	return checkPattern(b, fileOff, what+" (BAR view)")
}

func scribble(b []byte) {
	for i := range b {
		b[i] = 0xa5
	}
}

// landSync: O_DIRECT pread from the NVMe file straight into device pages.
func landSync(conn *pcibar.Connector, dev *kmod.Device, fd int) error {
	const size = 8 << 20
	const fileOff = 1 << 20
	m, mp, err := mapAlloc(conn, dev, size)
	if err != nil {
		return err
	}
	scribble(mp.Bytes())
	n, err := unix.Pread(fd, mp.Bytes(), fileOff)
	if err != nil || n != size {
		return fmt.Errorf("O_DIRECT pread into device pages: %d, %v", n, err)
	}
	if err := checkBoth(conn, mp, 0, fileOff, size, "pread"); err != nil {
		return err
	}
	ok("O_DIRECT pread landed %d MiB from NVMe in device pages at BAR offset %#x", size>>20, m.Offset())
	landed(m.Offset(), fileOff, size)
	// m stays allocated: the host checks these bytes after the VM stops
	return mp.Unmap()
}

// landUring: io_uring reads, 1 MiB each, in reverse file order.
func landUring(conn *pcibar.Connector, dev *kmod.Device, fd int) error {
	const size = 16 << 20
	const chunk = 1 << 20
	const fileOff = 32 << 20
	e, err := ioengine.New(ioengine.KindIOUring, 64)
	if err != nil {
		return fmt.Errorf("io_uring engine: %w", err)
	}
	defer e.Close()
	m, mp, err := mapAlloc(conn, dev, size)
	if err != nil {
		return err
	}
	scribble(mp.Bytes())
	var ops []ioengine.Op
	for i := int64(0); i < size/chunk; i++ {
		ops = append(ops, ioengine.Op{
			Fd:   fd,
			Addr: mp.Host + uintptr(size-chunk-i*chunk),
			Len:  chunk,
			Off:  fileOff + i*chunk,
		})
	}
	if err := e.Run(ops); err != nil {
		return err
	}
	for i, op := range ops {
		if op.Result != chunk {
			return fmt.Errorf("io_uring op %d: result %d", i, op.Result)
		}
		memOff := int64(op.Addr - mp.Host)
		if err := checkBoth(conn, mp, memOff, op.Off, chunk, fmt.Sprintf("io_uring op %d", i)); err != nil {
			return err
		}
		landed(m.Offset()+memOff, op.Off, chunk)
	}
	ok("%s engine landed %d reads (%d MiB) from NVMe in device pages", e.Name(), len(ops), size>>20)
	return mp.Unmap() // m stays allocated, as above
}

// landBeyond2G maps the whole BAR in one registration (past the 2 GiB and
// 4 GiB marks of the original module's descriptors) and reads into its end.
func landBeyond2G(conn *pcibar.Connector, dev *kmod.Device, fd int) error {
	devs, _ := conn.Devices()
	bar := devs[0].MemoryBytes
	if bar <= 2<<30 {
		ok("BAR of %d MiB: registration past 2 GiB not tried", bar>>20)
		return nil
	}
	before, err := kmod.ReadAttrInt(0, "registrations")
	if err != nil {
		return err
	}
	mp, err := dev.Map(kmod.EmuDevAddr(0, 0), bar)
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
	got, err := unix.Pread(fd, mp.Bytes()[memOff:memOff+n], fileOff)
	if err != nil || got != n {
		return fmt.Errorf("pread at BAR offset %#x: %d, %v", memOff, got, err)
	}
	if err := checkBoth(conn, mp, memOff, fileOff, n, "pread past 2 GiB"); err != nil {
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
func writeBack(conn *pcibar.Connector, dev *kmod.Device, scratch string) error {
	const size = 2 << 20
	m, mp, err := mapAlloc(conn, dev, size)
	if err != nil {
		return err
	}
	want := make([]byte, size)
	patternAt(want, 7<<30)
	s, err := conn.NewStream(0)
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
	path := filepath.Join(scratch, "writeback.bin")
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

// revoke: the vendor takes the memory back (the emu backend's test hook
// runs the free-callback path): PTEs zapped, I/O into it fails, UNMAP
// still cleans up.
func revoke(conn *pcibar.Connector, dev *kmod.Device, fd int) error {
	const size = 1 << 20
	before, err := kmod.ReadAttrInt(0, "registrations")
	if err != nil {
		return err
	}
	m, mp, err := mapAlloc(conn, dev, size)
	if err != nil {
		return err
	}
	hook := kmod.SysfsDir(0) + "/revoke"
	if err := os.WriteFile(hook, []byte(fmt.Sprintf("%#x %#x", m.Addr(), size)), 0); err != nil {
		return err
	}
	if _, err := unix.Pread(fd, mp.Bytes(), 0); !errors.Is(err, unix.EFAULT) {
		return fmt.Errorf("O_DIRECT pread into revoked registration: %v, want EFAULT", err)
	}
	ok("I/O into a revoked registration fails with EFAULT")
	if !smapsHas(mp.Host, "mm", "dc", "de", "dd") {
		return errors.New("smaps VmFlags of the mapping lack mm dc de dd")
	}
	ok("the VMA is VM_MIXEDMAP, VM_DONTCOPY, VM_DONTEXPAND, VM_DONTDUMP")
	if err := mp.Unmap(); err != nil {
		return fmt.Errorf("UNMAP of a revoked registration: %w", err)
	}
	if n, _ := kmod.ReadAttrInt(0, "registrations"); n != before {
		return fmt.Errorf("registrations %d after UNMAP of the revoked one, %d before", n, before)
	}
	ok("UNMAP of a revoked registration releases it")
	return m.Close()
}

// smapsHas reports whether the VMA at addr has every VmFlags flag.
func smapsHas(addr uintptr, flags ...string) bool {
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return false
	}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			r := strings.SplitN(f[0], "-", 2)
			lo, _ := strconv.ParseUint(r[0], 16, 64)
			hi, _ := strconv.ParseUint(r[1], 16, 64)
			in = uint64(addr) >= lo && uint64(addr) < hi
			continue
		}
		if in && len(f) > 0 && f[0] == "VmFlags:" {
			have := map[string]bool{}
			for _, x := range f[1:] {
				have[x] = true
			}
			for _, x := range flags {
				if !have[x] {
					return false
				}
			}
			return true
		}
	}
	return false
}

// busyModule: the module cannot go while a mapping exists, even with the
// device file closed.
func busyModule(conn *pcibar.Connector, dev *kmod.Device) error {
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

var sink byte

// faults reports whether fn faulted (SIGBUS/SIGSEGV on a mapping).
func faults(fn func()) (faulted bool) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if recover() != nil {
			faulted = true
		}
	}()
	fn()
	return false
}

// unbind: the device goes away (PCI unbind) under a live mapping: its PTEs
// are zapped and access faults, the old descriptor refuses new mappings
// with ENODEV, UNMAP still releases; binding again brings phxfs_dev0 back
// over the same bytes.
func unbind() error {
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
	if !faults(func() { sink = mp.Bytes()[4096] }) {
		return errors.New("access to a mapping of an unbound device did not fault")
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

// reservedRAM: device 1 is reserved RAM (emu_ram=): O_DIRECT lands there
// too, checked through the module mapping (no host view of guest RAM).
func reservedRAM(fd int) error {
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
	if got, err := unix.Pread(fd, mp.Bytes(), fileOff); err != nil || got != n {
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

// Command vmclient is the application side of the module-test VM's
// phxmount step: a process separate from the daemon that drives the
// GPU-direct ioctl path of a `phxmount --vendor pcibar` mount.
//
//	vmclient MOUNTPOINT FILE
//
// FILE is the offset-pattern file (every 8-byte little-endian word is its
// own offset) as seen through the mount. vmclient allocates a range of the
// ivshmem BAR with connector/pcibar, exports it, REGISTERs it through the
// mount, lands file bytes in it with READ and BATCH_READ (O_DIRECT: NVMe
// DMA into the BAR through the daemon's module mapping), checks every byte
// of the range (and a guard past the registration) through the BAR view,
// DEREGISTERs it and checks that the module's registrations are back.
// It prints "check ok: ..." per check and "PHXFS-LANDED BAROFF FILEOFF LEN"
// per range left in the BAR for the host to verify after the VM stops (the
// format of vmcheck); it exits non-zero on the first failure.
package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/pcibar"
	"github.com/phxmount/phxmount/kmod"
)

const (
	mib = 1 << 20
	kib = 1 << 10

	bufSize = 8 * mib         // the registration
	guard   = 64 * kib        // allocated past it, never registered
	fill    = byte(0xa5)      // what the range holds before any read
	fileLen = int64(64 * mib) // pattern.bin (module/test/run-vm.sh)
)

// nfs: the mount's backing directory is an NFS mount (80-nfs.sh): INFO
// says so, and O_DIRECT on NFS takes any offset.
var nfs bool

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--nfs" {
		nfs, args = true, args[1:]
	}
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: vmclient [--nfs] MOUNTPOINT FILE")
		os.Exit(2)
	}
	if err := run(args[0], args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "vmclient: FAIL: %v\n", err)
		os.Exit(1)
	}
}

var checks int

func ok(format string, args ...any) {
	checks++
	fmt.Printf("check ok: "+format+"\n", args...)
}

// patternAt fills b with the test pattern as found at file offset off
// (off 8-byte aligned).
func patternAt(b []byte, off int64) {
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(off)+uint64(i))
	}
}

// client state shared by the steps
type vm struct {
	conn   *pcibar.Connector
	stream connector.Stream
	mem    *pcibar.Memory
	want   []byte // what the BAR range [0, bufSize+guard) must hold
	landed [][3]int64
	// past the end of the file in a short O_DIRECT read: the kernel may
	// zero the buffer there (iomap maps it as a hole, then clamps the
	// result to i_size), so these bytes hold 0 or the fill
	pastEOF [][2]int64
}

// expect records that [bufOff, bufOff+n) received file bytes from fileOff.
func (v *vm) expect(bufOff, fileOff, n int64) {
	patternAt(v.want[bufOff:bufOff+n], fileOff)
	v.landed = append(v.landed, [3]int64{v.mem.Offset() + bufOff, fileOff, n})
}

// verify reads the whole range (registration and guard) through the BAR
// view and compares it with what must be there: the landed file bytes,
// the fill pattern everywhere else.
func (v *vm) verify(what string) error {
	got := make([]byte, len(v.want))
	if err := v.stream.CopyFromDevice(got, v.mem.Addr()); err != nil {
		return err
	}
	if err := v.stream.Synchronize(); err != nil {
		return err
	}
	for _, r := range v.pastEOF {
		for i := r[0]; i < r[1]; i++ {
			if got[i] != 0 && got[i] != fill {
				return fmt.Errorf("%s: BAR byte at +%#x, past the end of the file in a short read, is %#x (want 0 or %#x)", what, i, got[i], fill)
			}
		}
		copy(v.want[r[0]:r[1]], got[r[0]:r[1]])
	}
	if i := firstDiff(got, v.want); i >= 0 {
		j := i &^ 7
		return fmt.Errorf("%s: BAR byte at +%#x (BAR offset %#x) is %#x, want %#x (word %#x, want %#x)",
			what, i, v.mem.Offset()+int64(i), got[i], v.want[i],
			binary.LittleEndian.Uint64(got[j:]), binary.LittleEndian.Uint64(v.want[j:]))
	}
	return nil
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

func regs() (n, mapped int64, err error) {
	if n, err = kmod.ReadAttrInt(0, "registrations"); err != nil {
		return
	}
	mapped, err = kmod.ReadAttrInt(0, "mapped_bytes")
	return
}

func run(mnt, file string) error {
	if !kmod.Available(0) {
		return errors.New("/dev/phxfs_dev0 not available")
	}
	conn, err := pcibar.New(pcibar.Config{})
	if err != nil {
		return err
	}
	devs, err := conn.Devices()
	if err != nil {
		return err
	}
	bar := devs[0].MemoryBytes

	// INFO on the mount root and on the file: the kmod transport.
	root, err := client.Open(mnt)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := checkRootInfo(root, mnt, devs[0].PCIAddress); err != nil {
		return err
	}
	f, err := client.OpenFile(file, unix.O_RDONLY|unix.O_DIRECT)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := checkFileInfo(f, file); err != nil {
		return err
	}

	// The BAR range: skip the first half of the BAR, where vmcheck left
	// ranges for the host to check (pcibar allocation is per process).
	pad, err := conn.Alloc(0, (bar/2)&^(pcibar.PageSize-1))
	if err != nil {
		return err
	}
	defer pad.Close()
	m, err := conn.Alloc(0, bufSize+guard)
	if err != nil {
		return err
	}
	v := &vm{conn: conn, mem: m.(*pcibar.Memory), want: bytes.Repeat([]byte{fill}, bufSize+guard)}
	defer m.Close()
	if v.stream, err = conn.NewStream(0); err != nil {
		return err
	}
	defer v.stream.Close()
	h, err := v.fillAndExport()
	if err != nil {
		return err
	}

	buf, n0, mapped0, err := register(f, h)
	if err != nil {
		return err
	}
	if err := readOne(v, f, buf); err != nil {
		return err
	}
	if err := readBatch(v, f, buf); err != nil {
		return err
	}
	if err := readBuffered(v, file, buf); err != nil {
		return err
	}
	if err := v.checkCounters(f); err != nil {
		return err
	}
	if err := v.deregister(f, buf, n0, mapped0); err != nil {
		return err
	}
	return v.leaveLanded(pad)
}

func checkRootInfo(root *client.File, mnt, pci string) error {
	info, err := root.Info()
	if err != nil {
		return fmt.Errorf("INFO on %s: %w", mnt, err)
	}
	if info.Transport != client.TransportKmod || info.Vendor != pcibar.Vendor || info.PCIAddress != pci {
		return fmt.Errorf("INFO on %s: transport %s, vendor %q, PCI %q; want direct, pcibar, %s",
			mnt, info.Transport, info.Vendor, info.PCIAddress, pci)
	}
	ok("INFO on the mount root: transport kmod, vendor pcibar, device %s (%s), engine %s",
		info.PCIAddress, info.DeviceName, info.Engine)
	return nil
}

func checkFileInfo(f *client.File, file string) error {
	info, err := f.Info()
	if err != nil {
		return fmt.Errorf("INFO on %s: %w", file, err)
	}
	alignOK := info.DIOOffsetAlign > 0 && info.DIOOffsetAlign <= 4096
	if nfs {
		alignOK = info.DIOOffsetAlign <= 4096 // NFS may not report one
	}
	if info.Transport != client.TransportKmod || !alignOK {
		return fmt.Errorf("INFO on %s: transport %s, dio_offset_align %d; want direct and a block size",
			file, info.Transport, info.DIOOffsetAlign)
	}
	ok("INFO on %s: transport kmod, O_DIRECT alignment %d/%d", filepath.Base(file), info.DIOMemAlign, info.DIOOffsetAlign)
	// The cache field (offset 52) and the network flag: a local ext4 disk
	// is watched; NFS is shared with other machines, so it is revalidated.
	wantCache, wantNet := client.CacheWatch, false
	if nfs {
		wantCache, wantNet = client.CacheRevalidate, true
	}
	if info.Cache != wantCache || info.NetworkBacking() != wantNet {
		return fmt.Errorf("INFO on %s: cache %s, network backing %v; want %s, %v", file, info.Cache, info.NetworkBacking(), wantCache, wantNet)
	}
	ok("INFO on %s: cache %s, network backing %v", filepath.Base(file), info.Cache, wantNet)
	return nil
}

// fillAndExport writes the fill over the whole range, checks it through
// the BAR view and exports the range for REGISTER.
func (v *vm) fillAndExport() (connector.Handle, error) {
	if err := v.stream.CopyToDevice(v.mem.Addr(), v.want); err != nil {
		return connector.Handle{}, err
	}
	if err := v.verify("fill"); err != nil {
		return connector.Handle{}, err
	}
	h, err := v.mem.Export()
	if err != nil {
		return connector.Handle{}, err
	}
	ok("allocated %d MiB + %d KiB guard at BAR offset %#x, exported", bufSize/mib, guard/kib, v.mem.Offset())
	return h, nil
}

// register REGISTERs the range through the mount and checks that the
// daemon mapped it through the module; n0 and mapped0 are the module's
// registrations before, for the check after DEREGISTER.
func register(f *client.File, h connector.Handle) (buf client.Buffer, n0, mapped0 int64, err error) {
	if n0, mapped0, err = regs(); err != nil {
		return buf, 0, 0, err
	}
	if buf, err = f.Register(client.VendorPCIBar, 0, h, bufSize); err != nil {
		return buf, 0, 0, fmt.Errorf("REGISTER: %w", err)
	}
	if buf.Transport != client.TransportKmod {
		return buf, 0, 0, fmt.Errorf("REGISTER: transport %s, want direct", buf.Transport)
	}
	n1, mapped1, err := regs()
	if err != nil {
		return buf, 0, 0, err
	}
	if n1 != n0+1 || mapped1 != mapped0+bufSize {
		return buf, 0, 0, fmt.Errorf("module after REGISTER: registrations %d -> %d, mapped_bytes %d -> %d; want +1, +%d",
			n0, n1, mapped0, mapped1, bufSize)
	}
	ok("REGISTER through the mount: buffer %d, transport kmod; the daemon mapped it through phxfs_dev0 (registrations %d, mapped_bytes +%d)",
		buf.ID, n1, bufSize)
	return buf, n0, mapped0, nil
}

// checkCounters checks the daemon's INFO counters against what landed.
func (v *vm) checkCounters(f *client.File) error {
	info, err := f.Info()
	if err != nil {
		return err
	}
	var moved int64
	for _, l := range v.landed {
		moved += l[2]
	}
	if info.Counters.BuffersLive != 1 || info.Counters.IoctlBytesRead != uint64(moved) {
		return fmt.Errorf("INFO counters: %d buffers live, %d ioctl bytes read; want 1, %d",
			info.Counters.BuffersLive, info.Counters.IoctlBytesRead, moved)
	}
	ok("INFO counters: 1 buffer live, %d ioctl bytes read, %d failed extents", moved, info.Counters.IoctlFailedExtents)
	return nil
}

// deregister DEREGISTERs buf, checks that it is gone and that the module's
// registrations are back to n0 and mapped0, and that the range is intact.
func (v *vm) deregister(f *client.File, buf client.Buffer, n0, mapped0 int64) error {
	if err := f.Deregister(buf); err != nil {
		return fmt.Errorf("DEREGISTER: %w", err)
	}
	if err := f.Deregister(buf); !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("second DEREGISTER: %v, want ENOENT", err)
	}
	if _, err := f.Read(buf, 0, 4096, 0); !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("READ into a deregistered buffer: %v, want ENOENT", err)
	}
	if n, mapped, err := regs(); err != nil || n != n0 || mapped != mapped0 {
		return fmt.Errorf("module after DEREGISTER: registrations %d, mapped_bytes %d (%v); want %d, %d", n, mapped, err, n0, mapped0)
	}
	ok("DEREGISTER: the daemon unmapped it (registrations %d, mapped_bytes back to %d); then ENOENT", n0, mapped0)
	return v.verify("after DEREGISTER")
}

// leaveLanded prints the landed ranges for the host and lets go of the
// range, pad and connector: the bytes stay in the BAR for the host, only
// the bookkeeping goes.
func (v *vm) leaveLanded(pad connector.Memory) error {
	for _, l := range v.landed {
		fmt.Printf("PHXFS-LANDED %d %d %d\n", l[0], l[1], l[2])
	}
	if err := v.stream.Close(); err != nil {
		return err
	}
	v.stream = nil
	if err := v.mem.Close(); err != nil {
		return err
	}
	if err := pad.Close(); err != nil {
		return err
	}
	if err := v.conn.Close(); err != nil {
		return err
	}
	fmt.Printf("vmclient: %d checks passed, %d ranges landed through the mount\n", checks, len(v.landed))
	return nil
}

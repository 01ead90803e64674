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

	"phxmount/client"
	"phxmount/connector"
	"phxmount/connector/pcibar"
	"phxmount/kmod"
)

const (
	mib = 1 << 20
	kib = 1 << 10

	bufSize = 8 * mib         // the registration
	guard   = 64 * kib        // allocated past it, never registered
	fill    = byte(0xa5)      // what the range holds before any read
	fileLen = int64(64 * mib) // pattern.bin (module/test/run-vm.sh)
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: vmclient MOUNTPOINT FILE")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
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
	info, err := root.Info()
	if err != nil {
		return fmt.Errorf("INFO on %s: %w", mnt, err)
	}
	if info.Transport != client.TransportKmod || info.Vendor != pcibar.Vendor || info.PCIAddress != devs[0].PCIAddress {
		return fmt.Errorf("INFO on %s: transport %s, vendor %q, PCI %q; want direct, pcibar, %s",
			mnt, info.Transport, info.Vendor, info.PCIAddress, devs[0].PCIAddress)
	}
	ok("INFO on the mount root: transport kmod, vendor pcibar, device %s (%s), engine %s",
		info.PCIAddress, info.DeviceName, info.Engine)
	f, err := client.OpenFile(file, unix.O_RDONLY|unix.O_DIRECT)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err = f.Info()
	if err != nil {
		return fmt.Errorf("INFO on %s: %w", file, err)
	}
	if info.Transport != client.TransportKmod || info.DIOOffsetAlign == 0 || info.DIOOffsetAlign > 4096 {
		return fmt.Errorf("INFO on %s: transport %s, dio_offset_align %d; want direct and a block size",
			file, info.Transport, info.DIOOffsetAlign)
	}
	ok("INFO on %s: transport kmod, O_DIRECT alignment %d/%d", filepath.Base(file), info.DIOMemAlign, info.DIOOffsetAlign)

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
	if err := v.stream.CopyToDevice(m.Addr(), v.want); err != nil {
		return err
	}
	if err := v.verify("fill"); err != nil {
		return err
	}
	h, err := m.Export()
	if err != nil {
		return err
	}
	ok("allocated %d MiB + %d KiB guard at BAR offset %#x, exported", bufSize/mib, guard/kib, v.mem.Offset())

	n0, mapped0, err := regs()
	if err != nil {
		return err
	}
	buf, err := f.Register(client.VendorPCIBar, 0, h, bufSize)
	if err != nil {
		return fmt.Errorf("REGISTER: %w", err)
	}
	if buf.Transport != client.TransportKmod {
		return fmt.Errorf("REGISTER: transport %s, want direct", buf.Transport)
	}
	n1, mapped1, err := regs()
	if err != nil {
		return err
	}
	if n1 != n0+1 || mapped1 != mapped0+bufSize {
		return fmt.Errorf("module after REGISTER: registrations %d -> %d, mapped_bytes %d -> %d; want +1, +%d",
			n0, n1, mapped0, mapped1, bufSize)
	}
	ok("REGISTER through the mount: buffer %d, transport kmod; the daemon mapped it through phxfs_dev0 (registrations %d, mapped_bytes +%d)",
		buf.ID, n1, bufSize)

	if err := readOne(v, f, buf); err != nil {
		return err
	}
	if err := readBatch(v, f, buf); err != nil {
		return err
	}
	if err := readBuffered(v, file, buf); err != nil {
		return err
	}

	info, err = f.Info()
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
	if err := v.verify("after DEREGISTER"); err != nil {
		return err
	}

	for _, l := range v.landed {
		fmt.Printf("PHXFS-LANDED %d %d %d\n", l[0], l[1], l[2])
	}
	// the bytes stay in the BAR for the host: only the bookkeeping goes
	if err := v.stream.Close(); err != nil {
		return err
	}
	v.stream = nil
	if err := m.Close(); err != nil {
		return err
	}
	if err := pad.Close(); err != nil {
		return err
	}
	if err := conn.Close(); err != nil {
		return err
	}
	fmt.Printf("vmclient: %d checks passed, %d ranges landed through the mount\n", checks, len(v.landed))
	return nil
}

// readOne: one READ ioctl, O_DIRECT, 2 MiB.
func readOne(v *vm, f *client.File, buf client.Buffer) error {
	const bufOff, fileOff, n = 0, 4 * mib, 2 * mib
	got, err := f.Read(buf, bufOff, n, fileOff)
	if err != nil || got != n {
		return fmt.Errorf("READ %d bytes at file offset %#x: %d, %v", n, fileOff, got, err)
	}
	v.expect(bufOff, fileOff, n)
	if err := v.verify("READ"); err != nil {
		return err
	}
	ok("READ ioctl landed %d MiB of the file in the BAR (O_DIRECT)", n/mib)
	return nil
}

// readBatch: one BATCH_READ with extents that land, merge, stop at end of
// file, and fail one by one without moving a byte.
func readBatch(v *vm, f *client.File, buf client.Buffer) error {
	type want struct {
		result int64 // bytes, or -errno
		landed int64 // bytes that land (a short read lands result bytes)
		what   string
	}
	ext := []client.Extent{
		{Buffer: buf.ID, BufOffset: 5 * mib, Len: 512 * kib, FileOffset: 40 * mib},
		{Buffer: buf.ID, BufOffset: 2 * mib, Len: 1 * mib, FileOffset: 16 * mib},
		{Buffer: buf.ID, BufOffset: 3 * mib, Len: 1 * mib, FileOffset: 17 * mib}, // follows on: merged
		// not aligned for O_DIRECT: the storage read fails, nothing lands
		{Buffer: buf.ID, BufOffset: 6 * mib, Len: 4096, FileOffset: 1000},
		// runs past the registration into the guard: refused before I/O
		{Buffer: buf.ID, BufOffset: bufSize - 64*kib, Len: 128 * kib, FileOffset: 20 * mib},
		// no such buffer
		{Buffer: buf.ID + 1000, BufOffset: 0, Len: 64 * kib, FileOffset: 0},
		// crosses the end of the file: short
		{Buffer: buf.ID, BufOffset: 7 * mib, Len: 128 * kib, FileOffset: fileLen - 64*kib},
		{Buffer: buf.ID, BufOffset: 4 * mib, Len: 256 * kib, FileOffset: 60 * mib},
	}
	wants := []want{
		{512 * kib, 512 * kib, "aligned extent"},
		{1 * mib, 1 * mib, "aligned extent"},
		{1 * mib, 1 * mib, "extent that follows on"},
		{-int64(unix.EINVAL), 0, "unaligned O_DIRECT extent"},
		{-int64(unix.EFAULT), 0, "extent past the registration"},
		{-int64(unix.ENOENT), 0, "unknown buffer"},
		{64 * kib, 64 * kib, "extent across end of file"},
		{256 * kib, 256 * kib, "aligned extent"},
	}
	failed, err := f.ReadBatch(ext)
	if err != nil {
		return fmt.Errorf("BATCH_READ: %w", err)
	}
	nfail := 0
	for i, e := range ext {
		w := wants[i]
		if e.Result != w.result {
			return fmt.Errorf("BATCH_READ extent %d (%s, %+v): result %d, want %d", i, w.what, e, e.Result, w.result)
		}
		if e.Result != e.Len {
			nfail++
		}
		if w.landed > 0 {
			v.expect(e.BufOffset, e.FileOffset, w.landed)
		}
		if e.FileOffset+e.Len > fileLen && e.Result > 0 {
			v.pastEOF = append(v.pastEOF, [2]int64{e.BufOffset + e.Result, e.BufOffset + e.Len})
		}
	}
	if failed != nfail {
		return fmt.Errorf("BATCH_READ: %d failed extents reported, want %d", failed, nfail)
	}
	if err := v.verify("BATCH_READ"); err != nil {
		return err
	}
	ok("BATCH_READ of %d extents: 5 landed (one merged, one short at end of file: the bytes past it hold 0 or the fill), EINVAL for the unaligned one, EFAULT past the registration, ENOENT for an unknown id", len(ext))
	ok("every byte of the registration and its guard checked: refused and failed extents moved no byte")
	return nil
}

// readBuffered: READ on a second, buffered open of the file: an offset
// and a buffer offset no O_DIRECT read could take land through the page
// cache (a CPU copy into the daemon's mapping of the device pages).
func readBuffered(v *vm, file string, buf client.Buffer) error {
	const bufOff, fileOff, n = 7*mib + 256*kib + 3, 8 * 12345, 100000
	g, err := client.Open(file)
	if err != nil {
		return err
	}
	defer g.Close()
	// the buffer was registered on the O_DIRECT file; any file of the
	// mount may name it
	got, err := g.Read(buf, bufOff, n, fileOff)
	if err != nil || got != n {
		return fmt.Errorf("buffered READ of %d bytes at file offset %d into buffer offset %#x: %d, %v", n, fileOff, bufOff, got, err)
	}
	v.expect(bufOff, fileOff, n)
	if err := v.verify("buffered READ"); err != nil {
		return err
	}
	ok("READ on a buffered open: %d bytes at unaligned file and buffer offsets landed", n)
	return nil
}

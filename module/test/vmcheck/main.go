// Command vmcheck lands file bytes from the VM's NVMe disk in the phxfs
// device pages of an ivshmem BAR, and checks them from both sides.
//
//	vmcheck pattern FILE SIZE            write the test file (host)
//	vmcheck verify SHMFILE BAROFF FILEOFF LEN
//	                                     check landed bytes in the BAR's
//	                                     backing file (host, after the VM)
//	vmcheck run FILE SCRATCHDIR          the in-VM checks
//	vmcheck owner FILE                   the in-VM owner checks (as root,
//	                                     with the device node in the group
//	                                     phxfs; they run owner-* children)
//
// The test file's every 8-byte little-endian word is its own offset. "run"
// prints "check ok: ..." per check and "PHXFS-LANDED BAROFF FILEOFF LEN"
// per range left in the BAR for the host to verify; it exits non-zero on
// the first failure. The checks are by job: land.go lands bytes in device
// pages (and writes them back), revoke.go takes the memory back under a
// mapping, lifetime.go removes the module and the device under one, and
// drain.go checks that phxfs waits for holders of a registration's pages
// (UNMAP, munmap) without holding its locks, and owner.go that only a
// registration's owner (or root) may map its device memory.
package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector/pcibar"
	"github.com/phxmount/phxmount/kmod"
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
	case "owner":
		if len(os.Args) != 3 {
			usage()
		}
		err = ownerChecks(os.Args[2])
	default:
		c, found := ownerCommands[os.Args[1]]
		if !found || len(os.Args) != 2+c.args {
			usage()
		}
		err = c.run(os.Args[2:])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmcheck %s: FAIL: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: vmcheck pattern FILE SIZE | verify SHMFILE BAROFF FILEOFF LEN | run FILE SCRATCHDIR | owner FILE")
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

// env is what the in-VM checks share.
type env struct {
	conn    *pcibar.Connector
	dev     *kmod.Device // phxfs_dev0
	fd      int          // the test file, opened O_DIRECT
	scratch string       // a directory on the NVMe disk
}

// inVM is the in-VM checks, in order: the last ones take the module's
// devices away.
var inVM = []func(*env) error{
	landSync, landUring, landBeyond2G, writeBack, revoke, drainChecks,
	busyModule, reservedRAM, unbind,
}

func run(file, scratch string) error {
	e, err := newEnv(file, scratch)
	if err != nil {
		return err
	}
	defer e.close()
	for _, check := range inVM {
		if err := check(e); err != nil {
			return err
		}
	}
	fmt.Printf("vmcheck: %d checks passed\n", checks)
	return nil
}

// newEnv opens the pcibar connector, phxfs_dev0 (checked to be the device
// pcibar sees) and the test file.
func newEnv(file, scratch string) (*env, error) {
	if !kmod.Available(0) {
		return nil, errors.New("kmod: /dev/phxfs_dev0 not available")
	}
	e := &env{fd: -1, scratch: scratch}
	if err := e.open(file); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *env) open(file string) (err error) {
	if e.conn, err = pcibar.New(pcibar.Config{}); err != nil {
		return err
	}
	if e.dev, err = kmod.Open(0); err != nil {
		return err
	}
	if err := e.checkDevice(); err != nil {
		return err
	}
	if e.fd, err = unix.Open(file, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0); err != nil {
		return fmt.Errorf("open %s O_DIRECT: %w", file, err)
	}
	return nil
}

// checkDevice checks that phxfs_dev0 is pcibar's device 0 and that pcibar
// streams reach its BAR.
func (e *env) checkDevice() error {
	devs, err := e.conn.Devices()
	if err != nil {
		return err
	}
	pci, err := e.dev.PCIAddress()
	if err != nil {
		return err
	}
	if pci != devs[0].PCIAddress {
		return fmt.Errorf("phxfs_dev0 is %s, pcibar device 0 is %s", pci, devs[0].PCIAddress)
	}
	ok("phxfs_dev0 is the ivshmem device %s, BAR of %d MiB", pci, devs[0].MemoryBytes>>20)
	view, why, err := e.conn.ViewKind(0)
	if err != nil {
		return err
	}
	ok("pcibar streams reach the BAR through the %q view %s", view, why)
	return nil
}

func (e *env) close() {
	if e.fd >= 0 {
		unix.Close(e.fd)
	}
	if e.dev != nil {
		e.dev.Close()
	}
	if e.conn != nil {
		e.conn.Close()
	}
}

// mapAlloc allocates size bytes of BAR and maps them through phxfs_dev0.
func (e *env) mapAlloc(size int64) (*pcibar.Memory, *kmod.Mapping, error) {
	m, err := e.conn.Alloc(0, size)
	if err != nil {
		return nil, nil, err
	}
	mp, err := e.dev.Map(m.Addr(), size)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return m.(*pcibar.Memory), mp, nil
}

// checkBoth checks the pattern in device memory through the module
// mapping (CPU) and through a pcibar stream (the BAR view).
func (e *env) checkBoth(mp *kmod.Mapping, memOff, fileOff, n int64, what string) error {
	if err := checkPattern(mp.Bytes()[memOff:memOff+n], fileOff, what+" (module mapping)"); err != nil {
		return err
	}
	s, err := e.conn.NewStream(0)
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

// Package emu is the emulated accelerator: "device memory" is host shared
// memory (a memfd) that the application and the phxmount daemon both map.
// It lets a machine without a GPU run the whole product, and its staged mode
// (memory not addressable by the CPU) exercises the staged transport.
package emu

import (
	"encoding/binary"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
)

// PageSize is the emulated device page: the 64 KiB GPU page.
const PageSize = 64 << 10

// memfdPrefix names every emu buffer; Import refuses descriptors without it.
const memfdPrefix = "phxemu"

var handleMagic = [8]byte{'P', 'H', 'X', 'E', 'M', 'U', '0', '1'}

// handleUsed is the length of the defined part of a handle; the rest is
// reserved and zero.
const handleUsed = 36

// Config chooses how many devices there are and whether their memory is
// host-addressable.
type Config struct {
	// Devices is the number of emulated devices (default 1).
	Devices int
	// Staged makes device memory unaddressable by the CPU: the mapping that
	// names it is PROT_NONE, so any attempt to read into it directly faults,
	// and bytes reach it only through Stream copies, as on a GPU without the
	// kernel module.
	Staged bool
	// MemoryBytes is the nominal size of each device (default 64 GiB).
	MemoryBytes int64
}

// Connector is the emulated vendor.
type Connector struct {
	cfg Config

	mu      sync.Mutex
	regions []*Memory // sorted by address
}

var _ connector.Connector = (*Connector)(nil)

// New returns an emulated connector.
func New(cfg Config) (*Connector, error) {
	if cfg.Devices == 0 {
		cfg.Devices = 1
	}
	if cfg.Devices < 0 || cfg.Devices > 64 {
		return nil, errs.New(unix.EINVAL, "emu: %d devices (1 to 64)", cfg.Devices)
	}
	if cfg.MemoryBytes == 0 {
		cfg.MemoryBytes = 64 << 30
	}
	return &Connector{cfg: cfg}, nil
}

// Vendor implements connector.Connector.
func (c *Connector) Vendor() string { return "emu" }

// HostAddressable implements connector.Connector.
func (c *Connector) HostAddressable() bool { return !c.cfg.Staged }

// Devices implements connector.Connector.
func (c *Connector) Devices() ([]connector.DeviceInfo, error) {
	out := make([]connector.DeviceInfo, c.cfg.Devices)
	for i := range out {
		out[i] = connector.DeviceInfo{
			Index:       i,
			Name:        fmt.Sprintf("phxmount emulated device %d", i),
			PCIAddress:  fmt.Sprintf("0000:e0:%02x.0", i),
			PageSize:    PageSize,
			MemoryBytes: c.cfg.MemoryBytes,
		}
	}
	return out, nil
}

func (c *Connector) checkDevice(dev int) error {
	if dev < 0 || dev >= c.cfg.Devices {
		return errs.New(unix.ENODEV, "emu: no device %d (have %d)", dev, c.cfg.Devices)
	}
	return nil
}

// Memory is an emulated device buffer.
type Memory struct {
	c     *Connector
	dev   int
	fd    int // the memfd; -1 for imported memory, which its mappings hold
	ino   uint64
	size  int64
	view  []byte // names the memory: PROT_NONE in staged mode
	alias []byte // the mapping the copy engine uses: read-write, or read-only for readOnly
	// readOnly: imported from a read-only share (the exporter's descriptor
	// is O_RDONLY, or the memfd is sealed against writes): both mappings
	// are read-only, and nothing may be read into it.
	readOnly bool
}

// ReadOnly reports memory imported from a read-only share: it may be the
// source of a write to a file, never the target of a read.
func (m *Memory) ReadOnly() bool { return m.readOnly }

// Device implements connector.Memory.
func (m *Memory) Device() int { return m.dev }

// Addr implements connector.Memory: the address of the mapping that names it.
func (m *Memory) Addr() uint64 { return uint64(uintptr(unsafe.Pointer(&m.view[0]))) }

// Size implements connector.Memory.
func (m *Memory) Size() int64 { return m.size }

// Bytes gives tests and benchmarks the CPU's view of the memory, whatever the
// mode: the "device-to-host copy" used to verify landed bytes. It is for the
// process that owns the memory: on imported memory a plain access faults
// (SIGBUS) once the exporter shrinks its memfd, so the daemon never uses it
// and reaches imported memory only through kernel I/O and Stream copies.
func (m *Memory) Bytes() []byte { return m.alias }

// Export implements connector.Memory. The handle names this process and its
// descriptor; only this process can have it imported (see Import). Memory
// imported from another process holds no descriptor and cannot be
// exported again (EINVAL).
func (m *Memory) Export() (connector.Handle, error) {
	var h connector.Handle
	if m.fd < 0 {
		return h, errs.New(unix.EINVAL, "emu: imported memory cannot be exported again")
	}
	copy(h[0:8], handleMagic[:])
	binary.LittleEndian.PutUint32(h[8:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(h[12:], uint32(m.fd))
	binary.LittleEndian.PutUint64(h[16:], uint64(m.size))
	binary.LittleEndian.PutUint64(h[24:], m.ino)
	binary.LittleEndian.PutUint32(h[32:], uint32(m.dev))
	return h, nil
}

// Close implements connector.Memory.
func (m *Memory) Close() error {
	c := m.c
	c.mu.Lock()
	for i, r := range c.regions {
		if r == m {
			c.regions = append(c.regions[:i], c.regions[i+1:]...)
			break
		}
	}
	c.mu.Unlock()
	var first error
	if len(m.alias) > 0 && &m.alias[0] != &m.view[0] {
		first = unix.Munmap(m.alias)
	}
	if err := unmapAligned(m.view); err != nil && first == nil {
		first = err
	}
	if m.fd >= 0 {
		if err := unix.Close(m.fd); err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return errs.Wrapf(first, "emu: free device memory")
	}
	return nil
}

// Alloc implements connector.Connector.
func (c *Connector) Alloc(dev int, size int64) (connector.Memory, error) {
	if err := c.checkDevice(dev); err != nil {
		return nil, err
	}
	if size <= 0 || size%PageSize != 0 {
		return nil, errs.New(unix.EINVAL, "emu: allocation of %d bytes (must be a positive multiple of %d)", size, PageSize)
	}
	fd, err := unix.MemfdCreate(fmt.Sprintf("%s-dev%d", memfdPrefix, dev), unix.MFD_CLOEXEC)
	if err != nil {
		return nil, errs.Wrapf(err, "emu: memfd_create")
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, errs.Wrapf(err, "emu: size device memory to %d bytes", size)
	}
	m, err := c.mapFd(dev, fd, size, access{populate: true})
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return m, nil
}

// Import implements connector.Connector: it opens the exporting process's
// descriptor through /proc, so a handle is usable only while its exporter
// lives and only by the daemon serving that very process.
func (c *Connector) Import(dev int, h connector.Handle, size int64, pid int) (connector.Memory, error) {
	if err := c.checkDevice(dev); err != nil {
		return nil, err
	}
	if [8]byte(h[0:8]) != handleMagic {
		return nil, errs.New(unix.EINVAL, "emu: not an emulated-device handle")
	}
	for _, b := range h[handleUsed:] {
		if b != 0 {
			return nil, errs.New(unix.EINVAL, "emu: handle bytes %d to %d are reserved and must be zero", handleUsed, connector.HandleSize-1)
		}
	}
	hpid := int(binary.LittleEndian.Uint32(h[8:]))
	hfd := int(binary.LittleEndian.Uint32(h[12:]))
	hsize := int64(binary.LittleEndian.Uint64(h[16:]))
	hino := binary.LittleEndian.Uint64(h[24:])
	hdev := int(binary.LittleEndian.Uint32(h[32:]))
	if hpid != pid {
		return nil, errs.New(unix.EPERM, "emu: handle exported by process %d, claimed by %d", hpid, pid)
	}
	if hdev != dev {
		return nil, errs.New(unix.EINVAL, "emu: handle is for device %d, not %d", hdev, dev)
	}
	if size <= 0 || size%PageSize != 0 || size > hsize {
		return nil, errs.New(unix.EINVAL, "emu: import of %d bytes from a %d-byte buffer", size, hsize)
	}
	path := fmt.Sprintf("/proc/%d/fd/%d", hpid, hfd)
	target, err := os.Readlink(path)
	if err != nil {
		return nil, errs.New(unix.ESRCH, "emu: exporting descriptor %s: %v", path, err)
	}
	if !strings.HasPrefix(target, "/memfd:"+memfdPrefix) {
		return nil, errs.New(unix.EINVAL, "emu: %s is %q, not an emulated-device buffer", path, target)
	}
	// The client may swap another file onto hfd after the Readlink above,
	// and a read-write open as root would then reach a file it may only
	// read (or open a device): take a path-only reference, check it, and
	// only then open that very file.
	pfd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errs.Wrapf(err, "emu: open %s", path)
	}
	defer unix.Close(pfd)
	if err := checkMemfd(pfd); err != nil {
		return nil, err
	}
	acc, err := exportedAccess(hpid, hfd, pfd, hino)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", pfd), acc.openFlags()|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errs.Wrapf(err, "emu: open %s", path)
	}
	if err := checkImport(fd, path, hino, size, &acc); err != nil {
		unix.Close(fd)
		return nil, err
	}
	m, err := c.mapFd(dev, fd, size, acc)
	unix.Close(fd)
	if err != nil {
		return nil, err
	}
	// The mappings hold the memfd: imported memory keeps no descriptor, so
	// that a registration costs the daemon a mapping (two, staged) and no
	// descriptor, whatever the number of them a client makes.
	m.fd = -1
	return m, nil
}

// access is how memory is mapped: read-only or read-write, and populated
// (memory this process allocated) or not (imported memory: its pages are
// the exporter's, and the daemon must not fault in the holes of a sparse
// memfd on the exporter's behalf).
type access struct {
	readOnly bool
	populate bool
}

func (a access) openFlags() int {
	if a.readOnly {
		return unix.O_RDONLY
	}
	return unix.O_RDWR
}

// share is how the memory is mapped: shared, or, read-only, private.
// Nothing ever writes read-only memory (its mappings are PROT_READ), so a
// private mapping reads what a shared one would, and unlike a shared
// mapping of a read-only descriptor or of a write-sealed memfd, which can
// never become writable (no VM_MAYWRITE), it can be guarded (guard.go).
func (a access) share() int {
	if a.readOnly {
		return unix.MAP_PRIVATE
	}
	return unix.MAP_SHARED
}

func (a access) prot() int {
	if a.readOnly {
		return unix.PROT_READ
	}
	return unix.PROT_READ | unix.PROT_WRITE
}

// exportedAccess is the access the exporter shares its memfd with: that of
// its descriptor hfd (from /proc/<pid>/fdinfo), which must still name the
// inode pfd and the handle name. A read-only descriptor is imported read-
// only: the daemon never gets more access to the memory than the caller
// gave it. A write-only one cannot even be mapped (EACCES).
func exportedAccess(pid, hfd, pfd int, hino uint64) (access, error) {
	p := fmt.Sprintf("/proc/%d/fdinfo/%d", pid, hfd)
	b, err := os.ReadFile(p)
	if err != nil {
		return access{}, errs.New(unix.ESRCH, "emu: exporting descriptor %s: %v", p, err)
	}
	var flags, ino uint64
	var haveFlags, haveIno bool
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch v = strings.TrimSpace(v); k {
		case "flags":
			flags, err = strconv.ParseUint(v, 8, 64)
			haveFlags = err == nil
		case "ino":
			ino, err = strconv.ParseUint(v, 10, 64)
			haveIno = err == nil
		}
	}
	var st unix.Stat_t
	if !haveFlags || unix.Fstat(pfd, &st) != nil || (haveIno && ino != st.Ino) || st.Ino != hino {
		return access{}, errs.New(unix.EINVAL, "emu: descriptor %d of process %d no longer is the exported buffer", hfd, pid)
	}
	switch flags & unix.O_ACCMODE {
	case unix.O_RDONLY:
		return access{readOnly: true}, nil
	case unix.O_WRONLY:
		return access{}, errs.New(unix.EACCES, "emu: descriptor %d of process %d is write-only: memory it cannot read cannot be registered", hfd, pid)
	}
	return access{}, nil
}

// checkImport checks fd, the daemon's descriptor on the exported memfd,
// before it is mapped: still the exported inode, at least size bytes, and
// at least size bytes of it allocated (st_blocks): a registration is
// memory the exporter holds, charged to it, never holes the daemon would
// fill (EFAULT otherwise). A memfd sealed against writes is imported
// read-only (acc).
//
// The size is checked here only: the client may shrink the memfd (or punch
// holes) at any time after. Nothing below depends on it (the mappings are
// not populated), and the copy engine, the only CPU access to the memory,
// turns the resulting faults into EFAULT (faultsafe.Copy); a read into
// pages freed meanwhile allocates them again, at most the bytes it moves.
func checkImport(fd int, path string, hino uint64, size int64, acc *access) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Ino != hino || st.Size < size {
		return errs.New(unix.EINVAL, "emu: %s no longer is the exported buffer", path)
	}
	if held := st.Blocks * 512; held < size {
		return errs.New(unix.EFAULT, "emu: %s holds %d allocated bytes of its %d, fewer than the %d to register: "+
			"write or fallocate the memory before registering it", path, held, st.Size, size)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err == nil && seals&(unix.F_SEAL_WRITE|unix.F_SEAL_FUTURE_WRITE) != 0 {
		acc.readOnly = true
	}
	return nil
}

func (c *Connector) mapFd(dev, fd int, size int64, acc access) (*Memory, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, errs.Wrapf(err, "emu: fstat")
	}
	prot := acc.prot()
	if c.cfg.Staged {
		prot = unix.PROT_NONE
	}
	view, err := mapAligned(fd, size, prot, acc)
	if err != nil {
		return nil, err
	}
	alias := view
	if c.cfg.Staged {
		flags := acc.share()
		if acc.populate {
			// Populating reads nothing into this process: on pages past the
			// end of a memfd shrunk meanwhile it just stops, without a fault.
			flags |= unix.MAP_POPULATE
		}
		alias, err = unix.Mmap(fd, 0, int(size), acc.prot(), flags)
		if err != nil {
			unmapAligned(view)
			return nil, errs.Wrapf(err, "emu: map copy-engine alias")
		}
	}
	if !acc.populate {
		// Imported: the exporter's pages, which the daemon must never
		// allocate (guard.go). The alias is the mapping any access goes
		// through (the view itself in host mode; PROT_NONE when staged).
		if err := guard(alias); err != nil {
			if &alias[0] != &view[0] {
				unix.Munmap(alias)
			}
			unmapAligned(view)
			return nil, err
		}
	}
	m := &Memory{c: c, dev: dev, fd: fd, ino: st.Ino, size: size, view: view, alias: alias, readOnly: acc.readOnly}
	c.mu.Lock()
	i := sort.Search(len(c.regions), func(i int) bool { return c.regions[i].Addr() > m.Addr() })
	c.regions = append(c.regions, nil)
	copy(c.regions[i+1:], c.regions[i:])
	c.regions[i] = m
	c.mu.Unlock()
	return m, nil
}

// mapAligned maps fd at an address aligned to PageSize, as device memory is:
// it reserves a larger range and maps the file over its aligned part.
func mapAligned(fd int, size int64, prot int, acc access) ([]byte, error) {
	reserve, err := unix.Mmap(-1, 0, int(size+PageSize), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, errs.Wrapf(err, "emu: reserve %d bytes", size)
	}
	base := uintptr(unsafe.Pointer(&reserve[0]))
	head := int(((base + PageSize - 1) &^ (PageSize - 1)) - base)
	// MAP_FIXED replaces the aligned part of the reservation with the file.
	// Memory this process allocated is populated now, as registering GPU
	// memory pins it: the first transfer should not pay for page faults.
	// (Populating is done by the kernel and ignores pages past the end of a
	// file, so a shrunk memfd cannot make it fault.) Imported memory is not:
	// populating a shared mapping allocates every hole of the exporter's
	// memfd, in the daemon's name. In host mode the CPU never touches this
	// mapping: only the kernel does, for I/O, and it returns EFAULT on pages
	// that are gone.
	flags := acc.share() | unix.MAP_FIXED
	if acc.populate {
		flags |= unix.MAP_POPULATE
	}
	p, err := unix.MmapPtr(fd, 0, unsafe.Pointer(&reserve[head]), uintptr(size), prot, flags)
	if err != nil {
		unix.Munmap(reserve)
		return nil, errs.Wrapf(err, "emu: map device memory")
	}
	// Give back the unused head and tail of the reservation.
	if head > 0 {
		unix.MunmapPtr(unsafe.Pointer(&reserve[0]), uintptr(head))
	}
	if tail := int(PageSize) - head; tail > 0 {
		unix.MunmapPtr(unsafe.Pointer(&reserve[head+int(size)]), uintptr(tail))
	}
	return unsafe.Slice((*byte)(p), size), nil
}

func unmapAligned(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return unix.MunmapPtr(unsafe.Pointer(&b[0]), uintptr(len(b)))
}

// find returns the region holding [addr, addr+size) on dev.
func (c *Connector) find(dev int, addr uint64, size int64) (*Memory, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := sort.Search(len(c.regions), func(i int) bool { return c.regions[i].Addr() > addr }) - 1
	if i < 0 {
		return nil, errs.New(unix.EFAULT, "emu: %#x is not device memory", addr)
	}
	m := c.regions[i]
	if m.dev != dev {
		return nil, errs.New(unix.EFAULT, "emu: %#x is memory of device %d, not %d", addr, m.dev, dev)
	}
	if size < 0 || addr+uint64(size) > m.Addr()+uint64(m.size) {
		return nil, errs.New(unix.EFAULT, "emu: [%#x, +%d) runs past its %d-byte buffer", addr, size, m.size)
	}
	return m, nil
}

// Resolve implements connector.Connector.
func (c *Connector) Resolve(dev int, addr uint64, size int64) (uintptr, error) {
	if _, err := c.find(dev, addr, size); err != nil {
		return 0, err
	}
	if c.cfg.Staged {
		return 0, nil
	}
	return uintptr(addr), nil
}

// alias returns the copy engine's view of [addr, addr+size).
func (c *Connector) alias(dev int, addr uint64, size int64) ([]byte, error) {
	m, err := c.find(dev, addr, size)
	if err != nil {
		return nil, err
	}
	off := addr - m.Addr()
	return m.alias[off : off+uint64(size)], nil
}

// hostMemory is page-aligned anonymous memory.
type hostMemory struct{ b []byte }

func (h *hostMemory) Bytes() []byte { return h.b }
func (h *hostMemory) Close() error  { return unix.Munmap(h.b) }

// AllocHost implements connector.Connector.
func (c *Connector) AllocHost(size int64) (connector.HostMemory, error) {
	if size <= 0 {
		return nil, errs.New(unix.EINVAL, "emu: host allocation of %d bytes", size)
	}
	b, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, errs.Wrapf(err, "emu: host allocation of %d bytes", size)
	}
	return &hostMemory{b: b}, nil
}

// Close implements connector.Connector.
func (c *Connector) Close() error { return nil }

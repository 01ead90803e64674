package integration

// docs/abi.md checked from the outside, as a tester who has only the
// document would: every command's layout, every field's rule, every errno
// the document names for each bad input, the limits at and one past their
// bound, ownership and release, the xattrs and the emu handle. The client
// is abi_client_test.go (raw bytes, not the client package); the second
// half of the sections is abi_conformance_more_test.go. Each check
// says the promise it holds the daemon to; landed bytes are compared
// exactly, and every refused request is checked to have moved no byte.
//
//	TestABICommandNumbers    the command table against its formula (no mount)
//	TestABIConformance       one emu mount (two devices, allow_other), a subtest a section
//	TestABILifetime          release on DEREGISTER, last close (dup, fork), owner death
//	TestABIReadOnlyMount     -o ro: EROFS, its order, INFO's read-only flag
//	TestABILimits            -o max_buffers_per_process, max_buffers, max_registered_bytes
//	TestABIShutdown          after "shutting down": ESHUTDOWN, and the buffers still serve

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestABICommandNumbers: the values of "Command numbers" are the formula's.
func TestABICommandNumbers(t *testing.T) {
	for _, c := range []struct {
		name string
		got  uint32
		want uint32
	}{
		{"REGISTER", cmdRegister, 0xC080E501},
		{"DEREGISTER", cmdDeregister, 0x4020E502},
		{"READ", cmdRead, 0xC030E503},
		{"WRITE", cmdWrite, 0xC030E504},
		{"INFO", cmdInfo, 0xC200E507},
		{"BATCH_READ k=16", cmdBatch(false, 16), 0xC290E505},
		{"BATCH_WRITE k=16", cmdBatch(true, 16), 0xC290E506},
		{"BATCH_READ k=128", cmdBatch(false, 128), 0xD410E505},
		{"BATCH_WRITE k=128", cmdBatch(true, 128), 0xD410E506},
		{"BATCH_READ k=400", cmdBatch(false, 400), 0xFE90E505},
		{"BATCH_WRITE k=400", cmdBatch(true, 400), 0xFE90E506},
		{"BATCH_READ_STRIDED k=1", cmdStrided(false, 1), 0xC000E508 | 80<<16},
		{"BATCH_WRITE_STRIDED k=255", cmdStrided(true, 255), 0xC000E509 | (16+64*255)<<16},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, the table says %#x", c.name, c.got, c.want)
		}
	}
	if szBatchHeader+szExtent*maxExtents > maxIoctlSize || szBatchHeader+szExtent*(maxExtents+1) <= maxIoctlSize {
		t.Errorf("409 is not the most extents that fit 16,383 bytes")
	}
	if szBatchHeader+szStridedExtent*maxStridedExtents > maxIoctlSize || szBatchHeader+szStridedExtent*(maxStridedExtents+1) <= maxIoctlSize {
		t.Errorf("255 is not the most strided extents that fit 16,383 bytes")
	}
}

const abiFileSize = 1<<20 + 123

// pciRE is a PCI address as sysfs writes it ("0000:3b:00.0").
var pciRE = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`) // "f": not a multiple of anything, so that reads end short

// abiFixture is the mount of TestABIConformance.
type abiFixture struct {
	d    *daemon
	data []byte // the bytes of "f"
	f    string // "f" through the mount
	dir  string // "dir" through the mount
	ndev uint32
	ids  map[uint64]bool // every buffer id seen on this mount
	toks map[[16]byte]bool
}

func wantErrno(t testing.TB, what string, got, want unix.Errno) {
	t.Helper()
	if got != want {
		t.Errorf("%s: %s, want %s", what, errName(got), errName(want))
	}
}

// reg registers m through fd and checks that its id and token are new.
func (x *abiFixture) reg(t testing.TB, fd int, m *emuMem) regReply {
	t.Helper()
	r := mustRegister(t, fd, m)
	x.fresh(t, r)
	return r
}

func (x *abiFixture) fresh(t testing.TB, r regReply) {
	t.Helper()
	if x.ids[r.id] {
		t.Errorf("buffer id %d was given out before on this mount", r.id)
	}
	if x.toks[r.token] {
		t.Errorf("token %x was given out before", r.token)
	}
	x.ids[r.id] = true
	x.toks[r.token] = true
}

// file writes name in the backing directory (mode) and returns its bytes
// and its path through the mount.
func (x *abiFixture) file(t testing.TB, name string, size int64, mode os.FileMode) ([]byte, string) {
	t.Helper()
	return writePattern(t, filepath.Join(x.d.Backing, name), size, mode), filepath.Join(x.d.Mnt, name)
}

func TestABIConformance(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu", "-o", "allow_other"), withEnv("PHXMOUNT_EMU_DEVICES=2"))
	x := &abiFixture{d: d, ids: map[uint64]bool{}, toks: map[[16]byte]bool{}}
	x.data, x.f = x.file(t, "f", abiFileSize, 0644)
	mustMkdir(t, filepath.Join(d.Backing, "dir"))
	x.dir = filepath.Join(d.Mnt, "dir")

	// "Buffer ids start at 1": the mount's first REGISTER.
	fd, err := unix.Open(x.f, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	first := x.reg(t, fd, newEmu(t, "phxemu-first", emuPage, 0))
	if first.id != 1 {
		t.Errorf("the mount's first buffer id is %d, want 1", first.id)
	}
	in, e := abiInfo(t, fd, 0)
	if e != 0 {
		t.Fatalf("INFO device 0: %s", errName(e))
	}
	x.ndev = in.ndev
	if x.ndev != 2 {
		t.Fatalf("INFO says %d devices; the mount was started with 2", x.ndev)
	}
	unix.Close(fd)

	for _, s := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"CommandResolution", x.commandResolution},
		{"Header", x.header},
		{"OutAndReservedFields", x.outAndReserved},
		{"Register", x.register},
		{"RegisterErrors", x.registerErrors},
		{"ReadWrite", x.readWrite},
		{"ReadWriteErrors", x.readWriteErrors},
		{"ReadWriteErrorOrder", x.readWriteErrorOrder},
		{"Batch", x.batch},
		{"BatchErrors", x.batchErrors},
		{"Strided", x.strided},
		{"StridedErrors", x.stridedErrors},
		{"Info", x.info},
		{"Deregister", x.deregister},
		{"Ownership", x.ownership},
		{"WriteAsTheCaller", x.writeAsCaller},
		{"FileSizeLimit", x.fileSizeLimit},
		{"XattrInfo", x.xattrInfo},
		{"XattrNames", x.xattrNames},
		{"XattrLoad", x.xattrLoad},
		{"XattrLoadErrors", x.xattrLoadErrors},
		{"EmuHandleReadOnly", x.emuReadOnly},
		{"EmuShrunk", x.emuShrunk},
	} {
		t.Run(s.name, s.fn)
	}

	d.alive(t, "at the end of the conformance test")
}

// "Command resolution".
func (x *abiFixture) commandResolution(t *testing.T) {
	fd := openFD(t, x.f, unix.O_RDWR)
	dfd := openFD(t, x.dir, unix.O_RDONLY|unix.O_DIRECTORY)
	arg := abiMsg(maxIoctlSize)
	// Another type byte: ENOTTY, never forwarded (ext4 under the mount
	// would answer FS_IOC_GETVERSION and FS_IOC_GETFLAGS).
	for _, cmd := range []uint32{
		0xC080_8801, // the phxfs module's type with REGISTER's shape
		0xC030_8803,
		0xC030_5A03, // 'Z'
		0x80087601,  // FS_IOC_GETVERSION
		unix.FS_IOC_GETFLAGS,
		0xC080_E401, // type 0xE4
		0xC080_E601, // type 0xE6
	} {
		for _, f := range []int{fd, dfd} {
			wantErrno(t, fmt.Sprintf("cmd %#x on fd %d", cmd, f), abiIoctl(t, f, cmd, arg), unix.ENOTTY)
		}
	}
	// Type 0xE5 with an unknown nr.
	for _, nr := range []uint32{0x00, 0x0A, 0x0B, 0x10, 0x80, 0xFF} {
		for _, c := range []uint32{abiCmd(dirRW, szIO, nr), abiCmd(dirW, szDeregister, nr), abiCmd(0, 0, nr)} {
			wantErrno(t, fmt.Sprintf("cmd %#x", c), abiIoctl(t, fd, c, arg), unix.ENOTTY)
		}
	}
	// A known nr with the wrong direction or size: EINVAL.
	bad := []uint32{
		abiCmd(dirW, szRegister, nrRegister), abiCmd(dirR, szRegister, nrRegister), abiCmd(0, 0, nrRegister),
		abiCmd(dirRW, szRegister-1, nrRegister), abiCmd(dirRW, szRegister+1, nrRegister),
		abiCmd(dirRW, szDeregister, nrDeregister), abiCmd(dirR, szDeregister, nrDeregister),
		abiCmd(dirW, szDeregister-1, nrDeregister), abiCmd(dirW, szDeregister+8, nrDeregister),
		abiCmd(dirW, szIO, nrRead), abiCmd(dirR, szIO, nrRead), abiCmd(dirRW, szIO-8, nrRead), abiCmd(dirRW, szIO+1, nrRead),
		abiCmd(dirW, szIO, nrWrite), abiCmd(dirRW, szIO+8, nrWrite),
		abiCmd(dirW, szInfo, nrInfo), abiCmd(dirR, szInfo, nrInfo), abiCmd(dirRW, szInfo-1, nrInfo), abiCmd(dirRW, szInfo+8, nrInfo),
	}
	for _, nr := range []uint32{nrBatchRead, nrBatchWrite} {
		bad = append(bad, abiCmd(dirW, 56, nr), abiCmd(dirR, 56, nr), abiCmd(0, 0, nr))
		for _, size := range []uint32{0, 8, 16, 55, 57, 16 + 40*maxExtents + 1, 16 + 40*maxExtents + 40 - 1, maxIoctlSize} {
			bad = append(bad, abiCmd(dirRW, size, nr))
		}
	}
	for _, nr := range []uint32{nrStridedRead, nrStridedWrite} {
		bad = append(bad, abiCmd(dirW, 80, nr), abiCmd(dirR, 80, nr), abiCmd(0, 0, nr))
		for _, size := range []uint32{0, 16, 56, 79, 81, 96, 16 + 64*maxStridedExtents + 1, 16 + 64*maxStridedExtents + 40, maxIoctlSize} {
			bad = append(bad, abiCmd(dirRW, size, nr))
		}
	}
	for _, c := range bad {
		wantErrno(t, fmt.Sprintf("cmd %#x", c), abiIoctl(t, fd, c, abiMsg(maxIoctlSize)), unix.EINVAL)
	}
	// Every capacity from 1 to the bound is accepted (count 0).
	for _, k := range []int{1, 2, 16, 128, 400, maxExtents} {
		for _, w := range []bool{false, true} {
			if failed, _, e := abiBatch(t, fd, w, k, nil); e != 0 || failed != 0 {
				t.Errorf("an empty batch (write %v) of capacity %d: %s, failed %d", w, k, errName(e), failed)
			}
		}
	}
	for _, k := range []int{1, 2, 100, maxStridedExtents} {
		for _, w := range []bool{false, true} {
			if failed, _, e := abiStrided(t, fd, w, k, nil); e != 0 || failed != 0 {
				t.Errorf("an empty strided batch (write %v) of capacity %d: %s, failed %d", w, k, errName(e), failed)
			}
		}
	}
}

// headerCases are the malformed headers: magic, version, flags.
var headerCases = []struct {
	name string
	mut  func([]byte)
}{
	{"magic+1", func(b []byte) { put32(b, 0, abiMagic+1) }},
	{"magic byte-swapped", func(b []byte) { put32(b, 0, 0x5048584D) }},
	{"magic 0", func(b []byte) { put32(b, 0, 0) }},
	{"version 0", func(b []byte) { put16(b, 4, 0) }},
	{"version 2", func(b []byte) { put16(b, 4, 2) }},
	{"version 0xFFFF", func(b []byte) { put16(b, 4, 0xFFFF) }},
	{"flags 1", func(b []byte) { put16(b, 6, 1) }},
	{"flags 0x8000", func(b []byte) { put16(b, 6, 0x8000) }},
}

// "A wrong magic, version or non-zero flags gets EINVAL", on every
// command; each message is otherwise one the daemon accepts (shown last).
func (x *abiFixture) header(t *testing.T) {
	fd := openFD(t, x.f, unix.O_RDWR)
	m := newEmu(t, "phxemu-hdr", 4*emuPage, 0)
	r := x.reg(t, fd, m)
	before := bytes.Clone(x.data)
	type cmdMsg struct {
		name string
		cmd  uint32
		msg  func() []byte
	}
	cmds := []cmdMsg{
		{"READ", cmdRead, func() []byte { return ioMsg(r.id, 0, 4096, 0) }},
		{"WRITE", cmdWrite, func() []byte { return ioMsg(r.id, 0, 4096, 0) }},
		{"BATCH_READ", cmdBatch(false, 2), func() []byte { return batchMsg(2, []ext{{r.id, 0, 4096, 0}}) }},
		{"BATCH_WRITE", cmdBatch(true, 2), func() []byte { return batchMsg(2, []ext{{r.id, 0, 4096, 0}}) }},
		{"BATCH_READ_STRIDED", cmdStrided(false, 1), func() []byte { return stridedMsg(1, []sext{{r.id, 0, 64, 0, 4, 64, 64}}) }},
		{"BATCH_WRITE_STRIDED", cmdStrided(true, 1), func() []byte { return stridedMsg(1, []sext{{r.id, 0, 64, 0, 4, 64, 64}}) }},
		{"INFO", cmdInfo, func() []byte { b := abiMsg(szInfo); return b }},
		{"REGISTER", cmdRegister, func() []byte { return regMsg(vendorEmu, 0, uint64(m.size), m.handle(0)) }},
		{"DEREGISTER", cmdDeregister, func() []byte { b := abiMsg(szDeregister); put64(b, 8, r.id); return b }},
	}
	for _, c := range cmds {
		for _, h := range headerCases {
			b := c.msg()
			h.mut(b)
			wantErrno(t, c.name+" with "+h.name, abiIoctl(t, fd, c.cmd, b), unix.EINVAL)
		}
	}
	if !allBytes(m.mem, 0xA5) {
		t.Errorf("a refused read moved bytes into the buffer")
	}
	mustEqualFile(t, filepath.Join(x.d.Backing, "f"), before)
	// The same messages with a good header are accepted (a WRITE of the
	// file's own bytes leaves it as it is).
	fill(m.mem, 0)
	for _, c := range cmds {
		b := c.msg()
		if c.name == "WRITE" || c.name == "BATCH_WRITE" || c.name == "BATCH_WRITE_STRIDED" {
			copy(m.mem, x.data[:4096])
		}
		if e := abiIoctl(t, fd, c.cmd, b); e != 0 {
			t.Errorf("%s with a good header: %s", c.name, errName(e))
		}
		if c.name == "REGISTER" {
			x.fresh(t, regReply{id: get64(b, 88), token: [16]byte(b[96:112])})
		}
	}
	mustEqualFile(t, filepath.Join(x.d.Backing, "f"), before)
}

// "Fields marked out and reserved must be zero on input (EINVAL
// otherwise)": every byte of every out and reserved field, one at a time.
func (x *abiFixture) outAndReserved(t *testing.T) {
	fd := openFD(t, x.f, unix.O_RDONLY)
	m := newEmu(t, "phxemu-out", 2*emuPage, 0)
	r := x.reg(t, fd, m)
	try := func(name string, cmd uint32, msg func() []byte, from, to int) {
		t.Helper()
		for off := from; off < to; off++ {
			b := msg()
			b[off] = 0x01
			wantErrno(t, fmt.Sprintf("%s with byte %d set", name, off), abiIoctl(t, fd, cmd, b), unix.EINVAL)
		}
	}
	try("REGISTER", cmdRegister, func() []byte { return regMsg(vendorEmu, 0, uint64(m.size), m.handle(0)) }, 88, 128)
	try("DEREGISTER", cmdDeregister, func() []byte { b := abiMsg(szDeregister); put64(b, 8, r.id); return b }, 16, 32)
	try("READ", cmdRead, func() []byte { return ioMsg(r.id, 0, 4096, 0) }, 40, 48)
	try("WRITE", cmdWrite, func() []byte { return ioMsg(r.id, 0, 4096, 0) }, 40, 48)
	for _, w := range []bool{false, true} {
		name := fmt.Sprintf("batch (write %v)", w)
		batch := func() []byte { return batchMsg(3, []ext{{r.id, 0, 4096, 0}, {r.id, 4096, 4096, 4096}}) }
		try(name+" failed", cmdBatch(w, 3), batch, 12, 16)
		try(name+" results", cmdBatch(w, 3), batch, 16+32, 16+40)
		try(name+" results", cmdBatch(w, 3), batch, 56+32, 56+40)
		try(name+" slot past count", cmdBatch(w, 3), batch, 96, 136)
		strided := func() []byte { return stridedMsg(2, []sext{{r.id, 0, 64, 0, 4, 128, 64}}) }
		try("strided "+name+" failed", cmdStrided(w, 2), strided, 12, 16)
		try("strided "+name+" result", cmdStrided(w, 2), strided, 16+56, 16+64)
		try("strided "+name+" slot past count", cmdStrided(w, 2), strided, 80, 144)
	}
	// INFO: "everything past offset 12 zero" (the cache field included).
	try("INFO", cmdInfo, func() []byte { return abiMsg(szInfo) }, 12, szInfo)
	if !allBytes(m.mem, 0xA5) {
		t.Errorf("a refused read moved bytes into the buffer")
	}
	// The buffer is still live: the refused DEREGISTERs released nothing.
	if n, e := abiIO(t, fd, false, r.id, 0, 8, 8); e != 0 || n != 8 || !bytes.Equal(m.mem[:8], x.data[8:16]) {
		t.Errorf("READ after the refused DEREGISTERs: %d, %s", n, errName(e))
	}
	// Count > k.
	for _, w := range []bool{false, true} {
		b := batchMsg(2, []ext{{r.id, 0, 64, 0}})
		put32(b, 8, 3)
		wantErrno(t, "batch count 3 > k 2", abiIoctl(t, fd, cmdBatch(w, 2), b), unix.EINVAL)
		put32(b, 8, 0xFFFFFFFF)
		wantErrno(t, "batch count 2^32-1 > k 2", abiIoctl(t, fd, cmdBatch(w, 2), b), unix.EINVAL)
		s := stridedMsg(1, []sext{{r.id, 0, 64, 0, 1, 64, 64}})
		put32(s, 8, 2)
		wantErrno(t, "strided count 2 > k 1", abiIoctl(t, fd, cmdStrided(w, 1), s), unix.EINVAL)
	}
}

// "REGISTER": the reply, vendor 0 and 1, a directory, the second device.
func (x *abiFixture) register(t *testing.T) {
	fd := openFD(t, x.f, unix.O_RDONLY)
	dfd := openFD(t, x.dir, unix.O_RDONLY|unix.O_DIRECTORY)
	m0 := newEmu(t, "phxemu-dev0", 3*emuPage, 0)
	for _, c := range []struct {
		fd     int
		vendor uint32
		what   string
	}{{fd, vendorEmu, "vendor 1"}, {fd, vendorAny, "vendor 0 (the mount's)"}, {dfd, vendorEmu, "on a directory"}} {
		r, e := abiRegister(t, c.fd, c.vendor, 0, uint64(m0.size), m0.handle(0))
		if e != 0 {
			t.Errorf("REGISTER %s: %s", c.what, errName(e))
			continue
		}
		x.fresh(t, r)
		// It works: a READ of the file lands.
		fill(m0.mem, 0xA5)
		if n, e := abiIO(t, fd, false, r.id, 100, 5000, 77); e != 0 || n != 5000 || !bytes.Equal(m0.mem[100:5100], x.data[77:5077]) {
			t.Errorf("READ into the buffer registered %s: %d, %s", c.what, n, errName(e))
		}
		// DEREGISTER works on a directory too.
		wantErrno(t, "DEREGISTER on the directory", abiDeregister(t, dfd, r.id), 0)
	}
	// The covered range is [0, size) of the memory: a registration of less
	// than the whole memfd ends at size.
	r, e := abiRegister(t, fd, vendorEmu, 0, emuPage, m0.handle(0))
	if e != 0 {
		t.Fatalf("REGISTER of the first 64 KiB of a 192 KiB memfd: %s", errName(e))
	}
	x.fresh(t, r)
	if _, e := abiIO(t, fd, false, r.id, emuPage-8, 16, 0); e != unix.EFAULT {
		t.Errorf("READ across the registration's end: %s, want EFAULT", errName(e))
	}
	// "The daemon also logs the transport at registration."
	if !x.d.WaitLog(fmt.Sprintf("buffer %d: transport host", r.id), 10e9) {
		t.Errorf("the daemon's log does not name buffer %d's transport", r.id)
	}
	// "The daemon holds its own mapping of it (emu: its own descriptor)":
	// the memory outlives this process's descriptor and mapping.
	held := newEmu(t, "phxemu-held", emuPage, 0)
	want := pattern(emuPage, 0x29)
	copy(held.mem, want)
	rh := x.reg(t, fd, held)
	held.close()
	hpath := filepath.Join(x.d.Mnt, "held")
	hfd := openFD(t, hpath, unix.O_RDWR|unix.O_CREAT)
	if n, e := abiIO(t, hfd, true, rh.id, 0, emuPage, 0); e != 0 || n != emuPage {
		t.Errorf("WRITE from a buffer whose exporter closed and unmapped it: %d, %s", n, errName(e))
	}
	mustEqualFile(t, hpath, want)
	// Device 1: memory of device 1.
	m1 := newEmu(t, "phxemu-dev1", emuPage, 0)
	r1, e := abiRegister(t, fd, vendorEmu, 1, emuPage, m1.handle(1))
	if e != 0 {
		t.Fatalf("REGISTER on device 1: %s", errName(e))
	}
	x.fresh(t, r1)
	if n, e := abiIO(t, fd, false, r1.id, 0, emuPage, 4096); e != 0 || n != emuPage || !bytes.Equal(m1.mem, x.data[4096:4096+emuPage]) {
		t.Errorf("READ into device 1's buffer: %d, %s", n, errName(e))
	}
}

// The REGISTER error table and the emu handle's rules.
func (x *abiFixture) registerErrors(t *testing.T) {
	fd := openFD(t, x.f, unix.O_RDONLY)
	m := newEmu(t, "phxemu-regerr", 2*emuPage, 0)
	size := uint64(m.size)
	try := func(what string, want unix.Errno, vendor, dev uint32, size uint64, h []byte) {
		t.Helper()
		r, e := abiRegister(t, fd, vendor, dev, size, h)
		if e == 0 {
			abiDeregister(t, fd, r.id)
		}
		wantErrno(t, what, e, want)
	}
	// EINVAL: the size.
	for _, s := range []uint64{0, 1, 4096, emuPage - 1, emuPage + 4096, 2*emuPage - 1, two63, two63 + emuPage, ^uint64(0), ^uint64(0) - emuPage + 1} {
		try(fmt.Sprintf("size %#x", s), unix.EINVAL, vendorEmu, 0, s, m.handle(0))
	}
	// EINVAL: not an emu handle.
	for _, magic := range []string{"PHXEMU02", "phxemu01", "PHXBAR02", "\x00\x00\x00\x00\x00\x00\x00\x00"} {
		h := m.handle(0)
		copy(h, magic)
		try("handle magic "+strconv.Quote(magic), unix.EINVAL, vendorEmu, 0, size, h)
	}
	for off := 36; off < 64; off++ {
		h := m.handle(0)
		h[off] = 0x80
		try(fmt.Sprintf("handle reserved byte %d set", off), unix.EINVAL, vendorEmu, 0, size, h)
	}
	// EINVAL: the descriptor is no emu memfd.
	plain := openFD(t, filepath.Join(x.d.Backing, "f"), unix.O_RDWR)
	var st unix.Stat_t
	unix.Fstat(plain, &st)
	try("a regular file's descriptor", unix.EINVAL, vendorEmu, 0, emuPage, emuHandle(uint32(os.Getpid()), uint32(plain), uint64(st.Size), st.Ino, 0))
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	unix.Fstat(p[0], &st)
	try("a pipe", unix.EINVAL, vendorEmu, 0, emuPage, emuHandle(uint32(os.Getpid()), uint32(p[0]), emuPage, st.Ino, 0))
	for _, name := range []string{"phxemx", "xphxemu", "PHXEMU", "phxem", ""} {
		o := newEmu(t, name, emuPage, 0)
		try("a memfd named "+strconv.Quote(name), unix.EINVAL, vendorEmu, 0, emuPage, o.handle(0))
	}
	if hfd, err := unix.MemfdCreate("phxemu-huge", unix.MFD_CLOEXEC|unix.MFD_HUGETLB); err != nil {
		t.Errorf("the MFD_HUGETLB case cannot be built here: memfd_create: %v", err)
	} else {
		unix.Ftruncate(hfd, 2<<20)
		unix.Fstat(hfd, &st)
		// Its pages may not be allocatable (no huge pages reserved): the
		// descriptor is still no plain memfd, EINVAL ahead of EFAULT.
		try("an MFD_HUGETLB memfd", unix.EINVAL, vendorEmu, 0, 2<<20, emuHandle(uint32(os.Getpid()), uint32(hfd), 2<<20, st.Ino, 0))
		unix.Close(hfd)
	}
	// EINVAL: the inode is not the one the handle names.
	for _, ino := range []uint64{m.ino + 1, m.ino - 1, 0, ^uint64(0)} {
		h := emuHandle(uint32(os.Getpid()), uint32(m.fd), size, ino, 0)
		try(fmt.Sprintf("handle inode %d (the memfd's is %d)", ino, m.ino), unix.EINVAL, vendorEmu, 0, size, h)
	}
	// Another memfd's inode, the descriptor of this one.
	other := newEmu(t, "phxemu-other", 2*emuPage, 0)
	try("the inode of another memfd", unix.EINVAL, vendorEmu, 0, size, emuHandle(uint32(os.Getpid()), uint32(m.fd), size, other.ino, 0))
	// EINVAL: for another device.
	try("a device-1 handle on device 0", unix.EINVAL, vendorEmu, 0, size, m.handle(1))
	try("a device-0 handle on device 1", unix.EINVAL, vendorEmu, 1, size, m.handle(0))
	// EINVAL: smaller than size.
	try("a handle of 64 KiB registering 128 KiB", unix.EINVAL, vendorEmu, 0, size,
		emuHandle(uint32(os.Getpid()), uint32(m.fd), emuPage, m.ino, 0))
	try("a handle (and memfd) of 128 KiB registering 192 KiB", unix.EINVAL, vendorEmu, 0, size+emuPage,
		emuHandle(uint32(os.Getpid()), uint32(m.fd), size+emuPage, m.ino, 0))
	// EFAULT: fewer than size bytes allocated.
	sparse, err := makeEmu("phxemu-sparse", 4*emuPage, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer sparse.close()
	try("a sparse memfd", unix.EFAULT, vendorEmu, 0, 4*emuPage, sparse.handle(0))
	if _, err := unix.Pwrite(sparse.fd, bytes.Repeat([]byte{1}, emuPage), emuPage); err != nil {
		t.Fatal(err)
	}
	try("a memfd with 64 of 256 KiB allocated, registering 128 KiB", unix.EFAULT, vendorEmu, 0, 2*emuPage, sparse.handle(0))
	try("a memfd with 64 of 256 KiB allocated, registering 64 KiB", 0, vendorEmu, 0, emuPage, sparse.handle(0))
	// EACCES: the exporter's descriptor is write-only.
	wfd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", m.fd), unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	try("a write-only descriptor", unix.EACCES, vendorEmu, 0, size, emuHandle(uint32(os.Getpid()), uint32(wfd), size, m.ino, 0))
	unix.Close(wfd)
	// ENODEV: another vendor, no such device.
	for _, v := range []uint32{vendorNvidia, vendorPcibar, 4, 0xFFFFFFFF} {
		try(fmt.Sprintf("vendor %d", v), unix.ENODEV, v, 0, size, m.handle(0))
	}
	for _, dev := range []uint32{x.ndev, maxDevice - 1, maxDevice, maxDevice + 1, 0x7FFFFFFF, 0xFFFFFFFF} {
		try(fmt.Sprintf("device %d", dev), unix.ENODEV, vendorEmu, dev, size, m.handle(dev))
	}
	// EPERM: exported by another process.
	c := startABIChild(t, nil)
	h, err := hex.DecodeString(c.do(t, "memfd %d", 2*emuPage))
	if err != nil || len(h) != 64 {
		t.Fatalf("the child's handle: %v", err)
	}
	try("a handle another process exported", unix.EPERM, vendorEmu, 0, size, h)
	try("a handle naming process 1", unix.EPERM, vendorEmu, 0, size, emuHandle(1, uint32(m.fd), size, m.ino, 0))
	c.exit(t)
	// ESRCH: the exporting descriptor no longer exists.
	gone, err := makeEmu("phxemu-gone", emuPage, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	gh := gone.handle(0)
	gfd := gone.fd
	gone.close()
	if _, err := unix.FcntlInt(uintptr(gfd), unix.F_GETFD, 0); err != unix.EBADF {
		t.Fatalf("descriptor %d was reused before the REGISTER", gfd)
	}
	try("a handle whose descriptor was closed", unix.ESRCH, vendorEmu, 0, emuPage, gh)
	// The valid registration after all that: the memfd was never harmed.
	r := x.reg(t, fd, m)
	if n, e := abiIO(t, fd, false, r.id, 0, size, 0); e != 0 || n != int64(size) || !bytes.Equal(m.mem, x.data[:size]) {
		t.Errorf("READ after the refused REGISTERs: %d, %s", n, errName(e))
	}
}

// readAt is what the caller expects a READ of n at fo to land.
func (x *abiFixture) want(n, fo uint64) []byte {
	if fo >= uint64(len(x.data)) {
		return nil
	}
	return x.data[fo:min(fo+n, uint64(len(x.data)))]
}

// landed checks that mem holds want at off and 0xA5 everywhere else.
func landed(t testing.TB, what string, mem []byte, off uint64, want []byte) {
	t.Helper()
	if !bytes.Equal(mem[off:off+uint64(len(want))], want) {
		t.Errorf("%s: the %d bytes at buffer offset %d differ from the file's", what, len(want), off)
	}
	if !allBytes(mem[:off], 0xA5) || !allBytes(mem[off+uint64(len(want)):], 0xA5) {
		t.Errorf("%s: bytes outside [%d, %d) of the buffer changed", what, off, off+uint64(len(want)))
	}
}

// "READ and WRITE": landed bytes, short reads at end of file, writes that
// extend the file and that readers through the mount see at once.
func (x *abiFixture) readWrite(t *testing.T) {
	fd := openFD(t, x.f, unix.O_RDONLY)
	m := newEmu(t, "phxemu-rw", 32*emuPage, 0)
	r := x.reg(t, fd, m)
	size := uint64(m.size)
	for _, c := range []struct{ bo, n, fo uint64 }{
		{4103, 100000, 333},
		{0, abiFileSize, 0},
		{5, 4096, abiFileSize - 100},   // short at end of file
		{0, 4096, abiFileSize},         // at end of file: 0
		{0, 4096, abiFileSize + 1<<30}, // past it: 0
		{7, 0, 10},                     // nothing asked
		{size, 0, 0},                   // nothing, at the buffer's end: inside it
		{size - 4096, 4096, 4096},      // the buffer's last bytes
		{0, 4096, two63 - 1 - 4096},    // the file's last possible range: 0
	} {
		what := fmt.Sprintf("READ bo %d n %d fo %d", c.bo, c.n, c.fo)
		fill(m.mem, 0xA5)
		before := x.counters(t)
		n, e := abiIO(t, fd, false, r.id, c.bo, c.n, c.fo)
		w := x.want(c.n, c.fo)
		if e != 0 || n != int64(len(w)) {
			t.Errorf("%s: %d, %s; want %d", what, n, errName(e), len(w))
			continue
		}
		landed(t, what, m.mem, c.bo, w)
		after := x.counters(t)
		if d := after["ioctl_bytes_read"] - before["ioctl_bytes_read"]; d != int64(len(w)) {
			t.Errorf("%s: ioctl_bytes_read grew by %d", what, d)
		}
		if d := after["ioctl_extents"] - before["ioctl_extents"]; d != 1 {
			t.Errorf("%s: ioctl_extents grew by %d", what, d)
		}
		failed := int64(0)
		if uint64(len(w)) != c.n {
			failed = 1
		}
		if d := after["ioctl_failed_extents"] - before["ioctl_failed_extents"]; d != failed {
			t.Errorf("%s: ioctl_failed_extents grew by %d, want %d", what, d, failed)
		}
	}
	// "Threads of the owner may use it concurrently": four threads, each
	// its own quarter of the buffer, again and again.
	fill(m.mem, 0xA5)
	quarter := size / 4
	errc := make(chan error, 4)
	for q := uint64(0); q < 4; q++ {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for round := uint64(0); round < 20; round++ {
				fo := (q*7919 + round*4096) % (abiFileSize - quarter)
				n, e := abiIO(t, fd, false, r.id, q*quarter, quarter, fo)
				if e != 0 || n != int64(quarter) || !bytes.Equal(m.mem[q*quarter:(q+1)*quarter], x.data[fo:fo+quarter]) {
					errc <- fmt.Errorf("thread %d round %d: %d, %s, or other bytes", q, round, n, errName(e))
					return
				}
			}
			errc <- nil
		}()
	}
	for range 4 {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
	// A READ on a descriptor opened O_RDWR|O_APPEND is no write: it works.
	afd := openFD(t, x.f, unix.O_RDWR|unix.O_APPEND)
	fill(m.mem, 0xA5)
	if n, e := abiIO(t, afd, false, r.id, 0, 4096, 4096); e != 0 || n != 4096 {
		t.Errorf("READ on an O_APPEND descriptor: %d, %s", n, errName(e))
	} else {
		landed(t, "READ on an O_APPEND descriptor", m.mem, 0, x.data[4096:8192])
	}

	// WRITE: a new file, written past its end (a hole before), then
	// overwritten in the middle of what a reader of the mount has cached.
	wpath := filepath.Join(x.d.Mnt, "w")
	wfd := openFD(t, wpath, unix.O_RDWR|unix.O_CREAT)
	src := pattern(int(size), 0x31)
	copy(m.mem, src)
	wr := x.counters(t)["ioctl_bytes_written"]
	if n, e := abiIO(t, wfd, true, r.id, 10, 70000, 1000); e != 0 || n != 70000 {
		t.Fatalf("WRITE of 70000 bytes at 1000 of an empty file: %d, %s", n, errName(e))
	}
	model := append(make([]byte, 1000), src[10:70010]...)
	var st unix.Stat_t
	if err := unix.Stat(wpath, &st); err != nil || st.Size != int64(len(model)) {
		t.Errorf("stat through the mount right after the WRITE: size %d, %v; want %d", st.Size, err, len(model))
	}
	mustEqualFile(t, wpath, model)
	if d := x.counters(t)["ioctl_bytes_written"] - wr; d != 70000 {
		t.Errorf("ioctl_bytes_written grew by %d, want 70000", d)
	}
	copy(m.mem, pattern(int(size), 0x77))
	if n, e := abiIO(t, wfd, true, r.id, 333, 5000, 20000); e != 0 || n != 5000 {
		t.Fatalf("WRITE over cached bytes: %d, %s", n, errName(e))
	}
	copy(model[20000:], m.mem[333:5333])
	mustEqualFile(t, wpath, model)
	mustEqualFile(t, filepath.Join(x.d.Backing, "w"), model)
	if n, e := abiIO(t, wfd, true, r.id, 0, 0, 1<<20); e != 0 || n != 0 {
		t.Errorf("WRITE of 0 bytes past the end: %d, %s", n, errName(e))
	}
	mustEqualFile(t, wpath, model)
}

// counters reads every counter from user.phx.info of the mount root.
func (x *abiFixture) counters(t testing.TB) map[string]int64 {
	t.Helper()
	info := phxInfo(t, x.d.Mnt)
	c := map[string]int64{}
	for _, k := range infoCounterKeys {
		v, err := strconv.ParseInt(info[k], 10, 64)
		if err != nil {
			t.Fatalf("user.phx.info %s = %q", k, info[k])
		}
		c[k] = v
	}
	return c
}

// badOffsets break "Offsets and lengths are u64 but must be below 2^63,
// and file_offset + length must be below 2^63".
var badOffsets = []struct{ bo, n, fo uint64 }{
	{two63, 1, 0}, {0, two63, 0}, {0, 1, two63},
	{^uint64(0), 1, 0}, {0, ^uint64(0), 0}, {0, 1, ^uint64(0)},
	{0, 4096, two63 - 4096}, {0, 1, two63 - 1}, {0, two63 - 1, 1},
	{two63, two63, two63},
}

// The READ/WRITE error table, one error at a time; nothing moves.
func (x *abiFixture) readWriteErrors(t *testing.T) {
	spath := filepath.Join(x.d.Backing, "scratch")
	sdata := writePattern(t, spath, 100000, 0644)
	mpath := filepath.Join(x.d.Mnt, "scratch")
	rfd := openFD(t, mpath, unix.O_RDONLY)
	rwfd := openFD(t, mpath, unix.O_RDWR)
	wfd := openFD(t, mpath, unix.O_WRONLY)
	dfd := openFD(t, x.dir, unix.O_RDONLY|unix.O_DIRECTORY)
	m := newEmu(t, "phxemu-rwerr", 4*emuPage, 0)
	r := x.reg(t, rfd, m)
	size := uint64(m.size)
	both := func(what string, fd int, bo, n, fo uint64, want unix.Errno) {
		t.Helper()
		for _, w := range []bool{false, true} {
			_, e := abiIO(t, fd, w, r.id, bo, n, fo)
			wantErrno(t, fmt.Sprintf("%s (write %v)", what, w), e, want)
		}
	}
	for _, c := range badOffsets {
		both(fmt.Sprintf("bo %#x n %#x fo %#x", c.bo, c.n, c.fo), rwfd, c.bo, c.n, c.fo, unix.EINVAL)
	}
	both("a directory", dfd, 0, 4096, 0, unix.EISDIR)
	_, e := abiIO(t, rfd, true, r.id, 0, 4096, 0)
	wantErrno(t, "WRITE on an O_RDONLY descriptor", e, unix.EBADF)
	_, e = abiIO(t, wfd, false, r.id, 0, 4096, 0)
	wantErrno(t, "READ on an O_WRONLY descriptor", e, unix.EBADF)
	for _, fl := range []int{unix.O_WRONLY | unix.O_APPEND, unix.O_RDWR | unix.O_APPEND} {
		_, e = abiIO(t, openFD(t, mpath, fl), true, r.id, 0, 4096, 0)
		wantErrno(t, fmt.Sprintf("WRITE on an O_APPEND descriptor (flags %#o)", fl), e, unix.EINVAL)
	}
	for _, id := range []uint64{0, r.id + 1_000_000, ^uint64(0), two63} {
		for _, w := range []bool{false, true} {
			_, e := abiIO(t, rwfd, w, id, 0, 4096, 0)
			wantErrno(t, fmt.Sprintf("id %d (write %v)", id, w), e, unix.ENOENT)
		}
	}
	for _, c := range []struct{ bo, n uint64 }{{size, 1}, {size - 4096, 4097}, {0, size + 1}, {two63 - 1, 1}, {two63 - 1, two63 - 1}, {size + 4096, 4096}, {size + 1, 0}} {
		both(fmt.Sprintf("buffer range [%d, +%d)", c.bo, c.n), rwfd, c.bo, c.n, 0, unix.EFAULT)
	}
	if !allBytes(m.mem, 0xA5) {
		t.Errorf("a refused READ moved bytes into the buffer")
	}
	mustEqualFile(t, spath, sdata)
	// A refused ioctl counts as a call and as rejected.
	before := x.counters(t)
	_, e = abiIO(t, rwfd, false, 0, 0, 1, 0)
	wantErrno(t, "READ of id 0", e, unix.ENOENT)
	after := x.counters(t)
	if after["ioctl_calls"]-before["ioctl_calls"] != 1 || after["ioctl_rejected"]-before["ioctl_rejected"] != 1 {
		t.Errorf("a refused READ: ioctl_calls grew by %d, ioctl_rejected by %d; want 1 and 1",
			after["ioctl_calls"]-before["ioctl_calls"], after["ioctl_rejected"]-before["ioctl_rejected"])
	}
	// O_DIRECT: an extent not aligned to the file's O_DIRECT alignment
	// (INFO) is the storage's EINVAL; an aligned one lands.
	dfdirect := openFD(t, mpath, unix.O_RDONLY|unix.O_DIRECT)
	in, e := abiInfo(t, dfdirect, 0)
	if e != 0 || in.dioOff == 0 || in.dioMem == 0 {
		t.Fatalf("INFO on an O_DIRECT descriptor of an ext4 file: %s, dio_offset_align %d, dio_mem_align %d", errName(e), in.dioOff, in.dioMem)
	}
	al := uint64(max(in.dioOff, in.dioMem))
	_, e = abiIO(t, dfdirect, false, r.id, 0, al, 1)
	wantErrno(t, "an O_DIRECT READ at an unaligned file offset", e, unix.EINVAL)
	if !allBytes(m.mem, 0xA5) {
		t.Errorf("the refused O_DIRECT READ moved bytes")
	}
	if n, e := abiIO(t, dfdirect, false, r.id, al, 4*al, al); e != 0 || n != int64(4*al) {
		t.Errorf("an aligned O_DIRECT READ: %d, %s", n, errName(e))
	} else {
		landed(t, "an aligned O_DIRECT READ", m.mem, al, sdata[al:5*al])
	}
	// The bound itself: the whole buffer.
	if n, e := abiIO(t, rwfd, false, r.id, 0, size, 0); e != 0 || n != int64(len(sdata)) {
		t.Errorf("READ of the whole buffer: %d, %s", n, errName(e))
	}
}

// "When several errors apply, the first in this order is returned".
func (x *abiFixture) readWriteErrorOrder(t *testing.T) {
	mpath := filepath.Join(x.d.Mnt, "scratch")
	rfd := openFD(t, mpath, unix.O_RDONLY)
	wfd := openFD(t, mpath, unix.O_WRONLY)
	afd := openFD(t, mpath, unix.O_WRONLY|unix.O_APPEND)
	rafd := openFD(t, mpath, unix.O_RDONLY|unix.O_APPEND)
	dfd := openFD(t, x.dir, unix.O_RDONLY|unix.O_DIRECTORY)
	m := newEmu(t, "phxemu-order", emuPage, 0)
	r := x.reg(t, rfd, m)
	const bogus = 1 << 40
	for _, c := range []struct {
		what  string
		fd    int
		write bool
		msg   []byte
		want  unix.Errno
	}{
		{"bad magic on a directory", dfd, false, func() []byte { b := ioMsg(bogus, 0, 1, 0); put32(b, 0, 0); return b }(), unix.EINVAL},
		{"offset ≥ 2^63 on a directory", dfd, false, ioMsg(bogus, two63, 1, 0), unix.EINVAL},
		{"offset ≥ 2^63 of a WRITE on O_RDONLY", rfd, true, ioMsg(r.id, 0, 1, two63), unix.EINVAL},
		{"offset ≥ 2^63 and a range past the buffer", rfd, false, ioMsg(r.id, two63, 1, 0), unix.EINVAL},
		{"length ≥ 2^63 and a range past the buffer", rfd, false, ioMsg(r.id, 0, two63, 0), unix.EINVAL},
		{"a directory and no such buffer (READ)", dfd, false, ioMsg(bogus, 0, 1, 0), unix.EISDIR},
		{"a directory and no such buffer (WRITE)", dfd, true, ioMsg(bogus, 0, 1, 0), unix.EISDIR},
		{"WRITE on O_RDONLY and no such buffer", rfd, true, ioMsg(bogus, 0, 1, 0), unix.EBADF},
		{"READ on O_WRONLY and no such buffer", wfd, false, ioMsg(bogus, 0, 1, 0), unix.EBADF},
		{"WRITE on O_RDONLY|O_APPEND", rafd, true, ioMsg(r.id, 0, 1, 0), unix.EBADF},
		{"WRITE on O_APPEND and no such buffer", afd, true, ioMsg(bogus, 0, 1, 0), unix.EINVAL},
		{"WRITE on O_APPEND and a range past the buffer", afd, true, ioMsg(r.id, emuPage, 1, 0), unix.EINVAL},
		{"no such buffer and a range past any", rfd, false, ioMsg(bogus, 1<<40, 1, 0), unix.ENOENT},
	} {
		_, e := abiIOMsg(t, c.fd, c.write, c.msg)
		wantErrno(t, c.what, e, c.want)
	}
	if !allBytes(m.mem, 0xA5) {
		t.Errorf("a refused READ moved bytes into the buffer")
	}
}

// "BATCH_READ and BATCH_WRITE": several buffers, any order, merged
// neighbours, short and empty extents, the capacity bound.
func (x *abiFixture) batch(t *testing.T) {
	fd := openFD(t, x.f, unix.O_RDONLY)
	ma := newEmu(t, "phxemu-ba", 8*emuPage, 0)
	mb := newEmu(t, "phxemu-bb", 4*emuPage, 0)
	ra, rb := x.reg(t, fd, ma), x.reg(t, fd, mb)
	ex := []ext{
		{rb.id, 100, 5000, 200000},
		{ra.id, 0, 4096, 8192},
		{ra.id, 4096, 4096, 12288},                    // follows on in the file and the buffer
		{ra.id, 3 * emuPage, 1000, abiFileSize - 300}, // short: 300
		{ra.id, 4 * emuPage, 10, abiFileSize + 5},     // past the end: 0
		{rb.id, 9000, 0, 0},                           // nothing asked: 0, not failed
		{ra.id, 5*emuPage + 1, 77777, 3},
		{rb.id, 2 * emuPage, 200, abiFileSize - 300},     // these two follow on and
		{rb.id, 2*emuPage + 200, 200, abiFileSize - 100}, // cross the end: 200, 100
	}
	before := x.counters(t)
	failed, res, e := abiBatch(t, fd, false, 10, ex)
	if e != 0 {
		t.Fatalf("BATCH_READ: %s", errName(e))
	}
	if failed != 3 {
		t.Errorf("failed = %d, want 3 (the two short extents and the one past the end)", failed)
	}
	wa, wb := bytes.Repeat([]byte{0xA5}, len(ma.mem)), bytes.Repeat([]byte{0xA5}, len(mb.mem))
	for i, x2 := range ex {
		w := x.want(x2.n, x2.fo)
		if res[i] != int64(len(w)) {
			t.Errorf("extent %d: result %d, want %d", i, res[i], len(w))
		}
		if x2.id == ra.id {
			copy(wa[x2.bo:], w)
		} else {
			copy(wb[x2.bo:], w)
		}
	}
	// "Buffer bytes past a short result are unspecified": the tails of
	// extents 3 and 8.
	copy(wa[3*emuPage+300:], ma.mem[3*emuPage+300:3*emuPage+1000])
	copy(wb[2*emuPage+300:], mb.mem[2*emuPage+300:2*emuPage+400])
	if !bytes.Equal(ma.mem, wa) || !bytes.Equal(mb.mem, wb) {
		t.Errorf("the buffers do not hold exactly the batch's extents")
	}
	after := x.counters(t)
	if d := after["ioctl_extents"] - before["ioctl_extents"]; d != int64(len(ex)) {
		t.Errorf("ioctl_extents grew by %d, want %d", d, len(ex))
	}
	if d := after["ioctl_failed_extents"] - before["ioctl_failed_extents"]; d != 3 {
		t.Errorf("ioctl_failed_extents grew by %d, want 3", d)
	}
	// The capacity bound, every slot used: 409 extents in reverse order.
	fill(ma.mem, 0xA5)
	full := make([]ext, maxExtents)
	for i := range full {
		full[i] = ext{ra.id, uint64(i) * 128, 64, uint64(maxExtents-i) * 1000}
	}
	failed, res, e = abiBatch(t, fd, false, maxExtents, full)
	if e != 0 || failed != 0 {
		t.Fatalf("a full batch of 409: %s, failed %d", errName(e), failed)
	}
	for i, x2 := range full {
		if res[i] != 64 || !bytes.Equal(ma.mem[x2.bo:x2.bo+64], x.data[x2.fo:x2.fo+64]) || !allBytes(ma.mem[x2.bo+64:x2.bo+128], 0xA5) {
			t.Fatalf("extent %d of the full batch: result %d, or its bytes differ", i, res[i])
		}
	}
	// BATCH_WRITE: two buffers into a new file, out of order, past its end.
	wpath := filepath.Join(x.d.Mnt, "bw")
	wfd := openFD(t, wpath, unix.O_RDWR|unix.O_CREAT)
	copy(ma.mem, pattern(len(ma.mem), 0x11))
	copy(mb.mem, pattern(len(mb.mem), 0x22))
	wex := []ext{{rb.id, 10, 3000, 50000}, {ra.id, 0, 4096, 0}, {ra.id, 4096, 4096, 4096}, {ra.id, 70000, 1, 100000}, {rb.id, 0, 0, 200000}}
	failed, res, e = abiBatch(t, wfd, true, 5, wex)
	if e != 0 || failed != 0 {
		t.Fatalf("BATCH_WRITE: %s, failed %d", errName(e), failed)
	}
	model := make([]byte, 100001)
	for i, x2 := range wex {
		if res[i] != int64(x2.n) {
			t.Errorf("write extent %d: result %d, want %d", i, res[i], x2.n)
		}
		src := ma.mem
		if x2.id == rb.id {
			src = mb.mem
		}
		if x2.n > 0 {
			copy(model[x2.fo:], src[x2.bo:x2.bo+x2.n])
		}
	}
	mustEqualFile(t, wpath, model)
}

// The batches' whole-ioctl and per-extent errors.
func (x *abiFixture) batchErrors(t *testing.T) {
	spath := filepath.Join(x.d.Backing, "bscratch")
	sdata := writePattern(t, spath, 100000, 0644)
	mpath := filepath.Join(x.d.Mnt, "bscratch")
	rfd := openFD(t, mpath, unix.O_RDONLY)
	rwfd := openFD(t, mpath, unix.O_RDWR)
	m := newEmu(t, "phxemu-berr", 4*emuPage, 0)
	r := x.reg(t, rfd, m)
	size := uint64(m.size)
	good := []ext{{r.id, 0, 4096, 0}}
	// Whole-ioctl errors: nothing moves.
	for _, c := range []struct {
		what  string
		fd    int
		write bool
		want  unix.Errno
	}{
		{"BATCH_READ on a directory", openFD(t, x.dir, unix.O_RDONLY|unix.O_DIRECTORY), false, unix.EISDIR},
		{"BATCH_WRITE on a directory", openFD(t, x.dir, unix.O_RDONLY|unix.O_DIRECTORY), true, unix.EISDIR},
		{"BATCH_WRITE on O_RDONLY", rfd, true, unix.EBADF},
		{"BATCH_READ on O_WRONLY", openFD(t, mpath, unix.O_WRONLY), false, unix.EBADF},
		{"BATCH_WRITE on O_APPEND", openFD(t, mpath, unix.O_WRONLY|unix.O_APPEND), true, unix.EINVAL},
	} {
		_, _, e := abiBatch(t, c.fd, c.write, 2, good)
		wantErrno(t, c.what, e, c.want)
	}
	// Per-extent errors among good extents, which still run.
	const bogus = 1 << 40
	bad := []struct {
		e    ext
		want unix.Errno
	}{
		{ext{r.id, 0, 1, two63}, unix.EINVAL},
		{ext{r.id, 0, 4096, two63 - 4096}, unix.EINVAL},
		{ext{r.id, two63, 1, 0}, unix.EINVAL},
		{ext{r.id, 0, two63, 0}, unix.EINVAL},
		{ext{bogus, two63, 1, 0}, unix.EINVAL}, // malformed before the buffer
		{ext{bogus, 0, 1, 0}, unix.ENOENT},
		{ext{0, 0, 1, 0}, unix.ENOENT},
		{ext{bogus, size, 1, 0}, unix.ENOENT}, // the buffer before its range
		{ext{r.id, size, 1, 0}, unix.EFAULT},
		{ext{r.id, size - 10, 11, 0}, unix.EFAULT},
		{ext{r.id, two63 - 1, two63 - 1, 0}, unix.EFAULT},
	}
	for _, w := range []bool{false, true} {
		fd := rfd
		if w {
			fd = rwfd
			copy(m.mem, pattern(int(size), 0x55))
		} else {
			fill(m.mem, 0xA5)
		}
		ex := []ext{{r.id, 100, 1000, 50000}}
		for _, b := range bad {
			ex = append(ex, b.e)
		}
		ex = append(ex, ext{r.id, 2 * emuPage, 2000, 1000})
		failed, res, e := abiBatch(t, fd, w, len(ex)+1, ex)
		if e != 0 {
			t.Fatalf("a batch (write %v) with bad extents: %s", w, errName(e))
		}
		if failed != uint32(len(bad)) {
			t.Errorf("batch (write %v): failed %d, want %d", w, failed, len(bad))
		}
		for i, b := range bad {
			if res[i+1] != -int64(b.want) {
				t.Errorf("batch (write %v) extent %+v: result %d, want -%s", w, b.e, res[i+1], errName(b.want))
			}
		}
		if res[0] != 1000 || res[len(ex)-1] != 2000 {
			t.Errorf("batch (write %v): the good extents moved %d and %d", w, res[0], res[len(ex)-1])
		}
		if !w {
			want := bytes.Repeat([]byte{0xA5}, int(size))
			copy(want[100:], sdata[50000:51000])
			copy(want[2*emuPage:], sdata[1000:3000])
			if !bytes.Equal(m.mem, want) {
				t.Errorf("BATCH_READ: the buffer holds more or less than the good extents")
			}
		} else {
			copy(sdata[50000:], m.mem[100:1100])
			copy(sdata[1000:], m.mem[2*emuPage:2*emuPage+2000])
		}
	}
	mustEqualFile(t, spath, sdata)
	// A batch write that does change the file: only the good extent lands.
	copy(m.mem, pattern(int(size), 0x44))
	failed, res, e := abiBatch(t, rwfd, true, 3, []ext{{bogus, 0, 100, 0}, {r.id, 10, 100, 500}, {r.id, size, 1, 0}})
	if e != 0 || failed != 2 || res[0] != -int64(unix.ENOENT) || res[1] != 100 || res[2] != -int64(unix.EFAULT) {
		t.Fatalf("BATCH_WRITE with two bad extents: %s, failed %d, %v", errName(e), failed, res)
	}
	copy(sdata[500:], m.mem[10:110])
	mustEqualFile(t, spath, sdata)
}

// "BATCH_READ_STRIDED and BATCH_WRITE_STRIDED": column slices, short
// pieces at end of file, the capacity and max_pieces bounds.
func (x *abiFixture) strided(t *testing.T) {
	const rows, rowBytes = 64, 1000
	mdata, mpath := x.file(t, "mat", rows*rowBytes, 0644)
	fd := openFD(t, mpath, unix.O_RDWR)
	m := newEmu(t, "phxemu-str", 4*emuPage, 0)
	r := x.reg(t, fd, m)
	failed, res, e := abiStrided(t, fd, false, 3, []sext{
		{r.id, 3, 250, 200, rows, rowBytes, 256},       // a column slice
		{r.id, 2 * emuPage, 1000, 5000, 3, 1000, 1000}, // three whole rows
	})
	if e != 0 || failed != 0 || res[0] != rows*250 || res[1] != 3000 {
		t.Fatalf("BATCH_READ_STRIDED: %s, failed %d, results %v", errName(e), failed, res)
	}
	want := bytes.Repeat([]byte{0xA5}, len(m.mem))
	for j := 0; j < rows; j++ {
		copy(want[3+256*j:], mdata[200+rowBytes*j:][:250])
	}
	copy(want[2*emuPage:], mdata[5000:8000])
	if !bytes.Equal(m.mem, want) {
		t.Errorf("the strided read's pieces (or the gaps between them) differ")
	}
	// One piece: empty, or with strides shorter than it (nothing overlaps).
	fill(m.mem, 0xA5)
	failed, res, e = abiStrided(t, fd, false, 2, []sext{{r.id, 0, 0, 0, 1, 0, 0}, {r.id, 8, 100, 10, 1, 0, 0}})
	if e != 0 || failed != 0 || res[0] != 0 || res[1] != 100 {
		t.Errorf("single-piece strided extents: %s, failed %d, results %v", errName(e), failed, res)
	}
	landed(t, "a single piece with stride 0", m.mem, 8, mdata[10:110])
	// Short at end of file: pieces at 61500, 62500 (whole), 63500 (500 of
	// 1000), 64500 and 65500 (past the end).
	fill(m.mem, 0xA5)
	failed, res, e = abiStrided(t, fd, false, 1, []sext{{r.id, 0, 1000, 61500, 5, 1000, 1000}})
	if e != 0 || failed != 1 || res[0] != 2500 {
		t.Errorf("a strided extent crossing the end of file: %s, failed %d, result %v; want 2500", errName(e), failed, res)
	}
	if !bytes.Equal(m.mem[:2500], mdata[61500:64000]) {
		t.Errorf("the strided read crossing the end of file landed other bytes")
	}
	// The capacity bound: 255 extents of 2 pieces each.
	fill(m.mem, 0xA5)
	full := make([]sext, maxStridedExtents)
	for i := range full {
		full[i] = sext{r.id, uint64(i) * 64, 16, uint64(i) * 200, 2, 100, 32}
	}
	failed, res, e = abiStrided(t, fd, false, maxStridedExtents, full)
	if e != 0 || failed != 0 {
		t.Fatalf("a full strided batch of 255: %s, failed %d", errName(e), failed)
	}
	for i, s := range full {
		if res[i] != 32 || !bytes.Equal(m.mem[s.bo:s.bo+16], mdata[s.fo:s.fo+16]) || !bytes.Equal(m.mem[s.bo+32:s.bo+48], mdata[s.fo+100:s.fo+116]) {
			t.Fatalf("extent %d of the full strided batch: result %d, or its bytes differ", i, res[i])
		}
	}
	// max_pieces, at the bound: 65,536 one-byte pieces, in one extent and
	// split over two (of "f", which is longer than 65,536 bytes).
	ffd := openFD(t, x.f, unix.O_RDONLY)
	for _, ex := range [][]sext{
		{{r.id, 0, 1, 0, maxPieces, 1, 3}},
		{{r.id, 0, 1, 0, maxPieces / 2, 1, 3}, {r.id, 1, 1, maxPieces / 2, maxPieces / 2, 1, 3}},
	} {
		fill(m.mem, 0xA5)
		failed, res, e = abiStrided(t, ffd, false, 2, ex)
		if e != 0 || failed != 0 {
			t.Fatalf("%d extents of %d pieces in all: %s, failed %d", len(ex), maxPieces, errName(e), failed)
		}
		for i := range ex {
			if res[i] != int64(ex[i].count) {
				t.Errorf("extent %d: result %d, want %d", i, res[i], ex[i].count)
			}
		}
		for j := range ex[0].count {
			if m.mem[3*j] != x.data[j] {
				t.Fatalf("piece %d of the max_pieces extent differs", j)
			}
		}
	}
	// BATCH_WRITE_STRIDED: a column slice into the rows of the file.
	copy(m.mem, pattern(len(m.mem), 0x66))
	failed, res, e = abiStrided(t, fd, true, 1, []sext{{r.id, 7, 100, 300, rows, rowBytes, 128}})
	if e != 0 || failed != 0 || res[0] != rows*100 {
		t.Fatalf("BATCH_WRITE_STRIDED: %s, failed %d, result %v", errName(e), failed, res)
	}
	for j := 0; j < rows; j++ {
		copy(mdata[300+rowBytes*j:], m.mem[7+128*j:][:100])
	}
	mustEqualFile(t, filepath.Join(x.d.Backing, "mat"), mdata)
}

// The strided batches' errors: E2BIG first, then the batch's.
func (x *abiFixture) stridedErrors(t *testing.T) {
	sdata, mpath := x.file(t, "sscratch", 100000, 0644)
	spath := filepath.Join(x.d.Backing, "sscratch")
	rfd := openFD(t, mpath, unix.O_RDONLY)
	rwfd := openFD(t, mpath, unix.O_RDWR)
	m := newEmu(t, "phxemu-serr", 4*emuPage, 0)
	r := x.reg(t, rfd, m)
	size := uint64(m.size)
	// E2BIG: more than 65,536 pieces, counted however the sum wraps; on
	// any descriptor; nothing moves.
	over := [][]sext{
		{{r.id, 0, 1, 0, maxPieces + 1, 1, 1}},
		{{r.id, 0, 1, 0, maxPieces, 1, 1}, {r.id, 0, 1, 0, 1, 1, 1}},
		{{r.id, 0, 1, 0, 1 << 32, 1, 1}},
		{{r.id, 0, 1, 0, two63, 1, 1}, {r.id, 0, 1, 0, two63, 1, 1}}, // sums to 2^64
		{{r.id, 0, 1, 0, ^uint64(0), 1, 1}, {r.id, 0, 1, 0, 2, 1, 1}},
		{{1 << 40, 0, 1, 0, maxPieces + 1, 1, 1}},
	}
	fds := []struct {
		what  string
		fd    int
		write bool
	}{
		{"read", rfd, false},
		{"write", rwfd, true},
		{"read on a directory", openFD(t, x.dir, unix.O_RDONLY|unix.O_DIRECTORY), false},
		{"write on a directory", openFD(t, x.dir, unix.O_RDONLY|unix.O_DIRECTORY), true},
		{"write on O_RDONLY", rfd, true},
		{"read on O_WRONLY", openFD(t, mpath, unix.O_WRONLY), false},
		{"write on O_APPEND", openFD(t, mpath, unix.O_WRONLY|unix.O_APPEND), true},
	}
	for i, ex := range over {
		for _, f := range fds {
			_, _, e := abiStrided(t, f.fd, f.write, 2, ex)
			wantErrno(t, fmt.Sprintf("%s of case %d (%d extents)", f.what, i, len(ex)), e, unix.E2BIG)
		}
	}
	// The header is checked first.
	b := stridedMsg(1, over[0])
	put32(b, 0, 0)
	wantErrno(t, "a bad magic and too many pieces", abiIoctl(t, rfd, cmdStrided(false, 1), b), unix.EINVAL)
	// Per-extent errors.
	const bogus = 1 << 40
	bad := []struct {
		e    sext
		want unix.Errno
	}{
		{sext{r.id, 0, 100, 0, 0, 100, 100}, unix.EINVAL},           // count 0
		{sext{r.id, 0, 0, 0, 2, 100, 100}, unix.EINVAL},             // empty pieces
		{sext{r.id, 0, 200, 0, 2, 100, 200}, unix.EINVAL},           // file stride < length
		{sext{r.id, 0, 200, 0, 2, 200, 100}, unix.EINVAL},           // buffer stride < length
		{sext{r.id, 0, 1, 0, 2, two63, 1}, unix.EINVAL},             // the last piece starts at 2^63 in the file
		{sext{r.id, 0, 100, two63 - 150, 2, 100, 100}, unix.EINVAL}, // ... ends past it
		{sext{r.id, 0, 1, 0, 3, 1 << 62, 1}, unix.EINVAL},           // 2·2^62
		{sext{r.id, 0, 1, 0, 2, ^uint64(0), 1}, unix.EINVAL},        // the product wraps
		{sext{r.id, 0, 1, 0, 2, 1, two63}, unix.EINVAL},             // ... starts at 2^63 in the buffer
		{sext{r.id, 0, 1, 0, 2, 1, ^uint64(0)}, unix.EINVAL},        // the buffer product wraps
		{sext{r.id, two63, 1, 0, 1, 1, 1}, unix.EINVAL},             // an offset ≥ 2^63
		{sext{r.id, 0, two63, 0, 1, two63, two63}, unix.EINVAL},     // a length ≥ 2^63
		{sext{bogus, 0, 1, 0, 2, two63, 1}, unix.EINVAL},            // malformed before the buffer
		{sext{bogus, 0, 100, 0, 2, 100, 100}, unix.ENOENT},          //
		{sext{bogus, size, 100, 0, 2, 100, 100}, unix.ENOENT},       // the buffer before its range
		{sext{r.id, 0, 1, 0, 2, 1, size}, unix.EFAULT},              // the last piece starts at the end
		{sext{r.id, size - 100, 100, 0, 2, 100, 100}, unix.EFAULT},  //
		{sext{r.id, two63 - 1, 1, 0, 1, 1, 1}, unix.EFAULT},         //
		{sext{r.id, 0, 2 * emuPage, 0, 3, 2 * emuPage, 2 * emuPage}, unix.EFAULT},
	}
	for _, w := range []bool{false, true} {
		fd := rfd
		if w {
			fd = rwfd
			copy(m.mem, pattern(int(size), 0x56))
		} else {
			fill(m.mem, 0xA5)
		}
		ex := []sext{{r.id, 100, 10, 50000, 3, 20, 30}}
		var wantRes []int64
		for _, b := range bad {
			ex = append(ex, b.e)
			wantRes = append(wantRes, -int64(b.want))
		}
		failed, res, e := abiStrided(t, fd, w, len(ex), ex)
		if e != 0 {
			t.Fatalf("a strided batch (write %v) with bad extents: %s", w, errName(e))
		}
		if failed != uint32(len(wantRes)) {
			t.Errorf("strided batch (write %v): failed %d, want %d", w, failed, len(wantRes))
		}
		for i, wr := range wantRes {
			if res[i+1] != wr {
				t.Errorf("strided (write %v) extent %+v: result %d, want %d", w, ex[i+1], res[i+1], wr)
			}
		}
		if res[0] != 30 {
			t.Errorf("strided (write %v): the good extent moved %d, want 30", w, res[0])
		}
		if !w {
			want := bytes.Repeat([]byte{0xA5}, int(size))
			for j := 0; j < 3; j++ {
				copy(want[100+30*j:], sdata[50000+20*j:][:10])
			}
			if !bytes.Equal(m.mem, want) {
				t.Errorf("BATCH_READ_STRIDED: the buffer holds more or less than the good extent")
			}
		} else {
			for j := 0; j < 3; j++ {
				copy(sdata[50000+20*j:], m.mem[100+30*j:][:10])
			}
		}
	}
	mustEqualFile(t, spath, sdata)
}

// "INFO", and that it agrees with user.phx.info.
func (x *abiFixture) info(t *testing.T) {
	fd := openFD(t, x.f, unix.O_RDONLY)
	for _, p := range []string{x.f, x.dir, x.d.Mnt} {
		pfd := openFD(t, p, unix.O_RDONLY)
		for dev := int32(0); dev < int32(x.ndev); dev++ {
			in, e := abiInfo(t, pfd, dev)
			if e != 0 {
				t.Errorf("INFO device %d on %s: %s", dev, p, errName(e))
				continue
			}
			if in.dev != dev || in.transport != transportHost || in.flags&(1<<2) == 0 || in.flags&(1<<1) != 0 ||
				in.workers == 0 || in.pageSize != emuPage || in.ndev != x.ndev || in.vendor != "emu" ||
				(in.engine != "io_uring" && in.engine != "sync") || in.cache > 4 || in.pci == "" || in.name == "" ||
				!allBytes(in.reserved, 0) {
				t.Errorf("INFO device %d on %s: %+v", dev, p, in)
			}
			if in.flags>>6 != 0 {
				t.Errorf("INFO flags %#x: bits past 5 are set", in.flags)
			}
			if !pciRE.MatchString(in.pci) {
				t.Errorf("INFO device %d: PCI address %q is not written as sysfs does", dev, in.pci)
			}
			if dev == 1 {
				in0, _ := abiInfo(t, pfd, 0)
				if in0.pci == in.pci {
					t.Errorf("devices 0 and 1 have the same PCI address %q", in.pci)
				}
			}
		}
	}
	for _, dev := range []int32{int32(x.ndev), -1, maxDevice, maxDevice + 1, 0x7FFFFFFF, -0x80000000} {
		_, e := abiInfo(t, fd, dev)
		wantErrno(t, fmt.Sprintf("INFO device %d", dev), e, unix.ENODEV)
	}
	// user.phx.info says the same; the counters are the same counters
	// (read around INFO: each is between the two readings; buffers_live
	// may fall meanwhile, as the releases of earlier subtests' closes
	// come in).
	before := phxInfo(t, x.f)
	in, _ := abiInfo(t, fd, 0)
	after := phxInfo(t, x.f)
	for k, v := range map[string]string{
		"vendor": in.vendor, "page_size": fmt.Sprint(in.pageSize), "workers": fmt.Sprint(in.workers),
		"transport": "host", "read_only": "false", "device": "0", "pci": in.pci, "device_name": in.name,
		"dio_mem_align": fmt.Sprint(in.dioMem), "dio_offset_align": fmt.Sprint(in.dioOff),
		"bounce_size": fmt.Sprint(in.bounceSize), "cache": []string{"", "off", "watch", "revalidate", "exclusive"}[min(in.cache, 4)],
	} {
		if before[k] != v {
			t.Errorf("user.phx.info %s=%q, INFO says %q", k, before[k], v)
		}
	}
	for bit, c := range map[int]bool{
		0: before["passthrough"] == "active",
		1: before["read_only"] == "true",
		4: before["engine_why"] != "",
		5: before["cache_network"] == "true",
	} {
		if (in.flags>>bit&1 == 1) != c {
			t.Errorf("INFO flags %#x: bit %d disagrees with user.phx.info", in.flags, bit)
		}
	}
	if !strings.HasPrefix(before["engine"], in.engine) {
		t.Errorf("user.phx.info engine=%q, INFO says %q", before["engine"], in.engine)
	}
	for i, k := range infoCounterKeys {
		lo, _ := strconv.ParseUint(before[k], 10, 64)
		hi, _ := strconv.ParseUint(after[k], 10, 64)
		if v := in.counters[i]; v < min(lo, hi) || v > max(lo, hi) {
			t.Errorf("INFO counter %s (offset %d) = %d; user.phx.info says %d before and %d after", k, 312+8*i, v, lo, hi)
		}
	}
}

// "DEREGISTER": the id and the token stop working; ENOENT after.
func (x *abiFixture) deregister(t *testing.T) {
	fd := openFD(t, x.f, unix.O_RDONLY)
	m := newEmu(t, "phxemu-dereg", emuPage, 0)
	r := x.reg(t, fd, m)
	wantErrno(t, "DEREGISTER", abiDeregister(t, fd, r.id), 0)
	_, e := abiIO(t, fd, false, r.id, 0, 4096, 0)
	wantErrno(t, "READ after DEREGISTER", e, unix.ENOENT)
	if _, res, e := abiBatch(t, fd, false, 1, []ext{{r.id, 0, 4096, 0}}); e != 0 || res[0] != -int64(unix.ENOENT) {
		t.Errorf("a batch extent after DEREGISTER: %s, %v", errName(e), res)
	}
	if _, res, e := abiStrided(t, fd, false, 1, []sext{{r.id, 0, 64, 0, 2, 64, 64}}); e != 0 || res[0] != -int64(unix.ENOENT) {
		t.Errorf("a strided extent after DEREGISTER: %s, %v", errName(e), res)
	}
	wantErrno(t, "user.phx.load with the token after DEREGISTER",
		errnoOf(xattrLoad(x.f, "token="+r.tokenHex()+",offset=0")), unix.EKEYREJECTED)
	wantErrno(t, "DEREGISTER again", abiDeregister(t, fd, r.id), unix.ENOENT)
	for _, id := range []uint64{0, 1 << 40, ^uint64(0)} {
		wantErrno(t, fmt.Sprintf("DEREGISTER of id %d", id), abiDeregister(t, fd, id), unix.ENOENT)
	}
	if !allBytes(m.mem, 0xA5) {
		t.Errorf("bytes moved into a deregistered buffer")
	}
	// The memory registers again, under a new id.
	x.reg(t, fd, m)
}

// errnoOf is err as an errno (0 for nil).
func errnoOf(err error) unix.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(unix.Errno); ok {
		return e
	}
	return unix.Errno(0xFFFF)
}

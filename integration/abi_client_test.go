package integration

// A client of the phxmount ioctl and xattr ABI written from docs/abi.md
// alone: raw byte layouts and golang.org/x/sys/unix, never the project's
// client package, so that a difference between the document and the
// daemon shows in abi_conformance_test.go. Every number here is the
// document's; the section of docs/abi.md it comes from is named beside it.
//
//	abiIoctl(t, fd, cmd, arg) errno      one ioctl; a failed one must leave arg as it was
//	newEmu(t, name, size, mfdFlags)      an emu "device buffer": a memfd named name, mapped
//	emuHandle(pid, fd, size, ino, dev)   the 64-byte emu handle ("The emu handle")
//	abiRegister / abiDeregister / abiIO / abiBatch / abiStrided / abiInfo
//	                                     one command each, raw struct in, decoded reply out
//	abiChild                             the test binary re-executed as another client
//	                                     (TestABIHelperChild), driven line by line

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// "Transport rules" and "Command numbers".
const (
	abiMagic   = 0x4D584850 // "PHXM"
	abiVersion = 1
	abiType    = 0xE5

	nrRegister      = 0x01
	nrDeregister    = 0x02
	nrRead          = 0x03
	nrWrite         = 0x04
	nrBatchRead     = 0x05
	nrBatchWrite    = 0x06
	nrInfo          = 0x07
	nrStridedRead   = 0x08
	nrStridedWrite  = 0x09
	dirW            = 1 // _IOW
	dirR            = 2 // _IOR
	dirRW           = 3 // _IOWR
	szRegister      = 128
	szDeregister    = 32
	szIO            = 48
	szInfo          = 512
	szBatchHeader   = 16
	szExtent        = 40
	szStridedExtent = 64

	// "Limits".
	maxIoctlSize      = 16383
	maxExtents        = 409
	maxStridedExtents = 255
	maxPieces         = 65536
	maxLoadValue      = 512
	maxDevice         = 65536

	vendorAny    = 0
	vendorEmu    = 1
	vendorNvidia = 2
	vendorPcibar = 3

	transportHost = 2

	emuPage = 64 << 10 // REGISTER: "64 KiB on emu"
	two63   = uint64(1) << 63
)

// abiCmd is "dir << 30 | size << 16 | 0xE5 << 8 | nr".
func abiCmd(dir, size, nr uint32) uint32 { return dir<<30 | size<<16 | abiType<<8 | nr }

var (
	cmdRegister   = abiCmd(dirRW, szRegister, nrRegister)
	cmdDeregister = abiCmd(dirW, szDeregister, nrDeregister)
	cmdRead       = abiCmd(dirRW, szIO, nrRead)
	cmdWrite      = abiCmd(dirRW, szIO, nrWrite)
	cmdInfo       = abiCmd(dirRW, szInfo, nrInfo)
)

func cmdBatch(write bool, k int) uint32 {
	nr := uint32(nrBatchRead)
	if write {
		nr = nrBatchWrite
	}
	return abiCmd(dirRW, uint32(szBatchHeader+szExtent*k), nr)
}

func cmdStrided(write bool, k int) uint32 {
	nr := uint32(nrStridedRead)
	if write {
		nr = nrStridedWrite
	}
	return abiCmd(dirRW, uint32(szBatchHeader+szStridedExtent*k), nr)
}

func put16(b []byte, off int, v uint16) { binary.LittleEndian.PutUint16(b[off:], v) }
func put32(b []byte, off int, v uint32) { binary.LittleEndian.PutUint32(b[off:], v) }
func put64(b []byte, off int, v uint64) { binary.LittleEndian.PutUint64(b[off:], v) }
func get32(b []byte, off int) uint32    { return binary.LittleEndian.Uint32(b[off:]) }
func get64(b []byte, off int) uint64    { return binary.LittleEndian.Uint64(b[off:]) }

// abiMsg is a zeroed struct of size bytes with the 8-byte header.
func abiMsg(size int) []byte {
	b := make([]byte, size)
	put32(b, 0, abiMagic)
	put16(b, 4, abiVersion)
	return b
}

// errName names an errno, "OK" for none.
func errName(e error) string {
	if e == nil {
		return "OK"
	}
	if en, ok := e.(unix.Errno); ok {
		if en == 0 {
			return "OK"
		}
		return unix.ErrnoName(en)
	}
	return e.Error()
}

// abiIoctl issues cmd with arg (at least _IOC_SIZE(cmd) bytes). "On
// failure it returns -1 with errno set and the argument is left as it
// was": checked on every failure.
func abiIoctl(t testing.TB, fd int, cmd uint32, arg []byte) unix.Errno {
	t.Helper()
	if int(cmd>>16&0x3FFF) > len(arg) {
		t.Fatalf("ioctl %#x: argument of %d bytes is shorter than the command's size", cmd, len(arg))
	}
	before := bytes.Clone(arg)
	var p unsafe.Pointer
	if len(arg) > 0 {
		p = unsafe.Pointer(&arg[0])
	}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(cmd), uintptr(p))
	runtime.KeepAlive(arg)
	if e != 0 && !bytes.Equal(arg, before) {
		t.Errorf("ioctl %#x failed with %s and changed its argument", cmd, unix.ErrnoName(e))
	}
	return e
}

// emuMem is an emulated device buffer: a memfd, mapped here.
type emuMem struct {
	fd   int
	size int64
	ino  uint64
	mem  []byte
}

// newEmu makes a memfd called name of size bytes, maps it and fills it
// with 0xA5 (so that every page is allocated, "The emu handle").
func newEmu(t testing.TB, name string, size int64, mfdFlags int) *emuMem {
	t.Helper()
	m, err := makeEmu(name, size, mfdFlags, true)
	if err != nil {
		t.Fatalf("emu memory %q of %d bytes: %v", name, size, err)
	}
	t.Cleanup(m.close)
	return m
}

func makeEmu(name string, size int64, mfdFlags int, populate bool) (*emuMem, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|mfdFlags)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	m := &emuMem{fd: fd, size: size}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ftruncate: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	m.ino = st.Ino
	if populate {
		if m.mem, err = unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("mmap: %w", err)
		}
		fill(m.mem, 0xA5)
	}
	return m, nil
}

func (m *emuMem) close() {
	if m.mem != nil {
		unix.Munmap(m.mem)
		m.mem = nil
	}
	if m.fd >= 0 {
		unix.Close(m.fd)
		m.fd = -1
	}
}

// handle is m's emu handle for device dev, exported by this process.
func (m *emuMem) handle(dev uint32) []byte {
	return emuHandle(uint32(os.Getpid()), uint32(m.fd), uint64(m.size), m.ino, dev)
}

// emuHandle is "The emu handle": "PHXEMU01", exporter pid, descriptor,
// memfd size, inode, device index, 28 zero bytes.
func emuHandle(pid, fd uint32, size, ino uint64, dev uint32) []byte {
	h := make([]byte, 64)
	copy(h, "PHXEMU01")
	put32(h, 8, pid)
	put32(h, 12, fd)
	put64(h, 16, size)
	put64(h, 24, ino)
	put32(h, 32, dev)
	return h
}

// REGISTER.

type regReply struct {
	id        uint64
	token     [16]byte
	transport uint32
}

func (r regReply) tokenHex() string { return hex.EncodeToString(r.token[:]) }

func regMsg(vendor, dev uint32, size uint64, handle []byte) []byte {
	b := abiMsg(szRegister)
	put32(b, 8, vendor)
	put32(b, 12, dev)
	put64(b, 16, size)
	copy(b[24:88], handle)
	return b
}

// abiRegister sends REGISTER and checks the reply's layout: a non-zero id,
// the host transport (emu memory is host-addressable), zero reserved bytes.
func abiRegister(t testing.TB, fd int, vendor, dev uint32, size uint64, handle []byte) (regReply, unix.Errno) {
	t.Helper()
	return abiRegisterMsg(t, fd, regMsg(vendor, dev, size, handle))
}

func abiRegisterMsg(t testing.TB, fd int, b []byte) (regReply, unix.Errno) {
	t.Helper()
	if e := abiIoctl(t, fd, cmdRegister, b); e != 0 {
		return regReply{}, e
	}
	r := regReply{id: get64(b, 88), transport: get32(b, 112)}
	copy(r.token[:], b[96:112])
	if r.id == 0 {
		t.Errorf("REGISTER returned id 0")
	}
	if r.token == ([16]byte{}) {
		t.Errorf("REGISTER returned an all-zero token")
	}
	if r.transport != transportHost {
		t.Errorf("REGISTER of emu memory: transport %d, want %d (host)", r.transport, transportHost)
	}
	if !allBytes(b[116:128], 0) {
		t.Errorf("REGISTER reply's reserved bytes are not zero: % x", b[116:128])
	}
	return r, 0
}

// mustRegister registers m (vendor emu, device 0) through fd.
func mustRegister(t testing.TB, fd int, m *emuMem) regReply {
	t.Helper()
	r, e := abiRegister(t, fd, vendorEmu, 0, uint64(m.size), m.handle(0))
	if e != 0 {
		t.Fatalf("REGISTER %d bytes: %s", m.size, errName(e))
	}
	return r
}

// DEREGISTER.

func abiDeregister(t testing.TB, fd int, id uint64) unix.Errno {
	t.Helper()
	b := abiMsg(szDeregister)
	put64(b, 8, id)
	return abiIoctl(t, fd, cmdDeregister, b)
}

// READ and WRITE.

func ioMsg(id, bufOff, length, fileOff uint64) []byte {
	b := abiMsg(szIO)
	put64(b, 8, id)
	put64(b, 16, bufOff)
	put64(b, 24, length)
	put64(b, 32, fileOff)
	return b
}

// abiIO sends READ (write false) or WRITE and returns the result field.
func abiIO(t testing.TB, fd int, write bool, id, bufOff, length, fileOff uint64) (int64, unix.Errno) {
	t.Helper()
	return abiIOMsg(t, fd, write, ioMsg(id, bufOff, length, fileOff))
}

func abiIOMsg(t testing.TB, fd int, write bool, b []byte) (int64, unix.Errno) {
	t.Helper()
	cmd := cmdRead
	if write {
		cmd = cmdWrite
	}
	if e := abiIoctl(t, fd, cmd, b); e != 0 {
		return 0, e
	}
	return int64(get64(b, 40)), 0
}

// Batches.

type ext struct{ id, bo, n, fo uint64 }

func batchMsg(k int, ex []ext) []byte {
	b := abiMsg(szBatchHeader + szExtent*k)
	put32(b, 8, uint32(len(ex)))
	for i, x := range ex {
		o := szBatchHeader + szExtent*i
		put64(b, o, x.id)
		put64(b, o+8, x.bo)
		put64(b, o+16, x.n)
		put64(b, o+24, x.fo)
	}
	return b
}

// abiBatch sends BATCH_READ or BATCH_WRITE of capacity k holding ex, and
// returns failed and each extent's result; it checks that the reply left
// the extents' inputs and the unused slots as they were.
func abiBatch(t testing.TB, fd int, write bool, k int, ex []ext) (uint32, []int64, unix.Errno) {
	t.Helper()
	return abiBatchMsg(t, fd, cmdBatch(write, k), batchMsg(k, ex), len(ex), szExtent)
}

func abiBatchMsg(t testing.TB, fd int, cmd uint32, b []byte, count, extSize int) (uint32, []int64, unix.Errno) {
	t.Helper()
	in := bytes.Clone(b)
	if e := abiIoctl(t, fd, cmd, b); e != 0 {
		return 0, nil, e
	}
	res := make([]int64, count)
	for i := range res {
		o := szBatchHeader + extSize*i
		res[i] = int64(get64(b, o+extSize-8))
		if !bytes.Equal(b[o:o+extSize-8], in[o:o+extSize-8]) {
			t.Errorf("the reply changed extent %d's input fields", i)
		}
	}
	if tail := szBatchHeader + extSize*count; !allBytes(b[tail:], 0) {
		t.Errorf("the reply wrote into the unused slots")
	}
	return get32(b, 12), res, 0
}

type sext struct{ id, bo, n, fo, count, fstride, bstride uint64 }

func stridedMsg(k int, ex []sext) []byte {
	b := abiMsg(szBatchHeader + szStridedExtent*k)
	put32(b, 8, uint32(len(ex)))
	for i, x := range ex {
		o := szBatchHeader + szStridedExtent*i
		put64(b, o, x.id)
		put64(b, o+8, x.bo)
		put64(b, o+16, x.n)
		put64(b, o+24, x.fo)
		put64(b, o+32, x.count)
		put64(b, o+40, x.fstride)
		put64(b, o+48, x.bstride)
	}
	return b
}

func abiStrided(t testing.TB, fd int, write bool, k int, ex []sext) (uint32, []int64, unix.Errno) {
	t.Helper()
	return abiBatchMsg(t, fd, cmdStrided(write, k), stridedMsg(k, ex), len(ex), szStridedExtent)
}

// INFO.

type infoReply struct {
	dev                  int32
	transport, flags     uint32
	workers              uint32
	pageSize, bounceSize uint64
	dioMem, dioOff, ndev uint32
	cache                uint32
	vendor, engine, pci  string
	name, passthroughWhy string
	counters             [24]uint64
	reserved             []byte
}

// infoCounterKeys are the counters' keys in INFO order ("INFO").
var infoCounterKeys = []string{"buffers_live", "buffers_registered", "released_deregister", "released_close",
	"released_death", "ioctl_bytes_read", "ioctl_bytes_written", "ioctl_extents", "ioctl_failed_extents",
	"ioctl_rejected", "ioctl_calls", "lib_bytes_read", "lib_bytes_written", "lib_requests", "lib_ops",
	"lib_coalesced", "lib_failed", "lib_batches", "xattr_loads", "staged_direct_reads", "staged_direct_bytes",
	"staged_buffered_reads", "staged_buffered_bytes", "staged_fallbacks"}

func cstr(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}

func abiInfo(t testing.TB, fd int, dev int32) (infoReply, unix.Errno) {
	t.Helper()
	b := abiMsg(szInfo)
	put32(b, 8, uint32(dev))
	if e := abiIoctl(t, fd, cmdInfo, b); e != 0 {
		return infoReply{}, e
	}
	r := infoReply{dev: int32(get32(b, 8)), transport: get32(b, 12), flags: get32(b, 16), workers: get32(b, 20),
		pageSize: get64(b, 24), bounceSize: get64(b, 32), dioMem: get32(b, 40), dioOff: get32(b, 44),
		ndev: get32(b, 48), cache: get32(b, 52), vendor: cstr(b[56:72]), engine: cstr(b[72:88]),
		pci: cstr(b[88:120]), name: cstr(b[120:184]), passthroughWhy: cstr(b[184:312]),
		reserved: bytes.Clone(b[504:512])}
	for i := range r.counters {
		r.counters[i] = get64(b, 312+8*i)
	}
	return r, 0
}

// Files.

// openFD opens path and closes it at cleanup.
func openFD(t testing.TB, path string, flags int) int {
	t.Helper()
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0644)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// xattrLoad sets user.phx.load on path.
func xattrLoad(path, value string) error {
	return unix.Setxattr(path, "user.phx.load", []byte(value), 0)
}

// The child client.

// abiChildProc is the test binary re-executed as another client process
// (TestABIHelperChild): it reads one command a line and answers one line.
type abiChildProc struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

// startABIChild starts a child client as cred (nil: as this process),
// with extra descriptors numbered from 3.
func startABIChild(t testing.TB, cred *syscall.Credential, extra ...*os.File) *abiChildProc {
	t.Helper()
	bin := testBinary(t, cred != nil, "abichild.test")
	cmd := exec.Command(bin, "-test.run=^TestABIHelperChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PHX_CHILD=abi")
	cmd.Dir = "/"
	cmd.ExtraFiles = extra
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	stdout, _ := cmd.StdoutPipe()
	stdin, _ := cmd.StdinPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &abiChildProc{cmd: cmd, in: stdin, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if l, ok := strings.CutPrefix(sc.Text(), "ABI "); ok {
				c.lines <- l
			}
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return c
}

// do sends one command and returns the child's answer.
func (c *abiChildProc) do(t testing.TB, format string, a ...any) string {
	t.Helper()
	line := fmt.Sprintf(format, a...)
	if _, err := fmt.Fprintln(c.in, line); err != nil {
		t.Fatalf("child: %q: %v", line, err)
	}
	select {
	case l, ok := <-c.lines:
		if !ok {
			t.Fatalf("child exited on %q", line)
		}
		return l
	case <-time.After(60 * time.Second): // a hang guard, not a timing assertion
		t.Fatalf("child did not answer %q in 60 s", line)
	}
	return ""
}

// exit ends the child and waits for it.
func (c *abiChildProc) exit(t testing.TB) {
	t.Helper()
	c.in.Close()
	c.cmd.Wait()
}

// TestABIHelperChild is the child client's body; it skips when run
// normally.
func TestABIHelperChild(t *testing.T) {
	if os.Getenv("PHX_CHILD") != "abi" {
		t.Skip("helper process for TestABIConformance (runs only when re-executed)")
	}
	// Every command runs on this thread, which blocks SIGXFSZ: a signal
	// sent to it stays pending, and "sigxfsz" reports and takes it.
	runtime.LockOSThread()
	var set unix.Sigset_t
	set.Val[0] = 1 << (unix.SIGXFSZ - 1)
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &set, nil); err != nil {
		fmt.Printf("ABI SIGMASK %v\n", err)
	}
	abiChildLoop(t, os.Stdin)
	os.Exit(0)
}

// abiChildLoop runs the child's commands:
//
//	open PATH FLAGS             -> FD
//	memfd SIZE                  -> HANDLEHEX (an emu memfd of this process, device 0)
//	reg FD SIZE                 -> ID TOKENHEX (a fresh memfd of SIZE bytes)
//	io read|write FD ID BO N FO -> RESULT | ERRNO
//	batch read|write FD ID BO N FO
//	                            -> ERRNO | OK FAILED RESULT (one extent)
//	strided read|write FD ID BO N FO COUNT FSTRIDE BSTRIDE
//	                            -> ERRNO | OK FAILED RESULT
//	dereg FD ID                 -> ERRNO | OK
//	setuid UID                  -> OK | error
//	fsize N                     -> OK | error (RLIMIT_FSIZE)
//	sigxfsz                     -> yes | no (a SIGXFSZ pending, taken)
//	pwrite FD OFF N             -> N | ERRNO (N bytes of 0x5A)
//	load PATH VALUE             -> ERRNO | OK (user.phx.load)
func abiChildLoop(t *testing.T, r io.Reader) {
	say := func(format string, a ...any) { fmt.Printf("ABI "+format+"\n", a...) }
	num := func(s string) uint64 { v, _ := strconv.ParseUint(s, 0, 64); return v }
	var mems []*emuMem
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		write := len(f) > 1 && f[1] == "write"
		switch f[0] {
		case "open":
			fd, err := unix.Open(f[1], int(num(f[2])), 0)
			if err != nil {
				say("%s", errName(err))
			} else {
				say("%d", fd)
			}
		case "memfd":
			m, err := makeEmu("phxemu-child", int64(num(f[1])), 0, true)
			if err != nil {
				say("%v", err)
				continue
			}
			mems = append(mems, m)
			say("%s", hex.EncodeToString(m.handle(0)))
		case "reg":
			m, err := makeEmu("phxemu-child", int64(num(f[2])), 0, true)
			if err != nil {
				say("%v", err)
				continue
			}
			mems = append(mems, m)
			r, e := abiRegister(t, int(num(f[1])), vendorEmu, 0, uint64(m.size), m.handle(0))
			if e != 0 {
				say("%s", errName(e))
			} else {
				say("%d %s", r.id, r.tokenHex())
			}
		case "io":
			res, e := abiIO(t, int(num(f[2])), write, num(f[3]), num(f[4]), num(f[5]), num(f[6]))
			if e != 0 {
				say("%s", errName(e))
			} else {
				say("%d", res)
			}
		case "batch":
			failed, res, e := abiBatch(t, int(num(f[2])), write, 1, []ext{{num(f[3]), num(f[4]), num(f[5]), num(f[6])}})
			if e != 0 {
				say("%s", errName(e))
			} else {
				say("OK %d %d", failed, res[0])
			}
		case "strided":
			failed, res, e := abiStrided(t, int(num(f[2])), write, 1,
				[]sext{{num(f[3]), num(f[4]), num(f[5]), num(f[6]), num(f[7]), num(f[8]), num(f[9])}})
			if e != 0 {
				say("%s", errName(e))
			} else {
				say("OK %d %d", failed, res[0])
			}
		case "dereg":
			say("%s", errName(abiDeregister(t, int(num(f[1])), num(f[2]))))
		case "setuid":
			say("%s", errName(syscall.Setresuid(int(num(f[1])), int(num(f[1])), int(num(f[1])))))
		case "fsize":
			say("%s", errName(unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: num(f[1]), Max: num(f[1])})))
		case "sigxfsz":
			var set unix.Sigset_t
			set.Val[0] = 1 << (unix.SIGXFSZ - 1)
			var ts unix.Timespec
			sig, _, e := unix.Syscall6(unix.SYS_RT_SIGTIMEDWAIT, uintptr(unsafe.Pointer(&set)), 0,
				uintptr(unsafe.Pointer(&ts)), 8 /* the kernel's sigset_t */, 0, 0)
			if e == 0 && sig == uintptr(unix.SIGXFSZ) {
				say("yes")
			} else {
				say("no")
			}
		case "pwrite":
			n, err := unix.Pwrite(int(num(f[1])), bytes.Repeat([]byte{0x5A}, int(num(f[3]))), int64(num(f[2])))
			if err != nil {
				say("%s", errName(err))
			} else {
				say("%d", n)
			}
		case "load":
			say("%s", errName(xattrLoad(f[1], f[2])))
		default:
			say("unknown command %q", f[0])
		}
	}
}

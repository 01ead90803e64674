package fusefs

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/emu"
	"github.com/phxmount/phxmount/phxfs"
)

// The control is tested without a mount: requests go straight to Ioctl,
// GetXattr and SetXattr with a Caller and an OpenFile the test makes up.

type ctlEnv struct {
	s    *ControlServer
	conn *emu.Connector
	lib  *phxfs.Lib
	me   Caller
}

func newCtlEnv(t testing.TB, staged, readOnly bool) *ctlEnv {
	t.Helper()
	conn, err := emu.New(emu.Config{Staged: staged})
	if err != nil {
		t.Fatal(err)
	}
	lib, err := phxfs.New(phxfs.Config{Connector: conn, Engine: "sync", Workers: 2, BounceSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	s, err := NewControl(ControlConfig{Lib: lib, ReadOnly: readOnly, Log: logrus.NewEntry(log),
		Passthrough: func() (bool, string) { return true, "test says so" }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("control close: %v", err)
		}
		lib.Close()
	})
	return &ctlEnv{s: s, conn: conn, lib: lib, me: Caller{Tgid: os.Getpid(), Tid: unix.Gettid(), UID: uint32(os.Getuid())}}
}

// patternFile writes a file whose every 8-byte little-endian word holds its
// own offset, and opens it with flags.
func patternFile(t testing.TB, size int64, flags int) (*OpenFile, []byte) {
	t.Helper()
	b := make([]byte, size)
	for i := int64(0); i+8 <= size; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(i))
	}
	p := filepath.Join(t.TempDir(), "pattern")
	if err := os.WriteFile(p, b, 0644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return &OpenFile{ID: uint64(fd) + 1000, Fd: fd, Flags: flags, Name: "pattern"}, b
}

func (e *ctlEnv) alloc(t testing.TB, size int64) *emu.Memory {
	t.Helper()
	m, err := e.conn.Alloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m.(*emu.Memory)
}

// served is a pattern file of fileSize bytes opened with flags and a
// buffer of memSize bytes registered on it by the test's own caller.
func (e *ctlEnv) served(t testing.TB, fileSize int64, flags int, memSize int64) (*OpenFile, []byte, *emu.Memory, client.RegisterResp) {
	t.Helper()
	f, data := patternFile(t, fileSize, flags)
	m := e.alloc(t, memSize)
	return f, data, m, e.registered(t, f, m)
}

func (e *ctlEnv) ioctl(c Caller, f *OpenFile, cmd uint32, in []byte) ([]byte, syscall.Errno) {
	out := make([]byte, len(in))
	_, errno := e.s.Ioctl(context.Background(), c, f, cmd, in, out)
	return out, errno
}

func (e *ctlEnv) register(t testing.TB, c Caller, f *OpenFile, m connector.Memory) (client.RegisterResp, syscall.Errno) {
	t.Helper()
	h, _ := m.Export()
	out, errno := e.ioctl(c, f, client.CmdRegister, client.EncodeRegister(client.RegisterReq{Vendor: client.VendorEmu, Size: uint64(m.Size()), Handle: h}))
	if errno != 0 {
		return client.RegisterResp{}, errno
	}
	r, err := client.DecodeRegisterResp(out)
	if err != nil {
		t.Fatal(err)
	}
	return r, 0
}

// registered registers m as the test's own caller on f; a refusal fails the test.
func (e *ctlEnv) registered(t testing.TB, f *OpenFile, m connector.Memory) client.RegisterResp {
	t.Helper()
	r, errno := e.register(t, e.me, f, m)
	if errno != 0 {
		t.Fatalf("REGISTER: %v", errno)
	}
	return r
}

func (e *ctlEnv) read(c Caller, f *OpenFile, r client.IOReq) (int64, syscall.Errno) {
	out, errno := e.ioctl(c, f, client.CmdRead, client.EncodeIO(r))
	if errno != 0 {
		return 0, errno
	}
	n, _ := client.DecodeIOResp(out)
	return n, 0
}

func (e *ctlEnv) info(t testing.TB, f *OpenFile) client.Info {
	t.Helper()
	out, errno := e.ioctl(e.me, f, client.CmdInfo, client.EncodeInfoReq(0))
	if errno != 0 {
		t.Fatalf("INFO: %v", errno)
	}
	in, err := client.DecodeInfo(out)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func poison(b []byte) {
	for i := range b {
		b[i] = 0xA5
	}
}

func allA5(b []byte) bool { return bytes.Count(b, []byte{0xA5}) == len(b) }

func TestControlSingleAndBatch(t *testing.T) {
	for _, staged := range []bool{false, true} {
		t.Run(fmt.Sprintf("staged=%v", staged), func(t *testing.T) {
			e := newCtlEnv(t, staged, false)
			f, data := patternFile(t, 3<<20+123, unix.O_RDONLY)
			m := e.alloc(t, 1<<20)
			mem := m.Bytes()
			poison(mem)
			r := e.registered(t, f, m)
			want := client.TransportHost
			if staged {
				want = client.TransportStaged
			}
			if r.Transport != want {
				t.Errorf("transport %v, want %v", r.Transport, want)
			}
			// Unaligned single read.
			n, errno := e.read(e.me, f, client.IOReq{ID: r.ID, BufOffset: 3, Length: 100000, FileOffset: 1<<20 + 5})
			if errno != 0 || n != 100000 {
				t.Fatalf("READ = %d, %v", n, errno)
			}
			if !bytes.Equal(mem[3:100003], data[1<<20+5:1<<20+100005]) || mem[2] != 0xA5 || mem[100003] != 0xA5 {
				t.Fatalf("READ bytes differ from the file")
			}
			// Short read at end of file.
			n, errno = e.read(e.me, f, client.IOReq{ID: r.ID, BufOffset: 0, Length: 4096, FileOffset: uint64(len(data)) - 10})
			if errno != 0 || n != 10 || !bytes.Equal(mem[:10], data[len(data)-10:]) {
				t.Fatalf("READ at EOF = %d, %v", n, errno)
			}
			// A batch mixing good, unaligned, failing and adjacent extents.
			poison(mem)
			reqs := []client.IOReq{
				{ID: r.ID, BufOffset: 0, Length: 65536, FileOffset: 0},
				{ID: r.ID, BufOffset: 65536, Length: 65536, FileOffset: 65536}, // follows on
				{ID: r.ID, BufOffset: 200001, Length: 777, FileOffset: 2<<20 + 1},
				{ID: r.ID, BufOffset: 1<<20 - 10, Length: 11, FileOffset: 0}, // past the buffer
				{ID: r.ID + 100, BufOffset: 0, Length: 1, FileOffset: 0},     // unknown id
				{ID: r.ID, BufOffset: 1 << 63, Length: 1, FileOffset: 0},     // not a valid offset
				{ID: r.ID, BufOffset: 300000, Length: 0, FileOffset: 0},
				{ID: r.ID, BufOffset: 400000, Length: 1000, FileOffset: 1 << 40}, // past EOF
			}
			b, _ := client.EncodeBatch(16, reqs)
			out, errno := e.ioctl(e.me, f, client.CmdBatch(false, 16), b)
			if errno != 0 {
				t.Fatalf("BATCH_READ: %v", errno)
			}
			res := make([]int64, len(reqs))
			failed, err := client.DecodeBatchResp(out, res)
			if err != nil {
				t.Fatal(err)
			}
			wantRes := []int64{65536, 65536, 777, -int64(unix.EFAULT), -int64(unix.ENOENT), -int64(unix.EINVAL), 0, 0}
			for i := range wantRes {
				if res[i] != wantRes[i] {
					t.Errorf("extent %d: result %d, want %d", i, res[i], wantRes[i])
				}
			}
			if failed != 4 {
				t.Errorf("failed = %d, want 4", failed)
			}
			if !bytes.Equal(mem[:131072], data[:131072]) || !bytes.Equal(mem[200001:200778], data[2<<20+1:2<<20+778]) {
				t.Errorf("batch bytes differ from the file")
			}
			if !allA5(mem[131072:200001]) || !allA5(mem[200778:]) {
				t.Errorf("a failing extent moved bytes")
			}
			in := e.info(t, f)
			if in.Counters.BuffersLive != 1 || in.Counters.IoctlFailedExtents != 5 || in.Transport != want || in.Vendor != "emu" || !in.Passthrough() {
				t.Errorf("INFO = %+v", in)
			}
			if _, errno := e.ioctl(e.me, f, client.CmdDeregister, client.EncodeDeregister(r.ID)); errno != 0 {
				t.Fatalf("DEREGISTER: %v", errno)
			}
			if _, errno := e.read(e.me, f, client.IOReq{ID: r.ID, Length: 1}); errno != unix.ENOENT {
				t.Errorf("READ after DEREGISTER: %v, want ENOENT", errno)
			}
			if _, errno := e.ioctl(e.me, f, client.CmdDeregister, client.EncodeDeregister(r.ID)); errno != unix.ENOENT {
				t.Errorf("second DEREGISTER: %v, want ENOENT", errno)
			}
		})
	}
}

func TestControlWrite(t *testing.T) {
	e := newCtlEnv(t, false, false)
	f, data := patternFile(t, 1<<20, unix.O_RDWR)
	m := e.alloc(t, 1<<20)
	for i := range m.Bytes() {
		m.Bytes()[i] = byte(i * 13)
	}
	r := e.registered(t, f, m)
	out, errno := e.ioctl(e.me, f, client.CmdWrite, client.EncodeIO(client.IOReq{ID: r.ID, BufOffset: 10, Length: 5000, FileOffset: 4096}))
	if n, _ := client.DecodeIOResp(out); errno != 0 || n != 5000 {
		t.Fatalf("WRITE = %d, %v", n, errno)
	}
	got := make([]byte, len(data))
	unix.Pread(f.Fd, got, 0)
	copy(data[4096:], m.Bytes()[10:5010])
	if !bytes.Equal(got, data) {
		t.Fatalf("file after WRITE differs")
	}
}

func TestControlRefusals(t *testing.T) {
	e := newCtlEnv(t, false, false)
	ro, roData := patternFile(t, 1<<20, unix.O_RDONLY)
	wo, _ := patternFile(t, 1<<20, unix.O_WRONLY)
	ap, _ := patternFile(t, 1<<20, unix.O_RDWR|unix.O_APPEND)
	m := e.alloc(t, 1<<20)
	poison(m.Bytes())
	r := e.registered(t, ro, m)
	other := Caller{Tgid: e.me.Tgid + 1, UID: e.me.UID}
	otherUID := Caller{Tgid: e.me.Tgid, UID: e.me.UID + 1}
	io := client.EncodeIO(client.IOReq{ID: r.ID, Length: 4096})
	for _, c := range []struct {
		name string
		c    Caller
		f    *OpenFile
		cmd  uint32
		in   []byte
		want syscall.Errno
	}{
		{"write on O_RDONLY", e.me, ro, client.CmdWrite, io, unix.EBADF},
		{"read on O_WRONLY", e.me, wo, client.CmdRead, io, unix.EBADF},
		{"write on O_APPEND", e.me, ap, client.CmdWrite, io, unix.EINVAL},
		{"another process", other, ro, client.CmdRead, io, unix.EPERM},
		{"another uid", otherUID, ro, client.CmdRead, io, unix.EPERM},
		{"deregister by another", other, ro, client.CmdDeregister, client.EncodeDeregister(r.ID), unix.EPERM},
		{"past the buffer", e.me, ro, client.CmdRead, client.EncodeIO(client.IOReq{ID: r.ID, BufOffset: 1 << 20, Length: 1}), unix.EFAULT},
		{"offset wraps", e.me, ro, client.CmdRead, client.EncodeIO(client.IOReq{ID: r.ID, BufOffset: 10, Length: 1<<63 - 5}), unix.EFAULT},
		{"bad magic", e.me, ro, client.CmdRead, append([]byte{0}, io[1:]...), unix.EINVAL},
		{"wrong size", e.me, ro, client.CmdRead&^(0x3fff<<16) | 40<<16, make([]byte, 40), unix.EINVAL},
		{"unknown nr", e.me, ro, client.CmdRead&^0xff | 0x40, io, unix.ENOTTY},
		{"foreign type", e.me, ro, 0xC0305403, io, unix.ENOTTY},
		{"batch size not 16+40k", e.me, ro, client.CmdBatch(false, 16) + 1<<16, make([]byte, client.BatchSize(16)+1), unix.EINVAL},
		{"register wrong vendor", e.me, ro, client.CmdRegister, client.EncodeRegister(client.RegisterReq{Vendor: client.VendorNvidia, Size: 1 << 20}), unix.ENODEV},
		{"register no device", e.me, ro, client.CmdRegister, client.EncodeRegister(client.RegisterReq{Device: 7, Size: 1 << 20}), unix.ENODEV},
		{"register bad handle", e.me, ro, client.CmdRegister, client.EncodeRegister(client.RegisterReq{Size: 1 << 20}), unix.EINVAL},
		{"info no device", e.me, ro, client.CmdInfo, client.EncodeInfoReq(5), unix.ENODEV},
	} {
		if _, errno := e.ioctl(c.c, c.f, c.cmd, c.in); errno != c.want {
			t.Errorf("%s: %v, want %v", c.name, errno, c.want)
		}
	}
	// Another process cannot register this process's handle.
	h, _ := m.Export()
	if _, errno := e.ioctl(other, ro, client.CmdRegister, client.EncodeRegister(client.RegisterReq{Size: 1 << 20, Handle: h})); errno != unix.EPERM {
		t.Errorf("register another's handle: %v, want EPERM", errno)
	}
	// Registration size not a multiple of 64 KiB.
	if _, errno := e.ioctl(e.me, ro, client.CmdRegister, client.EncodeRegister(client.RegisterReq{Size: 4096, Handle: h})); errno != unix.EINVAL {
		t.Errorf("register 4 KiB: %v, want EINVAL", errno)
	}
	if !allA5(m.Bytes()) {
		t.Errorf("a refused request moved bytes")
	}
	got := make([]byte, len(roData))
	unix.Pread(ro.Fd, got, 0)
	if !bytes.Equal(got, roData) {
		t.Errorf("a refused request changed the file")
	}

	// A read-only mount refuses every write with EROFS.
	e2 := newCtlEnv(t, false, true)
	rw, _ := patternFile(t, 1<<20, unix.O_RDWR)
	m2 := e2.alloc(t, 1<<20)
	r2, errno := e2.register(t, e2.me, rw, m2)
	if errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := e2.ioctl(e2.me, rw, client.CmdWrite, client.EncodeIO(client.IOReq{ID: r2.ID, Length: 1})); errno != unix.EROFS {
		t.Errorf("write on a read-only mount: %v, want EROFS", errno)
	}
	b, _ := client.EncodeBatch(1, []client.IOReq{{ID: r2.ID, Length: 1}})
	if _, errno := e2.ioctl(e2.me, rw, client.CmdBatch(true, 1), b); errno != unix.EROFS {
		t.Errorf("batch write on a read-only mount: %v, want EROFS", errno)
	}
	if in := e2.info(t, rw); !in.ReadOnly() || in.Counters.IoctlRejected != 2 {
		t.Errorf("INFO on the read-only control: %+v", in)
	}
}

func TestControlReleasedOnClose(t *testing.T) {
	e := newCtlEnv(t, false, false)
	f, _ := patternFile(t, 1<<20, unix.O_RDONLY)
	g, _ := patternFile(t, 1<<20, unix.O_RDONLY)
	m1, m2 := e.alloc(t, 1<<20), e.alloc(t, 1<<20)
	r1, _ := e.register(t, e.me, f, m1)
	r2, _ := e.register(t, e.me, g, m2)
	// A buffer registered on f serves I/O on g.
	if n, errno := e.read(e.me, g, client.IOReq{ID: r1.ID, Length: 100}); errno != 0 || n != 100 {
		t.Fatalf("READ on another file: %d %v", n, errno)
	}
	e.s.Released(f)
	if _, errno := e.read(e.me, g, client.IOReq{ID: r1.ID, Length: 100}); errno != unix.ENOENT {
		t.Errorf("buffer of a closed file: %v, want ENOENT", errno)
	}
	if n, errno := e.read(e.me, g, client.IOReq{ID: r2.ID, Length: 100}); errno != 0 || n != 100 {
		t.Errorf("the other buffer: %d %v", n, errno)
	}
	in := e.info(t, g)
	if in.Counters.ReleasedClose != 1 || in.Counters.BuffersLive != 1 {
		t.Errorf("counters %+v", in.Counters)
	}
}

// TestControlOwnerDeath registers a buffer exported by a child process and
// kills the child: the buffer is released.
func TestControlOwnerDeath(t *testing.T) {
	e := newCtlEnv(t, false, false)
	f, data := patternFile(t, 1<<20, unix.O_RDONLY)
	child, h := startExporter(t)
	c := Caller{Tgid: child.Process.Pid, UID: e.me.UID}
	out, errno := e.ioctl(c, f, client.CmdRegister, client.EncodeRegister(client.RegisterReq{Vendor: client.VendorEmu, Size: 1 << 20, Handle: h}))
	if errno != 0 {
		t.Fatalf("REGISTER for the child: %v", errno)
	}
	r, _ := client.DecodeRegisterResp(out)
	if n, errno := e.read(c, f, client.IOReq{ID: r.ID, Length: 1 << 20}); errno != 0 || n != 1<<20 {
		t.Fatalf("READ for the child: %d %v", n, errno)
	}
	// The daemon's own import shows the bytes: the library writes them out.
	e.s.mu.Lock()
	b := e.s.bufs[r.ID]
	e.s.mu.Unlock()
	out2, err := os.CreateTemp(t.TempDir(), "back")
	if err != nil {
		t.Fatal(err)
	}
	defer out2.Close()
	if n, err := e.lib.Write(int(out2.Fd()), b.reg.Device(), b.reg.Addr(), 0, 1<<20, 0); err != nil || n != 1<<20 {
		t.Fatalf("write the import back: %d, %v", n, err)
	}
	if got, _ := os.ReadFile(out2.Name()); !bytes.Equal(got, data) {
		t.Fatalf("bytes in the child's buffer differ")
	}
	child.Process.Kill()
	child.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for e.info(t, f).Counters.ReleasedDeath != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("buffer not released 5 s after its owner died: %+v", e.info(t, f).Counters)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, errno := e.read(c, f, client.IOReq{ID: r.ID, Length: 1}); errno != unix.ENOENT {
		t.Errorf("buffer of a dead process: %v", errno)
	}
	e.s.reaper.mu.Lock()
	n := len(e.s.reaper.followed)
	e.s.reaper.mu.Unlock()
	if n != 0 {
		t.Errorf("%d pidfds still followed by the reaper", n)
	}
}

// startExporter re-executes the test binary as a process that allocates a
// 1 MiB emu buffer, prints its handle and waits.
func startExporter(t *testing.T) (*exec.Cmd, connector.Handle) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperExporter$")
	cmd.Env = append(os.Environ(), "PHX_TEST_EXPORTER=1")
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	buf := make([]byte, 256)
	var line string
	for !strings.Contains(line, "\n") {
		n, err := stdout.Read(buf)
		if err != nil {
			t.Fatalf("exporter: %v (%q)", err, line)
		}
		line += string(buf[:n])
	}
	var h connector.Handle
	hexs := strings.TrimSpace(strings.TrimPrefix(strings.SplitN(line, "\n", 2)[0], "HANDLE "))
	for i := range h {
		v, err := strconv.ParseUint(hexs[2*i:2*i+2], 16, 8)
		if err != nil {
			t.Fatalf("exporter said %q", line)
		}
		h[i] = byte(v)
	}
	return cmd, h
}

func TestHelperExporter(t *testing.T) {
	if os.Getenv("PHX_TEST_EXPORTER") != "1" {
		t.Skip("helper process for TestControlOwnerDeath (runs only when re-executed)")
	}
	conn, _ := emu.New(emu.Config{})
	m, err := conn.Alloc(0, 1<<20)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	h, _ := m.Export()
	fmt.Printf("HANDLE %x\n", h[:])
	time.Sleep(time.Minute)
	os.Exit(0)
}

func TestControlXattrs(t *testing.T) {
	e := newCtlEnv(t, false, false)
	f, data := patternFile(t, 1<<20+100, unix.O_RDONLY)
	m := e.alloc(t, 2<<20)
	poison(m.Bytes())
	r := e.registered(t, f, m)
	path := fmt.Sprintf("/proc/self/fd/%d", f.Fd)
	target := XattrTarget{Name: "pattern", Open: func(flags int) (int, syscall.Errno) {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err.(syscall.Errno)
		}
		return fd, 0
	}}
	v, errno := e.s.GetXattr(e.me, target, XattrInfo)
	if errno != 0 {
		t.Fatal(errno)
	}
	for _, want := range []string{"path=pattern\n", "size=1048676\n", "transport=host\n", "vendor=emu\n", "passthrough=active\n", "buffers_live=1\n", "engine=sync\n"} {
		if !strings.Contains(string(v), want) {
			t.Errorf("user.phx.info lacks %q:\n%s", want, v)
		}
	}
	if _, errno := e.s.GetXattr(e.me, target, "user.phx.nope"); errno != unix.ENODATA {
		t.Errorf("unknown get: %v", errno)
	}
	if errno := e.s.SetXattr(e.me, target, XattrInfo, []byte("x")); errno != unix.ENOTSUP {
		t.Errorf("set info: %v", errno)
	}
	load := func(v string) syscall.Errno {
		return e.s.SetXattr(Caller{Tgid: 1, UID: 65534}, target, XattrLoad, []byte(v))
	}
	tok := r.Token.String()
	for _, c := range []struct {
		v    string
		want syscall.Errno
	}{
		{"token=" + tok, unix.EINVAL},
		{"offset=0", unix.EINVAL},
		{"token=" + tok + ",offset=0,bogus=1", unix.EINVAL},
		{"token=" + tok[:30] + ",offset=0", unix.EINVAL},
		{"token=" + strings.Repeat("0", 32) + ",offset=0", unix.EKEYREJECTED},
		{"token=" + tok + ",offset=2097153", unix.EFAULT},
		{"token=" + tok + ",offset=0x180000,length=0x100000", unix.EFAULT}, // 1 MiB does not fit in the last 512 KiB
		{"token=" + tok + ",offset=0,length=2000000", unix.EINVAL},
	} {
		if errno := load(c.v); errno != c.want {
			t.Errorf("load %q: %v, want %v", c.v, errno, c.want)
		}
	}
	if !allA5(m.Bytes()) {
		t.Fatalf("a refused load moved bytes")
	}
	if errno := load("token=" + tok + ",offset=4096"); errno != 0 {
		t.Fatalf("load: %v", errno)
	}
	if !bytes.Equal(m.Bytes()[4096:4096+len(data)], data) || !allA5(m.Bytes()[:4096]) || !allA5(m.Bytes()[4096+len(data):]) {
		t.Fatalf("loaded bytes differ")
	}
	if errno := load("token=" + tok + ",offset=0,length=10,file_offset=0x100000"); errno != 0 || !bytes.Equal(m.Bytes()[:10], data[1<<20:1<<20+10]) {
		t.Fatalf("partial load: %v", errno)
	}
	denied := target
	denied.Open = func(int) (int, syscall.Errno) { return -1, unix.EACCES }
	if errno := e.s.SetXattr(e.me, denied, XattrLoad, []byte("token="+tok+",offset=0")); errno != unix.EACCES {
		t.Errorf("load of an unreadable file: %v", errno)
	}
	dir := target
	dir.IsDir = true
	if errno := e.s.SetXattr(e.me, dir, XattrLoad, []byte("token="+tok+",offset=0")); errno != unix.EISDIR {
		t.Errorf("load of a directory: %v", errno)
	}
	root := XattrTarget{IsRoot: true, IsDir: true}
	v, errno = e.s.GetXattr(e.me, root, XattrInfo)
	if errno != 0 || !strings.Contains(string(v), "path=.\n") || !strings.Contains(string(v), "xattr_loads=2\n") {
		t.Errorf("root info %v:\n%s", errno, v)
	}
}

// TestParseLoadNumbers: user.phx.load's numbers are decimal or 0x hex
// (docs/abi.md), below 2^63; nothing else strconv's base 0 would take.
func TestParseLoadNumbers(t *testing.T) {
	tok := strings.Repeat("ab", 16)
	for v, want := range map[string]int64{
		"0": 0, "10": 10, "010": 10, "08": 8, "0x10": 16, "0X1f": 31, "0x0010": 16,
		"9223372036854775807": math.MaxInt64, "0x7fffffffffffffff": math.MaxInt64,
		"9223372036854775808": -1, "0x8000000000000000": -1, "18446744073709551616": -1,
		"0b1": -1, "0o7": -1, "1_0": -1, "0x1_0": -1, "0x": -1, "x10": -1, "+1": -1, "-1": -1,
		"= 1": -1, "1.5": -1, "1e3": -1, "0x-1": -1, "0x+1": -1, "abc": -1,
	} {
		r, err := parseLoad([]byte("token=" + tok + ",offset=" + v))
		switch {
		case want < 0 && err == nil:
			t.Errorf("offset=%q: accepted as %d", v, r.offset)
		case want < 0 && !strings.Contains(err.Error(), unix.EINVAL.Error()):
			t.Errorf("offset=%q: %v, want EINVAL", v, err)
		case want >= 0 && (err != nil || r.offset != uint64(want)):
			t.Errorf("offset=%q: %d, %v; want %d", v, r.offset, err, want)
		}
	}
}

// TestParseLoadValueLength: max_load_value (512) bounds the value as set,
// a trailing NUL or newline included; those are then ignored.
func TestParseLoadValueLength(t *testing.T) {
	v := "token=" + strings.Repeat("ab", 16) + ",offset=0x"
	v += strings.Repeat("0", client.MaxLoadValue-len(v)-1) + "9"
	for _, c := range []struct {
		v  string
		ok bool
	}{{v, true}, {v[:len(v)-1] + "\n", true}, {v[:len(v)-1] + "\x00", true}, {v + "\n", false}, {v + "\x00", false}, {"0" + v, false}} {
		if _, err := parseLoad([]byte(c.v)); (err == nil) != c.ok {
			t.Errorf("a value of %d bytes ending %q: %v; want accepted %v", len(c.v), c.v[len(c.v)-1:], err, c.ok)
		}
	}
}

func TestControlClose(t *testing.T) {
	e := newCtlEnv(t, true, false)
	f, _ := patternFile(t, 1<<20, unix.O_RDONLY)
	for i := 0; i < 3; i++ {
		if _, errno := e.register(t, e.me, f, e.alloc(t, 1<<20)); errno != 0 {
			t.Fatal(errno)
		}
	}
	if err := e.s.Close(); err != nil {
		t.Fatal(err)
	}
	if d, _ := e.lib.Device(0); d.Registrations != 0 {
		t.Errorf("%d registrations left in phxfs after Close", d.Registrations)
	}
	if _, errno := e.register(t, e.me, f, e.alloc(t, 1<<20)); errno != unix.ESHUTDOWN {
		t.Errorf("register after close: %v", errno)
	}
}

// TestCheckOrder pins the order of the checks docs/abi.md states: a
// malformed struct first, then the descriptor (EISDIR, EROFS, EBADF,
// EINVAL for O_APPEND), then the buffer (ENOENT, EPERM, EFAULT).
func TestCheckOrder(t *testing.T) {
	ro := newCtlEnv(t, false, true)
	rw := newCtlEnv(t, false, false)
	dirFd, err := unix.Open(t.TempDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirFd)
	dir := &OpenFile{ID: 9001, Fd: dirFd, Flags: unix.O_RDONLY | unix.O_DIRECTORY, Name: "d"}
	rdonly, _ := patternFile(t, 1<<16, unix.O_RDONLY)
	wronly, _ := patternFile(t, 1<<16, unix.O_WRONLY)
	appendf, _ := patternFile(t, 1<<16, unix.O_WRONLY|unix.O_APPEND)
	for _, e := range []*ctlEnv{ro, rw} {
		if _, errno := e.register(t, e.me, rdonly, e.alloc(t, 1<<16)); errno != 0 {
			t.Fatal(errno)
		}
	}
	huge := uint64(math.MaxInt64) + 1
	for _, c := range []struct {
		name string
		e    *ctlEnv
		f    *OpenFile
		cmd  uint32
		req  client.IOReq
		want unix.Errno
	}{
		{"malformed before the directory", rw, dir, client.CmdRead, client.IOReq{ID: 1, Length: 1, FileOffset: huge}, unix.EINVAL},
		{"directory before the read-only mount", ro, dir, client.CmdWrite, client.IOReq{ID: 1, Length: 1}, unix.EISDIR},
		{"read-only mount before the descriptor's mode", ro, rdonly, client.CmdWrite, client.IOReq{ID: 1, Length: 1}, unix.EROFS},
		{"descriptor's mode", rw, rdonly, client.CmdWrite, client.IOReq{ID: 1, Length: 1}, unix.EBADF},
		{"write-only for a read", rw, wronly, client.CmdRead, client.IOReq{ID: 1, Length: 1}, unix.EBADF},
		{"O_APPEND before the buffer", rw, appendf, client.CmdWrite, client.IOReq{ID: 99, Length: 1}, unix.EINVAL},
		{"no such buffer before its range", rw, rdonly, client.CmdRead, client.IOReq{ID: 99, Length: 1 << 30}, unix.ENOENT},
		{"range", rw, rdonly, client.CmdRead, client.IOReq{ID: 1, BufOffset: 1 << 16, Length: 1}, unix.EFAULT},
		{"an offset past 2^63 that also overruns is malformed", rw, rdonly, client.CmdRead, client.IOReq{ID: 1, BufOffset: huge, Length: 1}, unix.EINVAL},
	} {
		in := client.EncodeIO(c.req)
		out := make([]byte, len(in))
		if _, errno := c.e.s.Ioctl(t.Context(), c.e.me, c.f, c.cmd, in, out); errno != c.want {
			t.Errorf("%s: %v, want %v", c.name, errno, c.want)
		}
	}
}

// TestInfoXattrPathOnEveryTarget: user.phx.info has path= for directories
// and the root too, size= and dio_* only for regular files (docs/abi.md).
func TestInfoXattrPathOnEveryTarget(t *testing.T) {
	e := newCtlEnv(t, false, false)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("abc"), 0644)
	open := func(p string) func(int) (int, unix.Errno) {
		return func(flags int) (int, unix.Errno) {
			fd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0)
			return fd, toErrno(err)
		}
	}
	for _, c := range []struct {
		target XattrTarget
		path   string
		file   bool
	}{
		{XattrTarget{Name: "sub", IsDir: true, Open: open(dir)}, "path=sub\n", false},
		{XattrTarget{IsRoot: true, IsDir: true, Open: open(dir)}, "path=.\n", false},
		{XattrTarget{Name: "sub/f", Open: open(filepath.Join(dir, "f"))}, "path=sub/f\n", true},
	} {
		v, errno := e.s.GetXattr(e.me, c.target, XattrInfo)
		if errno != 0 {
			t.Fatal(errno)
		}
		s := string(v)
		if !strings.Contains(s, c.path) || strings.Contains(s, "\nsize=") != c.file || strings.Contains(s, "dio_mem_align=") != c.file {
			t.Errorf("%+v:\n%s", c.target, s)
		}
	}
}

// BenchmarkControlBatch409 times one BATCH ioctl of 409 random 16 KiB
// blocks of a hot file into shuffled slots of an emulated registration,
// through the control (decode, checks, holds, the library, the reply),
// with no FUSE round trip: a KV client's restore, as the daemon serves
// it. Run 69 (docs/gpu-notes.md) traced 85 us of such an ioctl outside
// the library's plan and execute on the H100.
//
//	go test ./fusefs -run '^$' -bench ControlBatch409 -benchtime 2000x
func BenchmarkControlBatch409(b *testing.B) {
	e := newCtlEnv(b, true, false)
	const bs, n = 16 << 10, 409
	f, _, _, r := e.served(b, 64<<20, unix.O_RDONLY, 7<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	slots := rng.Perm(n)
	reqs := make([]client.IOReq, n)
	for i := range reqs {
		reqs[i] = client.IOReq{ID: r.ID, BufOffset: uint64(slots[i] * bs), Length: bs, FileOffset: uint64(rng.IntN(64<<20/bs) * bs)}
	}
	in, _ := client.EncodeBatch(n, reqs)
	cmd := client.CmdBatch(false, n)
	b.SetBytes(n * bs)
	b.ResetTimer()
	for range b.N {
		if _, errno := e.ioctl(e.me, f, cmd, in); errno != 0 {
			b.Fatal(errno)
		}
	}
}

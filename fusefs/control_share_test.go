package fusefs

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"sync"
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

// Registrations of memory the caller shares: the same memory registered
// twice (as CUDA IPC handles are, imported once per process), memory
// shared read-only, and memory that is not there (a sparse memfd).

// sharedImports imports each handle once and hands the same memory to
// every REGISTER of it, as the CUDA driver does with an IPC handle opened
// twice: the registrations share one phxfs region.
type sharedImports struct {
	*emu.Connector
	mu   sync.Mutex
	mems map[connector.Handle]*sharedMem
}

type sharedMem struct {
	connector.Memory
	s    *sharedImports
	h    connector.Handle
	refs int
}

func (s *sharedImports) Import(dev int, h connector.Handle, size int64, pid int) (connector.Memory, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.mems[h]; m != nil {
		m.refs++
		return m, nil
	}
	mem, err := s.Connector.Import(dev, h, size, pid)
	if err != nil {
		return nil, err
	}
	m := &sharedMem{Memory: mem, s: s, h: h, refs: 1}
	s.mems[h] = m
	return m, nil
}

func (m *sharedMem) Close() error {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	if m.refs--; m.refs > 0 {
		return nil
	}
	delete(m.s.mems, m.h)
	return m.Memory.Close()
}

func newSharedCtl(t *testing.T) *ctlEnv {
	t.Helper()
	conn, err := emu.New(emu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	lib, err := phxfs.New(phxfs.Config{Connector: &sharedImports{Connector: conn, mems: map[connector.Handle]*sharedMem{}}, Engine: "sync", Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel)
	s, err := NewControl(ControlConfig{Lib: lib, Log: logrus.NewEntry(log)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); lib.Close() })
	return &ctlEnv{s: s, conn: conn, lib: lib, me: Caller{Tgid: os.Getpid(), Tid: unix.Gettid(), UID: uint32(os.Getuid())}}
}

// TestDeregisterSharedWaitsForItsOwnIO: DEREGISTER waits for the I/O in
// flight on its buffer (docs/abi.md), also when another registration of
// the same memory keeps the memory registered; meanwhile its id is gone
// and the other buffer works.
func TestDeregisterSharedWaitsForItsOwnIO(t *testing.T) {
	e := newSharedCtl(t)
	f, data := patternFile(t, 1<<20, unix.O_RDONLY)
	m := e.alloc(t, 1<<20)
	a := e.registered(t, f, m)
	b := e.registered(t, f, m)
	// A's I/O in flight: the hold a transfer or a load of it takes.
	held, e2 := e.s.holdToken(a.Token)
	if e2 != 0 {
		t.Fatal(e2)
	}
	released := false
	t.Cleanup(func() {
		if !released {
			held.reg.Release()
		}
	})
	done := make(chan syscall.Errno, 1)
	go func() {
		_, errno := e.ioctl(e.me, f, client.CmdDeregister, client.EncodeDeregister(a.ID))
		done <- errno
	}()
	// Once A's id is gone, DEREGISTER is waiting for A's I/O.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, errno := e.read(e.me, f, client.IOReq{ID: a.ID, Length: 4096}); errno == unix.ENOENT {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("DEREGISTER never unlinked the buffer")
		}
	}
	select {
	case errno := <-done:
		t.Fatalf("DEREGISTER returned (%v) with its buffer's I/O in flight", errno)
	case <-time.After(100 * time.Millisecond):
	}
	poison(m.Bytes())
	if n, errno := e.read(e.me, f, client.IOReq{ID: b.ID, Length: 64 << 10, FileOffset: 4096}); errno != 0 || n != 64<<10 ||
		!bytes.Equal(m.Bytes()[:64<<10], data[4096:4096+64<<10]) {
		t.Fatalf("READ into the other registration while one deregisters: %d, %v", n, errno)
	}
	held.reg.Release()
	released = true
	if errno := <-done; errno != 0 {
		t.Fatalf("DEREGISTER: %v", errno)
	}
	if _, errno := e.ioctl(e.me, f, client.CmdDeregister, client.EncodeDeregister(b.ID)); errno != 0 {
		t.Fatalf("DEREGISTER of the other: %v", errno)
	}
	if in := e.info(t, f); in.Counters.BuffersLive != 0 || in.Counters.ReleasedDeregister != 2 {
		t.Errorf("counters: %d live, %d deregistered", in.Counters.BuffersLive, in.Counters.ReleasedDeregister)
	}
}

// share is a memfd named as emu's, of size bytes, alloc of them allocated
// and holding data, and a handle naming descriptor fd (its own, or one
// reopened with flags).
func share(t *testing.T, size, alloc int64, data []byte, flags int) connector.Handle {
	t.Helper()
	fd, err := unix.MemfdCreate("phxemu-share", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	if alloc > 0 {
		if err := unix.Fallocate(fd, 0, 0, alloc); err != nil {
			t.Fatal(err)
		}
	}
	unix.Pwrite(fd, data, 0)
	hfd := fd
	if flags != unix.O_RDWR {
		if hfd, err = unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), flags|unix.O_CLOEXEC, 0); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(hfd) })
	}
	var st unix.Stat_t
	unix.Fstat(fd, &st)
	var h connector.Handle
	copy(h[:], "PHXEMU01")
	binary.LittleEndian.PutUint32(h[8:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(h[12:], uint32(hfd))
	binary.LittleEndian.PutUint64(h[16:], uint64(size))
	binary.LittleEndian.PutUint64(h[24:], st.Ino)
	return h
}

func (e *ctlEnv) registerHandle(f *OpenFile, h connector.Handle, size int64) (client.RegisterResp, syscall.Errno) {
	out, errno := e.ioctl(e.me, f, client.CmdRegister, client.EncodeRegister(client.RegisterReq{Vendor: client.VendorEmu, Size: uint64(size), Handle: h}))
	if errno != 0 {
		return client.RegisterResp{}, errno
	}
	r, _ := client.DecodeRegisterResp(out)
	return r, 0
}

// TestReadOnlyShare: memory shared through a read-only descriptor is
// registered read-only: every way of reading a file into it (READ, a
// batch extent, a strided extent, user.phx.load) is refused with EACCES
// and leaves its bytes; WRITE from it lands them in the file.
func TestReadOnlyShare(t *testing.T) {
	for _, staged := range []bool{false, true} {
		e := newCtlEnv(t, staged, false)
		f, _ := patternFile(t, 256<<10, unix.O_RDWR)
		const size = 128 << 10
		mine := bytes.Repeat([]byte("mine"), size/4)
		r, errno := e.registerHandle(f, share(t, size, size, mine, unix.O_RDONLY), size)
		if errno != 0 {
			t.Fatalf("staged %v: REGISTER of a read-only share: %v", staged, errno)
		}
		if _, errno := e.read(e.me, f, client.IOReq{ID: r.ID, Length: 4096}); errno != unix.EACCES {
			t.Errorf("staged %v: READ into it: %v, want EACCES", staged, errno)
		}
		// docs/abi.md's order: EPERM, then EACCES, then EFAULT.
		if _, errno := e.read(e.me, f, client.IOReq{ID: r.ID, BufOffset: size, Length: 4096}); errno != unix.EACCES {
			t.Errorf("staged %v: READ into it past its end: %v, want EACCES", staged, errno)
		}
		other := Caller{Tgid: e.me.Tgid + 1, UID: e.me.UID}
		if _, errno := e.read(other, f, client.IOReq{ID: r.ID, Length: 4096}); errno != unix.EPERM {
			t.Errorf("staged %v: READ into it by another process: %v, want EPERM", staged, errno)
		}
		b, _ := client.EncodeBatch(1, []client.IOReq{{ID: r.ID, Length: 4096}})
		out, errno := e.ioctl(e.me, f, client.CmdBatch(false, 1), b)
		res := []int64{0}
		client.DecodeBatchResp(out, res)
		if errno != 0 || res[0] != -int64(unix.EACCES) {
			t.Errorf("staged %v: batch read into it: %v, %d; want -EACCES", staged, errno, res[0])
		}
		if got, sres := e.stridedErrno(t, f, false, []client.IOReq{{ID: r.ID, Length: 10, Count: 3, FileStride: 20, BufStride: 10}}); got != 0 || sres[0] != -int64(unix.EACCES) {
			t.Errorf("staged %v: strided read into it: %v, %v; want -EACCES", staged, got, sres)
		}
		load := fmt.Sprintf("token=%s,offset=0,length=4096", r.Token)
		if errno := e.s.SetXattr(e.me, XattrTarget{Name: "pattern", Open: func(fl int) (int, syscall.Errno) {
			fd, err := unix.Dup(f.Fd)
			return fd, toErrno(err)
		}}, XattrLoad, []byte(load)); errno != unix.EACCES {
			t.Errorf("staged %v: user.phx.load into it: %v, want EACCES", staged, errno)
		}
		w := client.IOReq{ID: r.ID, BufOffset: 8, Length: 1000, FileOffset: 5000}
		out, errno = e.ioctl(e.me, f, client.CmdWrite, client.EncodeIO(w))
		if n, _ := client.DecodeIOResp(out); errno != 0 || n != 1000 {
			t.Fatalf("staged %v: WRITE from it: %d, %v", staged, n, errno)
		}
		got := make([]byte, 1000)
		unix.Pread(f.Fd, got, 5000)
		if !bytes.Equal(got, mine[8:1008]) {
			t.Errorf("staged %v: the WRITE wrote other bytes", staged)
		}
	}
}

// TestRegisterSparseMemfd: a memfd ftruncated to 2 GiB and never written
// holds no memory of its exporter's: REGISTER is EFAULT, and nothing is
// registered; the part of it that is allocated registers.
func TestRegisterSparseMemfd(t *testing.T) {
	e := newCtlEnv(t, false, false)
	f, _ := patternFile(t, 4096, unix.O_RDONLY)
	h := share(t, 2<<30, 1<<20, nil, unix.O_RDWR)
	if _, errno := e.registerHandle(f, h, 2<<30); errno != unix.EFAULT {
		t.Fatalf("REGISTER of a sparse 2 GiB memfd: %v, want EFAULT", errno)
	}
	if in := e.info(t, f); in.Counters.BuffersLive != 0 || in.Counters.BuffersRegistered != 0 {
		t.Fatalf("counters after the refusal: %d live, %d registered", in.Counters.BuffersLive, in.Counters.BuffersRegistered)
	}
	if _, errno := e.registerHandle(f, h, 1<<20); errno != 0 {
		t.Fatalf("REGISTER of its allocated 1 MiB: %v", errno)
	}
}

// TestRegisterAfterShutdownBegan: once the daemon began shutting down
// (the unmount started), REGISTER gets ESHUTDOWN, while a buffer
// registered before keeps serving its owner and can be deregistered.
func TestRegisterAfterShutdownBegan(t *testing.T) {
	e := newCtlEnv(t, false, false)
	f, data := patternFile(t, 1<<20, unix.O_RDONLY)
	m := e.alloc(t, 1<<20)
	r := e.registered(t, f, m)
	var sn ShutdownNotifier = e.s
	sn.BeginShutdown()
	if _, errno := e.register(t, e.me, f, e.alloc(t, 1<<20)); errno != unix.ESHUTDOWN {
		t.Fatalf("REGISTER after shutdown began: %v, want ESHUTDOWN", errno)
	}
	poison(m.Bytes())
	if n, errno := e.read(e.me, f, client.IOReq{ID: r.ID, Length: 64 << 10, FileOffset: 8}); errno != 0 || n != 64<<10 ||
		!bytes.Equal(m.Bytes()[:64<<10], data[8:8+64<<10]) {
		t.Fatalf("READ into a live buffer while shutting down: %d, %v", n, errno)
	}
	if _, errno := e.ioctl(e.me, f, client.CmdDeregister, client.EncodeDeregister(r.ID)); errno != 0 {
		t.Fatalf("DEREGISTER while shutting down: %v", errno)
	}
	if in := e.info(t, f); in.Counters.BuffersRegistered != 1 {
		t.Errorf("%d registrations counted, want the one before shutdown", in.Counters.BuffersRegistered)
	}
}

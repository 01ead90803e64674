package fusefs

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fakeControl is a test double for the control protocol: it echoes ioctl
// payloads, serves one virtual xattr and records what it was given.
type fakeControl struct {
	mu       sync.Mutex
	callers  []Caller
	files    []OpenFile
	released []uint64
	set      map[string]string
	targets  []XattrTarget
}

func (c *fakeControl) Ioctl(ctx context.Context, cl Caller, f *OpenFile, cmd uint32, in, out []byte) (int32, syscall.Errno) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.callers = append(c.callers, cl)
	c.files = append(c.files, *f)
	if cmd>>8&0xff != 'Z' {
		return 0, unix.ENOTTY
	}
	for i := range out {
		out[i] = in[i] ^ 0xff
	}
	return 7, 0
}

func (c *fakeControl) GetXattr(cl Caller, t XattrTarget, name string) ([]byte, syscall.Errno) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.targets = append(c.targets, t)
	if name == XattrPrefix+"info" {
		return []byte("name=" + t.Name), 0
	}
	if v, ok := c.set[name]; ok {
		return []byte(v), 0
	}
	return nil, unix.ENODATA
}

func (c *fakeControl) SetXattr(cl Caller, t XattrTarget, name string, value []byte) syscall.Errno {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.set == nil {
		c.set = map[string]string{}
	}
	c.set[name] = string(value)
	return 0
}

func (c *fakeControl) Released(f *OpenFile) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released = append(c.released, f.ID)
}

func mountForTest(t *testing.T, o Options) (backing, mnt string, f *FS) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: mounting needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("skipped: no /dev/fuse (%v)", err)
	}
	dir := t.TempDir()
	backing, mnt = filepath.Join(dir, "b"), filepath.Join(dir, "m")
	os.Mkdir(backing, 0755)
	os.Mkdir(mnt, 0755)
	f, err := Mount(backing, mnt, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Unmount()
		f.Wait()
	})
	return backing, mnt, f
}

func TestControlSeam(t *testing.T) {
	ctl := &fakeControl{}
	backing, mnt, _ := mountForTest(t, Options{Control: ctl})
	os.MkdirAll(filepath.Join(backing, "dir"), 0755)
	os.WriteFile(filepath.Join(backing, "dir", "f"), []byte("data"), 0644)
	p := filepath.Join(mnt, "dir", "f")

	fd, err := unix.Open(p, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	in := make([]byte, 32)
	for i := range in {
		in[i] = byte(i)
	}
	cmd := uintptr(3<<30 | 32<<16 | 'Z'<<8 | 1) // _IOWR('Z', 1, [32]byte)
	r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), cmd, uintptr(unsafe.Pointer(&in[0])))
	if e != 0 || r != 7 {
		t.Fatalf("ioctl: %d %v", r, e)
	}
	for i := range in {
		if in[i] != byte(i)^0xff {
			t.Fatalf("ioctl out byte %d = %#x", i, in[i])
		}
	}
	var flags int32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.FS_IOC_GETFLAGS, uintptr(unsafe.Pointer(&flags))); e != unix.ENOTTY {
		t.Fatalf("FS_IOC_GETFLAGS: %v, want ENOTTY", e)
	}
	unix.Close(fd)

	ctl.mu.Lock()
	c, of := ctl.callers[0], ctl.files[0]
	ctl.mu.Unlock()
	if c.Tgid != os.Getpid() || c.UID != 0 || c.Tid <= 0 {
		t.Errorf("caller %+v, want Tgid %d uid 0", c, os.Getpid())
	}
	if of.Name != "dir/f" || of.Flags&unix.O_ACCMODE != unix.O_RDONLY || of.Fd < 0 || of.ID == 0 || of.Owner.Tgid != os.Getpid() {
		t.Errorf("open file %+v", of)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctl.mu.Lock()
		n := len(ctl.released)
		ctl.mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			if n == 0 {
				t.Errorf("Released not called after close")
			}
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	buf := make([]byte, 256)
	n, err := unix.Getxattr(p, "user.phx.info", buf)
	if err != nil || string(buf[:n]) != "name=dir/f" {
		t.Fatalf("user.phx.info = %q %v", buf[:max(n, 0)], err)
	}
	if n, err := unix.Getxattr(mnt, "user.phx.info", buf); err != nil || string(buf[:n]) != "name=" {
		t.Fatalf("root user.phx.info = %q %v", buf[:max(n, 0)], err)
	}
	ctl.mu.Lock()
	root := ctl.targets[len(ctl.targets)-1]
	ctl.mu.Unlock()
	if !root.IsRoot || !root.IsDir {
		t.Errorf("root target %+v", root)
	}
	if err := unix.Setxattr(p, "user.phx.x", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Getxattr(filepath.Join(backing, "dir", "f"), "user.phx.x", buf); err != unix.ENODATA {
		t.Fatalf("virtual xattr reached the backing file: %v", err)
	}
	if n, err := unix.Listxattr(p, buf); err != nil || n != 0 {
		t.Fatalf("listxattr lists %q (%v), want nothing", buf[:max(n, 0)], err)
	}
}

func TestTargetOpenChecksCallerPermissions(t *testing.T) {
	st := unix.Stat_t{Mode: unix.S_IFREG | 0640, Uid: 1000, Gid: 1000}
	for _, c := range []struct {
		caller Caller
		mask   uint32
		want   bool
	}{
		{Caller{UID: 1000, GID: 5}, unix.R_OK | unix.W_OK, true},
		{Caller{UID: 1001, GID: 1000}, unix.R_OK, true},
		{Caller{UID: 1001, GID: 1000}, unix.W_OK, false},
		{Caller{UID: 65534, GID: 65534, Tgid: -1}, unix.R_OK, false},
		{Caller{UID: 0}, unix.R_OK | unix.W_OK, true},
		{Caller{UID: 0}, unix.X_OK, false},
	} {
		if got := mayAccess(&st, c.caller, c.mask); got != c.want {
			t.Errorf("mayAccess(%+v, %o) = %v", c.caller, c.mask, got)
		}
	}
	if tgidOf(unix.Gettid()) != os.Getpid() {
		t.Errorf("tgidOf(gettid) = %d, want %d", tgidOf(unix.Gettid()), os.Getpid())
	}
	if v, ok := statusField([]byte("Name:\tx\nTgid:\t42\nPid:\t43\n"), "Tgid:"); !ok || string(v) != "42" {
		t.Errorf("statusField = %q %v", v, ok)
	}
}

func TestPassthroughReported(t *testing.T) {
	_, _, f := mountForTest(t, Options{Passthrough: PassthroughOff})
	if ok, why := f.PassthroughActive(); ok || why == "" {
		t.Fatalf("--passthrough off: active %v (%q)", ok, why)
	}
}

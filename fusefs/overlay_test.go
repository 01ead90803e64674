package fusefs

import (
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	for _, name := range []string{"user.phx.info", "user.phx.load", "user.phx.x"} {
		if err := unix.Removexattr(p, name); err != unix.EPERM {
			t.Errorf("removexattr %s: %v, want EPERM (docs/abi.md)", name, err)
		}
	}
	if n, err := unix.Listxattr(p, buf); err != nil || n != 0 {
		t.Fatalf("listxattr lists %q (%v), want nothing", buf[:max(n, 0)], err)
	}
}

// posixACL encodes a system.posix_acl_access value: the owner, group and
// other entries from mode, a mask of r--, and named users with their bits.
func posixACL(mode uint32, users map[uint32]uint16) []byte {
	const undef = ^uint32(0)
	b := binary.LittleEndian.AppendUint32(nil, 2)
	ent := func(tag, perm uint16, id uint32) {
		b = binary.LittleEndian.AppendUint16(b, tag)
		b = binary.LittleEndian.AppendUint16(b, perm)
		b = binary.LittleEndian.AppendUint32(b, id)
	}
	ent(0x01, uint16(mode>>6&7), undef)
	ids := make([]uint32, 0, len(users))
	for id := range users {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		ent(0x02, users[id], id)
	}
	ent(0x04, uint16(mode>>3&7), undef)
	ent(0x10, 4, undef)
	ent(0x20, uint16(mode&7), undef)
	return b
}

// processAs starts a process of uid and gid that lives as long as the test,
// so that a Caller can name it.
func processAs(t *testing.T, uid uint32) Caller {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return Caller{Tid: cmd.Process.Pid, Tgid: cmd.Process.Pid, UID: uid, GID: uid}
}

// TestOpenAsCallerIsTheKernelsDecision: the xattr controls open files as
// the caller, so POSIX ACLs decide both ways, where mode bits alone would
// decide wrongly.
func TestOpenAsCallerIsTheKernelsDecision(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fusefs: skipped: taking a caller's credentials needs root")
	}
	dir := t.TempDir()
	os.Chmod(dir, 0755)
	mk := func(name string, mode uint32, users map[uint32]uint16) int {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0600); err != nil {
			t.Fatal(err)
		}
		os.Chown(p, 1000, 1000)
		os.Chmod(p, os.FileMode(mode))
		if err := unix.Setxattr(p, "system.posix_acl_access", posixACL(mode, users), 0); err != nil {
			t.Fatalf("set an ACL on %s: %v (the test directory's file system must support POSIX ACLs)", p, err)
		}
		fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	granted := mk("granted", 0640, map[uint32]uint16{2000: 4}) // mode: others ---
	denied := mk("denied", 0644, map[uint32]uint16{4000: 0})   // mode: others r--
	for _, c := range []struct {
		name string
		fd   int
		uid  uint32
		want unix.Errno
	}{
		{"ACL grants a named user", granted, 2000, 0},
		{"no entry, others ---", granted, 3000, unix.EACCES},
		{"owner", granted, 1000, 0},
		{"ACL denies a named user", denied, 4000, unix.EACCES},
		{"no entry, others r--", denied, 3000, 0},
		{"root", granted, 0, 0},
	} {
		caller := processAs(t, c.uid)
		fd, e := openAsCaller(caller, nil, c.fd, unix.O_RDONLY)
		if e != c.want {
			t.Errorf("%s: openAsCaller uid %d: %v, want %v", c.name, c.uid, e, c.want)
		}
		if fd >= 0 {
			unix.Close(fd)
		}
		if e := accessAsCaller(caller, nil, c.fd, unix.R_OK); e != c.want {
			t.Errorf("%s: accessAsCaller uid %d: %v, want %v", c.name, c.uid, e, c.want)
		}
	}
	// The daemon's own credentials are untouched afterwards.
	if u, _ := unix.SetfsuidRetUid(-1); u != 0 {
		t.Errorf("fsuid of this thread is %d after asCaller", u)
	}
	if e := asCaller(Caller{Tid: 1 << 30, UID: 5}, nil, func() unix.Errno { return 0 }); e != unix.ESRCH {
		t.Errorf("asCaller for a caller that is gone: %v, want ESRCH", e)
	}
}

func TestCallerIdentity(t *testing.T) {
	if tgidOf(unix.Gettid()) != os.Getpid() {
		t.Errorf("tgidOf(gettid) = %d, want %d", tgidOf(unix.Gettid()), os.Getpid())
	}
}

func TestPassthroughReported(t *testing.T) {
	_, _, f := mountForTest(t, Options{Passthrough: PassthroughOff})
	if ok, why := f.PassthroughActive(); ok || why == "" {
		t.Fatalf("--passthrough off: active %v (%q)", ok, why)
	}
}

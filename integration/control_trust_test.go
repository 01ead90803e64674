package integration

// The control protocol acts as root on the caller's behalf: these tests
// check that what it does is what the caller's own system calls through
// the mount would do.
//
// What the daemon falls back to, it says too: in its log, INFO and
// user.phx.info.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
)

var user1000 = asUser(1000)

// childWrite runs the "write" child as cred and returns its WRITE line
// (errno, bytes, whether SIGXFSZ came), or the signal that killed it.
func childWrite(t *testing.T, cred *syscall.Credential, path, how string, off, n, fsize int64) string {
	t.Helper()
	var attr *syscall.SysProcAttr
	if cred != nil {
		attr = &syscall.SysProcAttr{Credential: cred}
	}
	return childWriteAs(t, attr, path, how, off, n, fsize)
}

// childWriteAs is childWrite with the child's process attributes.
func childWriteAs(t *testing.T, attr *syscall.SysProcAttr, path, how string, off, n, fsize int64) string {
	t.Helper()
	c := startChildProc(t, "TestIoctlHelperChild", attr, "write", path, how, fmt.Sprint(off), fmt.Sprint(n), fmt.Sprint(fsize))
	var line string
	var others []string
	for l := range c.lines {
		if strings.HasPrefix(l, "WRITE ") {
			line = l
		} else {
			others = append(others, l)
		}
	}
	err := c.cmd.Wait()
	var ee *exec.ExitError
	if line == "" && errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "killed by " + unix.SignalName(ws.Signal())
		}
	}
	if line == "" {
		t.Fatalf("write child (%s) printed no WRITE line: %v %q", how, err, others)
	}
	return line
}

// TestIoctlWriteIsTheCallersWrite compares each ioctl WRITE with the same
// write(2) through the mount, on twin files: the set-ID bits left, and the
// result, the bytes and the SIGXFSZ under RLIMIT_FSIZE.
func TestIoctlWriteIsTheCallersWrite(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu", "-o", "allow_other"))
	twin := func(name string, mode os.FileMode) (sys, ioc string) {
		for _, p := range []string{name + ".syscall", name + ".ioctl"} {
			writePattern(t, filepath.Join(d.Backing, p), 4096, 0644)
			os.Chown(filepath.Join(d.Backing, p), 1000, 1000)
			if err := os.Chmod(filepath.Join(d.Backing, p), mode); err != nil {
				t.Fatal(err)
			}
		}
		return filepath.Join(d.Mnt, name+".syscall"), filepath.Join(d.Mnt, name+".ioctl")
	}
	modeOf := func(p string) os.FileMode {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return st.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid)
	}

	t.Run("set-ID bits", func(t *testing.T) {
		for _, m := range []os.FileMode{os.ModeSetuid | 0775, os.ModeSetgid | 0775, os.ModeSetuid | os.ModeSetgid | 0775, os.ModeSetgid | 0765} {
			for _, cred := range []*syscall.Credential{user1000, nil} {
				sys, ioc := twin(fmt.Sprintf("setid-%o-%v", m, cred != nil), m)
				a := childWrite(t, cred, sys, "syscall", 0, 100, -1)
				b := childWrite(t, cred, ioc, "ioctl", 0, 100, -1)
				if a != b {
					t.Errorf("mode %v: write(2) %q, ioctl %q", m, a, b)
				}
				if ms, mi := modeOf(sys), modeOf(ioc); ms != mi {
					t.Errorf("mode %v, caller %v: write(2) left %v, the ioctl WRITE %v", m, cred, ms, mi)
				}
			}
		}
	})

	t.Run("user namespace root", func(t *testing.T) {
		// Root in a user namespace of its own (uid and gid 1000 outside)
		// has every capability there and none over the backing files:
		// its write clears set-user-ID as an ordinary user's does.
		userns := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 1000, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 1000, Size: 1}},
			// setuid(0) and setgid(0) inside: uid and gid 1000 outside.
			Credential: &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true}}
		for _, m := range []os.FileMode{os.ModeSetuid | 0755, os.ModeSetuid | os.ModeSetgid | 0775} {
			sys, ioc := twin(fmt.Sprintf("userns-%o", m), m)
			a := childWriteAs(t, userns, sys, "syscall", 0, 100, -1)
			b := childWriteAs(t, userns, ioc, "ioctl", 0, 100, -1)
			if a != b || a != "WRITE OK 100 SIGXFSZ no" {
				t.Errorf("mode %v: write(2) %q, ioctl %q", m, a, b)
			}
			ms, mi := modeOf(sys), modeOf(ioc)
			if ms != mi || mi&os.ModeSetuid != 0 {
				t.Errorf("mode %v, user-namespace root: write(2) left %v, the ioctl WRITE %v", m, ms, mi)
			}
		}
	})

	t.Run("file capabilities", func(t *testing.T) {
		// Any write drops file capabilities: the backing kernel does it for
		// the daemon's write too. security.capability v2: cap_net_raw.
		fcap := []byte{1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		sys, ioc := twin("fcaps", 0755)
		for _, p := range []string{sys, ioc} {
			if err := unix.Setxattr(filepath.Join(d.Backing, filepath.Base(p)), "security.capability", fcap, 0); err != nil {
				t.Fatalf("set file capabilities: %v", err)
			}
		}
		childWrite(t, user1000, sys, "syscall", 0, 100, -1)
		childWrite(t, user1000, ioc, "ioctl", 0, 100, -1)
		buf := make([]byte, 64)
		_, es := unix.Getxattr(filepath.Join(d.Backing, "fcaps.syscall"), "security.capability", buf)
		_, ei := unix.Getxattr(filepath.Join(d.Backing, "fcaps.ioctl"), "security.capability", buf)
		if es != ei {
			t.Errorf("file capabilities after write(2): %v, after the ioctl WRITE: %v", es, ei)
		}
	})

	t.Run("RLIMIT_FSIZE", func(t *testing.T) {
		for _, c := range []struct{ off, n, limit int64 }{
			{0, 1000, 600},   // crosses the limit: cut short
			{1000, 100, 600}, // past it: EFBIG and SIGXFSZ
			{600, 100, 600},  // at it: EFBIG and SIGXFSZ
			{0, 100, 600},    // inside: whole
		} {
			sys, ioc := twin(fmt.Sprintf("fsize-%d-%d", c.off, c.n), 0644)
			a := childWrite(t, user1000, sys, "syscall", c.off, c.n, c.limit)
			b := childWrite(t, user1000, ioc, "ioctl", c.off, c.n, c.limit)
			if a != b {
				t.Errorf("write %d at %d under RLIMIT_FSIZE %d: write(2) %q, ioctl %q", c.n, c.off, c.limit, a, b)
			}
			ws, _ := os.ReadFile(sys)
			wi, _ := os.ReadFile(ioc)
			if !bytes.Equal(ws, wi) {
				t.Errorf("write %d at %d under RLIMIT_FSIZE %d: the files differ afterwards (%d and %d bytes)", c.n, c.off, c.limit, len(ws), len(wi))
			}
		}
	})
}

// TestIoctlWriteInvalidatesCache: on the classic path the kernel caches a
// file's pages and size; after an ioctl WRITE that extends and changes the
// file, a descriptor that had read it and a fresh open both see the new
// bytes and size at once, as after a write(2) through the mount.
func TestIoctlWriteInvalidatesCache(t *testing.T) {
	for _, pt := range []string{"off", "auto"} {
		t.Run("passthrough "+pt, func(t *testing.T) {
			_, old, path := startEmuFile(t, 200000, "--passthrough", pt)
			reader, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer reader.Close()
			if got, _ := readAllAt(reader, 0); !bytes.Equal(got, old) {
				t.Fatalf("first read: %d bytes, not the file", len(got))
			}
			w := openClient(t, path, unix.O_RDWR)
			m := emuBuffer(t, 0, 64<<10)
			fill(m.Bytes(), 0x3C)
			b := register(t, w, m)
			if n, err := w.Write(b, 0, 11000, 190000); err != nil || n != 11000 {
				t.Fatalf("ioctl WRITE = %d, %v", n, err)
			}
			want := append(append([]byte(nil), old[:190000]...), bytes.Repeat([]byte{0x3C}, 11000)...)
			// Reads first: a stat would refresh the size they are cut at.
			if got, _ := readAllAt(reader, 0); !bytes.Equal(got, want) {
				t.Errorf("the reader's descriptor after the ioctl WRITE: %d bytes, not the new %d", len(got), len(want))
			}
			fresh, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(fresh, want) {
				t.Errorf("a fresh open after the ioctl WRITE: %d bytes (%v), not the new %d", len(fresh), err, len(want))
			}
			var st unix.Stat_t
			if err := unix.Fstat(int(reader.Fd()), &st); err != nil || st.Size != int64(len(want)) {
				t.Errorf("fstat after the ioctl WRITE: size %d (%v), want %d", st.Size, err, len(want))
			}
		})
	}
}

// readAllAt reads f from off to its end with pread.
func readAllAt(f *os.File, off int64) ([]byte, error) {
	var out []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := f.ReadAt(buf, off)
		out = append(out, buf[:n]...)
		off += int64(n)
		if err != nil || n == 0 {
			return out, nil
		}
	}
}

// posixACL encodes a system.posix_acl_access value with named users.
func posixACLValue(mode uint32, users map[uint32]uint16) []byte {
	const undef = ^uint32(0)
	var b []byte
	put := func(tag, perm uint16, id uint32) {
		b = append(b, byte(tag), byte(tag>>8), byte(perm), byte(perm>>8), byte(id), byte(id>>8), byte(id>>16), byte(id>>24))
	}
	b = append(b, 2, 0, 0, 0)
	put(0x01, uint16(mode>>6&7), undef)
	for id := uint32(0); id < 1<<16; id++ { // ascending ids, as the kernel requires
		if p, ok := users[id]; ok {
			put(0x02, p, id)
		}
	}
	put(0x04, uint16(mode>>3&7), undef)
	put(0x10, 6, undef)
	put(0x20, uint16(mode&7), undef)
	return b
}

// TestXattrLoadIsTheKernelsDecision: user.phx.load reads the file as the
// caller, so a POSIX ACL grants and refuses exactly as it does to the
// caller's own open(2).
func TestXattrLoadIsTheKernelsDecision(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu", "-o", "allow_other"))
	mk := func(name string, mode uint32, users map[uint32]uint16) string {
		p := filepath.Join(d.Backing, name)
		writePattern(t, p, 100000, 0600)
		os.Chown(p, 1000, 1000)
		if err := unix.Setxattr(p, "system.posix_acl_access", posixACLValue(mode, users), 0); err != nil {
			t.Fatalf("set an ACL on %s: %v", p, err)
		}
		return filepath.Join(d.Mnt, name)
	}
	// The kernel checks write permission on the FUSE inode (mode bits and
	// ACL) before any user.* set; the ACL decides the read.
	granted := mk("granted", 0660, map[uint32]uint16{2000: 6}) // mode: others ---; ACL: 2000 rw-
	denied := mk("denied", 0666, map[uint32]uint16{4000: 2})   // mode: others rw-; ACL: 4000 -w-

	f := openClient(t, filepath.Join(d.Mnt, "granted"), unix.O_RDONLY)
	b := register(t, f, emuBuffer(t, 0, 1<<20))
	tok := "token=" + b.Token.String() + ",offset=0"
	for _, c := range []struct {
		path string
		uid  uint32
		want string
	}{
		{granted, 2000, "OK"},
		{granted, 3000, "Permission denied"},
		{denied, 4000, "Permission denied"},
		{denied, 3000, "OK"},
	} {
		cmd := exec.Command("setfattr", "-n", "user.phx.load", "-v", tok, c.path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: asUser(c.uid)}
		out, err := cmd.CombinedOutput()
		got := "OK"
		if err != nil {
			got = strings.TrimSpace(string(out))
		}
		if !strings.Contains(got, c.want) {
			t.Errorf("uid %d: setfattr user.phx.load %s: %q, want %s", c.uid, filepath.Base(c.path), got, c.want)
		}
	}
}

// TestEngineFallbackIsReported: with io_uring disabled by the kernel
// (kernel.io_uring_disabled=2) while the daemon starts, its workers run
// the sync engine, and the log, INFO and user.phx.info say so and why.
func TestEngineFallbackIsReported(t *testing.T) {
	requireMountEnv(t)
	const knob = "/proc/sys/kernel/io_uring_disabled"
	old, err := os.ReadFile(knob)
	if err != nil {
		t.Fatalf("%s: %v (Linux >= 6.6 has it)", knob, err)
	}
	if err := os.WriteFile(knob, []byte("2"), 0); err != nil {
		t.Fatalf("disable io_uring: %v", err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := os.WriteFile(knob, old, 0); err != nil {
				t.Errorf("restore %s: %v", knob, err)
			}
		}
	}
	defer restore()
	d, _, path := startEmuFile(t, 4096)
	restore() // the rings were made (or not) at start
	if !strings.Contains(d.Stderr(), "io_uring could not be set up") {
		t.Errorf("no log line about the engine fallback:\n%s", d.Stderr())
	}
	f := openClient(t, path, unix.O_RDONLY)
	in, err := f.Info()
	if err != nil {
		t.Fatal(err)
	}
	if in.Flags&client.InfoEngineFallback == 0 || in.Engine != "sync" {
		t.Errorf("INFO: engine %q, flags %#x: want sync and the fallback flag", in.Engine, in.Flags)
	}
	info := phxInfo(t, path)
	if !strings.Contains(info["engine_why"], "io_uring") {
		t.Errorf("user.phx.info engine_why = %q", info["engine_why"])
	}
}

// TestStagedReadPolicyIsReported: the staged transport's read policy and
// its counters are in INFO and user.phx.info: a cold read goes O_DIRECT, a
// cached one through the page cache.
func TestStagedReadPolicyIsReported(t *testing.T) {
	d, want, path := startEmuFile(t, 4<<20, "--emu-staged")
	f := openClient(t, path, unix.O_RDONLY)
	in, err := f.Info()
	if err != nil {
		t.Fatal(err)
	}
	if in.Transport != client.TransportStaged || in.Flags&client.InfoCachestat == 0 {
		t.Fatalf("INFO: transport %v, flags %#x: want staged with cachestat", in.Transport, in.Flags)
	}
	info := phxInfo(t, path)
	if info["read_policy"] != "auto" || info["cachestat"] != "true" {
		t.Errorf("user.phx.info read_policy=%q cachestat=%q", info["read_policy"], info["cachestat"])
	}
	m := emuBuffer(t, 0, 4<<20)
	b := register(t, f, m)
	dropCaches(t)
	if n, err := f.Read(b, 0, 4<<20, 0); err != nil || n != 4<<20 {
		t.Fatalf("cold READ = %d, %v", n, err)
	}
	cold := infoCounter(t, path, "staged_direct_bytes")
	if _, err := os.ReadFile(filepath.Join(d.Backing, "f")); err != nil { // now cached
		t.Fatal(err)
	}
	if n, err := f.Read(b, 0, 4<<20, 0); err != nil || n != 4<<20 {
		t.Fatalf("hot READ = %d, %v", n, err)
	}
	if string(m.Bytes()) != string(want) {
		t.Fatalf("the buffer does not hold the file")
	}
	if cold != 4<<20 || infoCounter(t, path, "staged_buffered_bytes") != 4<<20 {
		t.Errorf("staged_direct_bytes %d after the cold read, staged_buffered_bytes %d after the hot one; want 4 MiB each",
			cold, infoCounter(t, path, "staged_buffered_bytes"))
	}
}

// dropCaches empties the page cache.
func dropCaches(t *testing.T) {
	t.Helper()
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		t.Fatalf("drop caches: %v", err)
	}
}

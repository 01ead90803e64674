package integration

// Creating through the mount is the caller's create: when the kernel
// believes a name absent (a cached negative entry) but the backing
// directory has it since, an O_CREAT open, mkdir, mknod, symlink or link
// through the mount does what the same call by the same caller does on the
// backing directory itself: the kernel judges it by the caller's
// credentials, and nothing the caller did not create becomes the caller's.

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/connector/emu"
)

// nsOp runs one namespace operation in a child process of the attributes
// attr (who) and returns what it printed: "OK", "OK read N sha256 S" for
// an open, or the errno.
func nsOp(t *testing.T, who *syscall.SysProcAttr, op, path string, args ...string) string {
	t.Helper()
	c := startChildProc(t, "TestCreateHelperChild", who, "ns-op", append([]string{op, path}, args...)...)
	return c.expect(t, "RESULT ")
}

// asNobodyProc is a process of nobody's.
var asNobodyProc = &syscall.SysProcAttr{Credential: asUser(nobody)}

// usernsRootOf is root of a user namespace of its own, uid and gid outside
// it: every capability there, none over the files outside.
func usernsRootOf(uid uint32) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(uid), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(uid), Size: 1}},
		Credential:  &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true}}
}

// TestCreateHelperChild is the body of nsOp's child; it skips when run
// normally.
func TestCreateHelperChild(t *testing.T) {
	if os.Getenv("PHX_CHILD") != "ns-op" {
		t.Skip("helper process for the create tests (runs only when re-executed)")
	}
	args := strings.Split(os.Getenv("PHX_CHILD_ARGS"), "\x1f")
	fmt.Printf("RESULT %s\n", runNsOp(args[0], args[1], args[2:]))
	os.Exit(0)
}

// runNsOp runs one operation; "OP@UMASK" runs OP with that umask (octal),
// every other with umask 0.
func runNsOp(op, path string, args []string) string {
	umask := 0
	if o, u, ok := strings.Cut(op, "@"); ok {
		op = o
		m, _ := strconv.ParseUint(u, 8, 32)
		umask = int(m)
	}
	unix.Umask(umask)
	if r, ok := runAttrOp(op, path, args); ok {
		return r
	}
	var err error
	switch op {
	case "stat":
		var st unix.Stat_t
		err = unix.Lstat(path, &st)
	case "open": // args: flags (decimal)
		flags, _ := strconv.Atoi(args[0])
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0644)
		if err != nil {
			return errnoName(err)
		}
		f := os.NewFile(uintptr(fd), path)
		defer f.Close()
		if flags&unix.O_ACCMODE == unix.O_WRONLY {
			return "OK"
		}
		b, err := io.ReadAll(f)
		if err != nil {
			return "READ " + errnoName(err)
		}
		return fmt.Sprintf("OK read %d sha256 %x", len(b), sha256.Sum256(b))
	case "create": // args: mode (octal)
		var fd int
		if fd, err = unix.Open(path, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, octal(args, 0644)); err == nil {
			unix.Close(fd)
		}
	case "mkdir": // args: [mode (octal)]
		err = unix.Mkdir(path, octal(args, 0755))
	case "mkfifo": // args: [mode (octal)]
		err = unix.Mkfifo(path, octal(args, 0644))
	case "symlink": // args: target
		err = unix.Symlink(args[0], path)
	case "link": // args: existing file
		err = unix.Link(args[0], path)
	case "fill": // write a new file until the file system refuses: "ERRNO BYTES"
		return fillFile(path)
	case "fill-ioctl": // the same with WRITE ioctls from an emulated-device buffer
		return fillByIoctl(path)
	default:
		return "BADOP " + op
	}
	return errnoName(err)
}

// fillFile writes a new file at path until a write fails, then fsyncs it
// (delayed allocation may refuse only then): the errno and the bytes
// written.
func fillFile(path string) string {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0644)
	if err != nil {
		return errnoName(err) + " 0"
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	var n int64
	for {
		m, err := f.Write(buf)
		n += int64(m)
		if err == nil && n%(4<<20) == 0 {
			err = f.Sync()
		}
		if err != nil {
			return fmt.Sprintf("%s %d", errnoName(errors.Unwrap(err)), n)
		}
	}
}

// fillByIoctl is fillFile through the mount's WRITE ioctls: a new file,
// written 1 MiB at a time from a registered emulated-device buffer until a
// write fails, synced every 4 MiB.
func fillByIoctl(path string) string {
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0644)
	if err != nil {
		return errnoName(err) + " 0"
	}
	f := client.NewFile(fd, path)
	defer unix.Close(fd)
	conn, err := emu.New(emu.Config{})
	if err != nil {
		return "EMU 0"
	}
	m, err := conn.Alloc(0, 1<<20)
	if err != nil {
		return "ALLOC 0"
	}
	h, _ := m.Export()
	buf, err := f.Register(client.VendorEmu, 0, h, m.Size())
	if err != nil {
		return "REGISTER-" + errnoName(err) + " 0"
	}
	var n int64
	for {
		got, err := f.Write(buf, 0, 1<<20, n)
		n += got
		if err == nil && got < 1<<20 {
			err = unix.ENOSPC // a short write: the file system is full
		}
		if err == nil && n%(4<<20) == 0 {
			err = unix.Fsync(fd)
		}
		if err != nil {
			if e := unix.Fsync(fd); e != nil && !errors.Is(err, unix.ENOSPC) {
				err = e
			}
			return fmt.Sprintf("%s %d", errnoName(err), n)
		}
	}
}

// octal is args[0] as an octal mode, or def when absent.
func octal(args []string, def uint32) uint32 {
	if len(args) == 0 {
		return def
	}
	m, _ := strconv.ParseUint(args[0], 8, 32)
	return uint32(m)
}

// staleSetup makes a 1777 directory "pub" on the backing side and makes
// the kernel cache the absence of name in it (a lookup by nobody through
// the mount).
func staleSetup(t *testing.T, d *daemon, name string) {
	t.Helper()
	pub := filepath.Join(d.Backing, "pub")
	if err := os.Mkdir(pub, 0777); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	must(t, unix.Chmod(pub, 01777))
	if got := nsOp(t, asNobodyProc, "stat", filepath.Join(d.Mnt, "pub", name)); got != "ENOENT" {
		t.Fatalf("lookup of the missing %s through the mount: %s, want ENOENT", name, got)
	}
}

// plant writes root's file p with mode and bytes that name it.
func plant(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	must(t, os.WriteFile(p, []byte("root's bytes for "+filepath.Base(p)+"\n"), 0600))
	must(t, os.Chmod(p, mode))
}

// sameFile says how the files a and b differ in owner, group, mode and
// bytes ("" when they do not).
func sameFile(a, b string) string {
	var sa, sb unix.Stat_t
	if err := unix.Lstat(a, &sa); err != nil {
		return err.Error()
	}
	if err := unix.Lstat(b, &sb); err != nil {
		return err.Error()
	}
	ba, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if sa.Uid != sb.Uid || sa.Gid != sb.Gid || sa.Mode != sb.Mode || !bytes.Equal(ba, bb) {
		return fmt.Sprintf("%d:%d mode %o %q, natively %d:%d mode %o %q", sa.Uid, sa.Gid, sa.Mode, ba, sb.Uid, sb.Gid, sb.Mode, bb)
	}
	return ""
}

// nativeDir is a 1777 directory that nobody can reach, outside any mount.
func nativeDir(t *testing.T) string {
	dir := t.TempDir()
	os.Chmod(filepath.Dir(dir), 0755)
	must(t, unix.Chmod(dir, 01777))
	return dir
}

// overStale runs op as nobody on name through the mount after the kernel
// cached its absence and root planted a file of mode there, and the same
// op natively on a twin: results, and the planted files afterwards, agree.
func overStale(t *testing.T, d *daemon, native, name string, mode os.FileMode, who *syscall.SysProcAttr, op string, args func(dir string) []string) string {
	t.Helper()
	staleSetup(t, d, name)
	mp, np := filepath.Join(d.Backing, "pub", name), filepath.Join(native, name)
	plant(t, mp, mode)
	plant(t, np, mode)
	var margs, nargs []string
	if args != nil {
		margs, nargs = args(filepath.Join(d.Mnt, "pub")), args(native)
	}
	want := nsOp(t, who, op, np, nargs...)
	got := nsOp(t, who, op, filepath.Join(d.Mnt, "pub", name), margs...)
	if got != want {
		t.Errorf("%s %s over a stale negative entry: through the mount %s, native %s", op, name, got, want)
	}
	if msg := sameFile(mp, np); msg != "" {
		t.Errorf("root's %o file %s afterwards: through the mount %s", mode, name, msg)
	}
	return want
}

// TestCreateOverStaleNegativeEntry: under cache=exclusive (a negative
// entry kept for a day) nobody looks up a missing name in a 1777
// directory; root then creates that name on the backing side. An O_CREAT
// open by nobody through the mount, of every flavour, does what native
// open(2) does: EACCES for root's 0600 file (which stays root's, unread,
// untruncated), the existing file opened without a change of owner where
// nobody may open it, EEXIST with O_EXCL. mkdir, mkfifo, symlink and link
// over the stale entry get what they get natively (EEXIST) and change
// nothing. A FIFO planted there is never handed out and never blocks:
// EEXIST (on which the kernel drops the stale entry), or ENXIO for a
// writer with no reader (a non-blocking open). Root of a user namespace
// of its own is refused root's file too.
func TestCreateOverStaleNegativeEntry(t *testing.T) {
	d := startDaemon(t, withArgs("-o", "allow_other,default_permissions,cache=exclusive"))
	native := nativeDir(t)
	for _, c := range []struct {
		name  string
		mode  os.FileMode
		flags int
	}{
		{"rdwr", 0600, unix.O_CREAT | unix.O_RDWR},
		{"wronly-trunc", 0600, unix.O_CREAT | unix.O_WRONLY | unix.O_TRUNC},
		{"rdonly", 0600, unix.O_CREAT | unix.O_RDONLY},
		{"rdwr-excl", 0600, unix.O_CREAT | unix.O_EXCL | unix.O_RDWR},
		{"readable-rdonly", 0644, unix.O_CREAT | unix.O_RDONLY},
		{"readable-trunc", 0644, unix.O_CREAT | unix.O_RDONLY | unix.O_TRUNC},
		{"readable-rdwr", 0644, unix.O_CREAT | unix.O_RDWR},
		{"writable-trunc", 0666, unix.O_CREAT | unix.O_RDWR | unix.O_TRUNC},
	} {
		t.Run("open-"+c.name, func(t *testing.T) {
			flags := strconv.Itoa(c.flags)
			want := overStale(t, d, native, "open-"+c.name, c.mode, asNobodyProc, "open", func(string) []string { return []string{flags} })
			if c.mode == 0600 && strings.HasPrefix(want, "OK") {
				t.Fatalf("native open as nobody of root's 0600 file: %s (the test's premise)", want)
			}
		})
	}
	for _, c := range []struct {
		op   string
		args func(dir string) []string
	}{
		{"mkdir", nil},
		{"mkfifo", nil},
		{"symlink", func(string) []string { return []string{"target"} }},
		{"link", func(dir string) []string { return []string{filepath.Join(dir, "nobodys")} }},
	} {
		t.Run(c.op, func(t *testing.T) {
			for _, dir := range []string{filepath.Join(d.Backing, "pub"), native} {
				must(t, os.WriteFile(filepath.Join(dir, "nobodys"), []byte("n"), 0644))
				must(t, os.Chown(filepath.Join(dir, "nobodys"), nobody, nobody))
			}
			if want := overStale(t, d, native, c.op+"-over", 0600, asNobodyProc, c.op, c.args); want != "EEXIST" {
				t.Errorf("native %s over an existing name: %s, want EEXIST (the test's premise)", c.op, want)
			}
		})
	}
	t.Run("user-namespace-root", func(t *testing.T) {
		// Its capabilities are its namespace's: root's 0600 file is as
		// closed to it as to nobody.
		flags := strconv.Itoa(unix.O_CREAT | unix.O_RDWR)
		if want := overStale(t, d, native, "userns-rdwr", 0600, usernsRootOf(nobody), "open", func(string) []string { return []string{flags} }); want != "EACCES" {
			t.Errorf("native open by a user-namespace root of root's 0600 file: %s, want EACCES (the test's premise)", want)
		}
	})
	t.Run("fifo", func(t *testing.T) {
		staleSetup(t, d, "fifo")
		fifo := filepath.Join(d.Backing, "pub", "fifo")
		must(t, unix.Mkfifo(fifo, 0600))
		must(t, os.Chown(fifo, nobody, nobody))
		// A writer first: ENXIO leaves the negative entry. EEXIST makes the
		// kernel drop it, so after it a lookup sees the FIFO.
		for _, c := range []struct {
			flags int
			want  string
		}{{unix.O_WRONLY, "ENXIO"}, {unix.O_RDONLY, "EEXIST"}} {
			got := nsOp(t, asNobodyProc, "open", filepath.Join(d.Mnt, "pub", "fifo"), strconv.Itoa(unix.O_CREAT|c.flags))
			if got != c.want {
				t.Errorf("O_CREAT open (%#o) over a stale entry where the backing side has a FIFO: %s, want %s", c.flags, got, c.want)
			}
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(d.Mnt, "pub", "fifo"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			t.Errorf("after EEXIST, the mount shows the name as mode %o (%v), want the FIFO", st.Mode, err)
		}
	})
}

// TestCreateOwnershipIsNative: what nobody creates through the mount has
// the owner, group and mode that the same create by nobody gets natively,
// in a plain 1777 directory and in a set-group-ID directory of a group
// nobody is not in (the group is inherited, a file's set-group-ID bit is
// dropped, a directory's kept).
func TestCreateOwnershipIsNative(t *testing.T) {
	d := startDaemon(t, withArgs("-o", "allow_other"))
	native := nativeDir(t)
	const group = 4242
	for _, dir := range []struct {
		name string
		mode os.FileMode
		gid  int
	}{
		{"plain", 0777 | os.ModeSticky, 0},
		{"setgid", 0777 | os.ModeSetgid, group},
	} {
		for _, base := range []string{d.Backing, native} {
			p := filepath.Join(base, dir.name)
			must(t, os.Mkdir(p, 0700))
			must(t, os.Chown(p, 0, dir.gid))
			must(t, os.Chmod(p, dir.mode))
		}
		for _, c := range []struct{ op, name, mode string }{
			{"create", "f", "644"},
			{"create", "f-setgid", "2755"},
			{"create", "f-setuid", "4755"},
			{"mkdir", "d", "755"},
			{"mkdir", "d-setgid", "2755"},
			{"mkfifo", "p", "640"},
			{"symlink", "l", "f"},
		} {
			mnt := filepath.Join(d.Mnt, dir.name, c.name)
			nat := filepath.Join(native, dir.name, c.name)
			got := nsOp(t, asNobodyProc, c.op, mnt, c.mode)
			want := nsOp(t, asNobodyProc, c.op, nat, c.mode)
			if got != want || got != "OK" {
				t.Errorf("%s %s/%s as nobody: through the mount %s, natively %s", c.op, dir.name, c.name, got, want)
				continue
			}
			m, n := statOf(t, filepath.Join(d.Backing, dir.name, c.name)), statOf(t, nat)
			if m.Uid != n.Uid || m.Gid != n.Gid || m.Mode != n.Mode {
				t.Errorf("%s %s/%s as nobody: through the mount %d:%d mode %o, natively %d:%d mode %o",
					c.op, dir.name, c.name, m.Uid, m.Gid, m.Mode, n.Uid, n.Gid, n.Mode)
			}
		}
	}
}

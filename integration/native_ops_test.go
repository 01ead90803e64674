package integration

// The same operations run by the same process credentials through the
// mount and natively on a twin directory outside any mount: every errno,
// and what the files hold afterwards, must agree. The trust tests
// (acl_test.go, names_trust_test.go) build on these helpers.

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// runAttrOp runs the operations runNsOp leaves to it; false for any other.
func runAttrOp(op, path string, args []string) (string, bool) {
	arg := func(i int) string {
		if i < len(args) {
			return args[i]
		}
		return ""
	}
	num := func(i int) int { n, _ := strconv.ParseInt(arg(i), 0, 64); return int(n) }
	var err error
	switch op {
	case "readdir": // the sorted names, hashed
		f, err := os.Open(path)
		if err != nil {
			return errnoName(unwrapErrno(err)), true
		}
		defer f.Close()
		names, err := f.Readdirnames(-1)
		if err != nil {
			return "READ " + errnoName(unwrapErrno(err)), true
		}
		sort.Strings(names)
		return fmt.Sprintf("OK %d names %x", len(names), sha256.Sum256([]byte(strings.Join(names, "/")))), true
	case "write": // args: bytes; appends them
		var fd int
		if fd, err = unix.Open(path, unix.O_WRONLY|unix.O_APPEND|unix.O_CLOEXEC, 0); err == nil {
			_, err = unix.Write(fd, []byte(arg(0)))
			unix.Close(fd)
		}
	case "exec": // runs the program, no arguments
		cmd := exec.Command(path)
		if err := cmd.Run(); err != nil {
			if x, ok := err.(*exec.ExitError); ok {
				return fmt.Sprintf("EXIT %d", x.ExitCode()), true
			}
			return errnoName(unwrapErrno(err)), true
		}
		return "OK", true
	case "unlink":
		err = unix.Unlink(path)
	case "rmdir":
		err = unix.Rmdir(path)
	case "rename", "rename-noreplace", "rename-exchange": // args: new path
		flags := map[string]int{"rename": 0, "rename-noreplace": unix.RENAME_NOREPLACE, "rename-exchange": unix.RENAME_EXCHANGE}[op]
		err = unix.Renameat2(unix.AT_FDCWD, path, unix.AT_FDCWD, arg(0), uint(flags))
	case "chmod": // args: mode (octal, with a leading 0)
		err = unix.Chmod(path, uint32(num(0)))
	case "chown": // args: uid gid (-1: unchanged)
		err = unix.Lchown(path, num(0), num(1))
	case "truncate": // args: size
		err = unix.Truncate(path, int64(num(0)))
	case "utimes-now":
		err = unix.UtimesNanoAt(unix.AT_FDCWD, path, []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_NOW}}, 0)
	case "utimes-set":
		err = unix.UtimesNanoAt(unix.AT_FDCWD, path, []unix.Timespec{{Sec: 1e9}, {Sec: 1e9}}, 0)
	case "setxattr": // args: name, value in hex
		v, _ := hex.DecodeString(arg(1))
		err = unix.Lsetxattr(path, arg(0), v, 0)
	case "removexattr": // args: name
		err = unix.Lremovexattr(path, arg(0))
	case "getxattr": // args: name; the value in hex
		buf := make([]byte, 64<<10)
		n, err := unix.Lgetxattr(path, arg(0), buf)
		if err != nil {
			return errnoName(err), true
		}
		return "OK " + hex.EncodeToString(buf[:n]), true
	case "listxattr": // the sorted names
		buf := make([]byte, 64<<10)
		n, err := unix.Llistxattr(path, buf)
		if err != nil {
			return errnoName(err), true
		}
		names := strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00")
		sort.Strings(names)
		return "OK " + strings.Join(names, ","), true
	default:
		return "", false
	}
	return errnoName(unwrapErrno(err)), true
}

// unwrapErrno is the errno under an *os.PathError or *os.SyscallError.
func unwrapErrno(err error) error {
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	return err
}

// TestNativeOpsHelperChild is the body of opsAs's child; it skips when
// run normally.
func TestNativeOpsHelperChild(t *testing.T) {
	if os.Getenv("PHX_CHILD") != "ns-ops" {
		t.Skip("helper process for the native-comparison tests (runs only when re-executed)")
	}
	for i, op := range strings.Split(os.Getenv("PHX_CHILD_ARGS"), "\x1f") {
		f := strings.Split(op, "\x1e")
		fmt.Printf("RESULT %d %s\n", i, runNsOp(f[0], f[1], f[2:]))
	}
	os.Exit(0)
}

// opsAs runs ops (each: op, path, args...; see runNsOp and runAttrOp) in
// order in one child process of the attributes who, and returns one
// result per op.
func opsAs(t *testing.T, who *syscall.SysProcAttr, ops ...[]string) []string {
	t.Helper()
	enc := make([]string, len(ops))
	for i, op := range ops {
		enc[i] = strings.Join(op, "\x1e")
	}
	c := startChildProc(t, "TestNativeOpsHelperChild", who, "ns-ops", enc...)
	out := make([]string, len(ops))
	for i := range ops {
		r := c.expect(t, "RESULT "+strconv.Itoa(i)+" ")
		out[i] = r
	}
	return out
}

// asUID is a process of uid (gid uid) with the supplementary groups.
func asUID(uid uint32, groups ...uint32) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: append([]uint32{}, groups...)}}
}

// twins is one directory tree made twice: below the mount's backing
// directory (seen through the mount) and outside any mount, where the
// same operations give the native answers.
type twins struct {
	mnt, backing, native string
}

// newTwins makes the twin directories name (root's, 0755) below the
// mount's backing directory and in a directory nobody can reach.
func newTwins(t *testing.T, d *daemon, name string) twins {
	t.Helper()
	nat := t.TempDir()
	must(t, os.Chmod(filepath.Dir(nat), 0755))
	must(t, os.Chmod(nat, 0755))
	w := twins{mnt: filepath.Join(d.Mnt, name), backing: filepath.Join(d.Backing, name), native: filepath.Join(nat, name)}
	w.setup(t, func(dir string) { must(t, os.Mkdir(dir, 0755)) })
	return w
}

// setup runs fn on the backing and the native root.
func (w twins) setup(t *testing.T, fn func(root string)) {
	t.Helper()
	fn(w.backing)
	fn(w.native)
}

// on is ops with every field that starts with "%" rooted at root.
func on(root string, ops [][]string) [][]string {
	out := make([][]string, len(ops))
	for i, op := range ops {
		out[i] = make([]string, len(op))
		for j, f := range op {
			if strings.HasPrefix(f, "%") {
				f = root + f[1:]
			}
			out[i][j] = f
		}
	}
	return out
}

// compare runs ops (paths as "%/rel") as who through the mount and
// natively, and reports every op whose result differs; it returns the
// native results.
func (w twins) compare(t *testing.T, who *syscall.SysProcAttr, ops ...[]string) []string {
	t.Helper()
	want := opsAs(t, who, on(w.native, ops)...)
	got := opsAs(t, who, on(w.mnt, ops)...)
	for i := range ops {
		if got[i] != want[i] {
			t.Errorf("%s as uid %d: through the mount %s, natively %s", strings.Join(ops[i], " "), who.Credential.Uid, got[i], want[i])
		}
	}
	return want
}

// sameState reports where the twins' files rel differ: existence, type,
// owner, mode, size, bytes and ACLs.
func (w twins) sameState(t *testing.T, rels ...string) {
	t.Helper()
	for _, rel := range rels {
		if a, b := describeFile(filepath.Join(w.backing, rel)), describeFile(filepath.Join(w.native, rel)); a != b {
			t.Errorf("%s afterwards: behind the mount %s, natively %s", rel, a, b)
		}
	}
}

// describeFile is what sameState compares of p.
func describeFile(p string) string {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return errnoName(err)
	}
	s := fmt.Sprintf("%d:%d mode %o size %d", st.Uid, st.Gid, st.Mode, st.Size)
	if st.Mode&unix.S_IFMT == unix.S_IFREG {
		b, _ := os.ReadFile(p)
		s += fmt.Sprintf(" %q", b)
	}
	for _, name := range []string{aclAccess, aclDefault} {
		buf := make([]byte, 4096)
		if n, err := unix.Lgetxattr(p, name, buf); err == nil {
			s += fmt.Sprintf(" %s=%x", name, buf[:n])
		}
	}
	return s
}

// POSIX ACLs in the kernel's xattr form (include/uapi/linux/posix_acl_xattr.h),
// so the tests need no setfacl.
const (
	aclAccess  = "system.posix_acl_access"
	aclDefault = "system.posix_acl_default"

	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20
	aclUndef    = ^uint32(0)
)

// aclEntry is one entry: tag, permission bits (rwx = 7), id.
type aclEntry struct {
	tag, perm uint16
	id        uint32
}

// posixACL encodes the entries, sorted by tag and id as the kernel wants
// them.
func posixACL(ents ...aclEntry) []byte {
	ents = slices.Clone(ents)
	slices.SortFunc(ents, func(a, b aclEntry) int {
		if a.tag != b.tag {
			return int(a.tag) - int(b.tag)
		}
		return int(int64(a.id) - int64(b.id))
	})
	b := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range ents {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	return b
}

// aclWith is an ACL of the owner, group and other permissions given, plus
// the named entries (users as aclUser, groups as aclGroup) and mask.
func aclWith(owner, group, other, mask uint16, named ...aclEntry) []byte {
	ents := append([]aclEntry{{aclUserObj, owner, aclUndef}, {aclGroupObj, group, aclUndef},
		{aclMask, mask, aclUndef}, {aclOther, other, aclUndef}}, named...)
	return posixACL(ents...)
}

// setACL sets the ACL xattr name of p.
func setACL(t *testing.T, p, name string, acl []byte) {
	t.Helper()
	if err := unix.Lsetxattr(p, name, acl, 0); err != nil {
		t.Fatalf("setting %s on %s: %v (the test's file system must support POSIX ACLs)", name, p, err)
	}
}

// writeOwned writes p with bytes that name it, owned by uid:gid with mode
// (as chmod(2) takes it: 04777 is set-user-ID).
func writeOwned(t *testing.T, p string, uid, gid int, mode uint32) {
	t.Helper()
	must(t, os.WriteFile(p, []byte("bytes of "+filepath.Base(p)+"\n"), 0600))
	must(t, os.Chown(p, uid, gid))
	must(t, unix.Chmod(p, mode))
}

// mkdirOwned makes directory p owned by uid:gid with mode (as chmod(2)
// takes it: 01777 is sticky).
func mkdirOwned(t *testing.T, p string, uid, gid int, mode uint32) {
	t.Helper()
	must(t, os.Mkdir(p, 0700))
	must(t, os.Chown(p, uid, gid))
	must(t, unix.Chmod(p, mode))
}

// okResult says whether a result is a success.
func okResult(r string) bool { return r == "OK" || strings.HasPrefix(r, "OK ") }

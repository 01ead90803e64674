package integration

// POSIX ACLs through the mount: an open or opendir through the mount gives
// what the same call by the same process gives natively, whether an ACL
// denies what the mode bits allow, grants what they do not, or its mask
// entry limits a named entry; files made in a directory with a default ACL
// inherit it as natively (the caller's umask ignored there, applied
// elsewhere); a change of an ACL on the backing side is enforced through
// the mount within the documented time.

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The processes the ACL tests run: nobody, and uid 4243 with supplementary
// group 4244 (named by group entries).
const (
	otherUID   = 4243
	otherGroup = 4244
)

var asOtherProc = asUID(otherUID, otherGroup)

// mountConfigs are the ways the mount is used by other users: with
// allow_other, and with the kernel's checks off too (nodefault_permissions,
// where only the daemon's open as the caller decides).
var mountConfigs = []struct{ name, opts string }{
	{"default_permissions", "allow_other"},
	{"nodefault_permissions", "allow_other,nodefault_permissions"},
}

// TestACLOpenIsNative: files and directories whose ACL denies nobody what
// the mode bits allow, grants it (or uid 4243 through a group entry) what
// they do not, or limits a named entry by the mask: each open and opendir
// by nobody and by uid 4243 through the mount gives the native result,
// bytes and names included.
func TestACLOpenIsNative(t *testing.T) {
	for _, mc := range mountConfigs {
		t.Run(mc.name, func(t *testing.T) {
			d := startDaemon(t, withArgs("-o", mc.opts))
			w := newTwins(t, d, "acl")
			w.setup(t, func(root string) {
				for _, f := range []struct {
					name string
					mode uint32
					acl  []byte
				}{
					{"deny", 0644, aclWith(6, 4, 4, 4, aclEntry{aclUser, 0, nobody})},
					{"grant", 0600, aclWith(6, 0, 0, 6, aclEntry{aclUser, 6, nobody})},
					{"group", 0600, aclWith(6, 0, 0, 4, aclEntry{aclGroup, 4, otherGroup})},
					{"mask", 0640, aclWith(6, 4, 0, 4, aclEntry{aclUser, 6, nobody})},
				} {
					p := filepath.Join(root, f.name)
					writeOwned(t, p, 0, 0, f.mode)
					setACL(t, p, aclAccess, f.acl)
				}
				for _, dir := range []struct {
					name string
					mode uint32
					acl  []byte
				}{
					{"dir-grant", 0700, aclWith(7, 0, 0, 5, aclEntry{aclUser, 5, nobody})},
					{"dir-deny", 0755, aclWith(7, 5, 5, 5, aclEntry{aclUser, 0, nobody})},
				} {
					p := filepath.Join(root, dir.name)
					mkdirOwned(t, p, 0, 0, dir.mode)
					writeOwned(t, filepath.Join(p, "inside"), 0, 0, 0644)
					setACL(t, p, aclAccess, dir.acl)
				}
			})
			rdonly, rdwr := fmt.Sprint(unix.O_RDONLY), fmt.Sprint(unix.O_RDWR)
			ops := [][]string{
				{"open", "%/deny", rdonly},
				{"open", "%/grant", rdwr},
				{"open", "%/grant", rdonly},
				{"open", "%/group", rdonly},
				{"open", "%/group", rdwr},
				{"open", "%/mask", rdonly},
				{"open", "%/mask", rdwr},
				{"readdir", "%/dir-grant"},
				{"readdir", "%/dir-deny"},
			}
			nat := w.compare(t, asNobodyProc, ops...)
			// The premises: each case is the one it is named for.
			want := []string{"EACCES", "OK", "OK", "EACCES", "EACCES", "OK", "EACCES", "OK", "EACCES"}
			for i, r := range nat {
				if okResult(r) != (want[i] == "OK") || !okResult(r) && r != want[i] {
					t.Errorf("premise: native %v as nobody gave %s, want %s", ops[i], r, want[i])
				}
			}
			nat = w.compare(t, asOtherProc, ops...)
			want = []string{"OK", "EACCES", "EACCES", "OK", "EACCES", "EACCES", "EACCES", "EACCES", "OK"}
			for i, r := range nat {
				if okResult(r) != (want[i] == "OK") || !okResult(r) && r != want[i] {
					t.Errorf("premise: native %v as uid %d gave %s, want %s", ops[i], otherUID, r, want[i])
				}
			}
		})
	}
}

// TestACLDefaultInherited: in a directory with a default ACL (a named
// entry for nobody, a mask), what nobody and uid 4243 create through the
// mount (a file, a directory, a FIFO), under a umask that would take the
// group bits, gets the owner, mode, access ACL (mask entry included) and,
// for a directory, default ACL the same creates get natively; in a plain
// directory the umask applies as natively.
func TestACLDefaultInherited(t *testing.T) {
	d := startDaemon(t, withArgs("-o", "allow_other"))
	w := newTwins(t, d, "inherit")
	w.setup(t, func(root string) {
		dacl := filepath.Join(root, "dacl")
		mkdirOwned(t, dacl, 0, 0, 0777)
		setACL(t, dacl, aclDefault, aclWith(7, 5, 5, 7, aclEntry{aclUser, 7, nobody}, aclEntry{aclGroup, 6, otherGroup}))
		mkdirOwned(t, filepath.Join(root, "plain"), 0, 0, 0777)
	})
	var made []string
	for _, who := range []struct {
		name string
		proc *syscall.SysProcAttr
	}{{"nobody", asNobodyProc}, {"other", asOtherProc}} {
		var ops [][]string
		for _, dir := range []string{"dacl", "plain"} {
			for _, c := range []struct{ op, name, mode string }{
				{"create@077", "f", "666"},
				{"create@022", "g", "640"},
				{"mkdir@077", "d", "777"},
				{"mkfifo@027", "p", "666"},
			} {
				rel := dir + "/" + who.name + "-" + c.name
				ops = append(ops, []string{c.op, "%/" + rel, c.mode})
				made = append(made, rel)
			}
		}
		w.compare(t, who.proc, ops...)
	}
	w.sameState(t, made...)
	// The premise: natively nobody's file in dacl keeps the group bits the
	// umask would have taken (the default ACL's mask).
	if st := statOf(t, filepath.Join(w.native, "dacl/nobody-f")); st.Mode&0070 == 0 {
		t.Errorf("premise: natively the file created under umask 077 in a default-ACL directory has mode %o", st.Mode)
	}
}

// TestACLBackingChangeEnforced: under cache=auto, an ACL set on the
// backing side that denies nobody a directory (or a file) is enforced
// through the mount within the 2 s the README promises: a lookup through
// the directory and an open of the file are refused as natively; the ACL
// removed again, both are allowed again.
func TestACLBackingChangeEnforced(t *testing.T) {
	d := startDaemon(t, withArgs("-o", "allow_other,cache=auto"))
	w := newTwins(t, d, "change")
	w.setup(t, func(root string) {
		mkdirOwned(t, filepath.Join(root, "d"), 0, 0, 0755)
		writeOwned(t, filepath.Join(root, "d/f"), 0, 0, 0644)
		writeOwned(t, filepath.Join(root, "g"), 0, 0, 0644)
	})
	rdonly := fmt.Sprint(unix.O_RDONLY)
	ops := [][]string{{"stat", "%/d/f"}, {"open", "%/g", rdonly}}
	for i, r := range w.compare(t, asNobodyProc, ops...) {
		if !okResult(r) {
			t.Fatalf("premise: native %v as nobody before the change: %s", ops[i], r)
		}
	}
	w.setup(t, func(root string) {
		setACL(t, filepath.Join(root, "d"), aclAccess, aclWith(7, 5, 5, 5, aclEntry{aclUser, 0, nobody}))
		setACL(t, filepath.Join(root, "g"), aclAccess, aclWith(6, 4, 4, 4, aclEntry{aclUser, 0, nobody}))
	})
	waitNative(t, w, asNobodyProc, ops, []string{"EACCES", "EACCES"}, 2*time.Second)
	w.setup(t, func(root string) {
		must(t, unix.Removexattr(filepath.Join(root, "d"), aclAccess))
		must(t, unix.Removexattr(filepath.Join(root, "g"), aclAccess))
	})
	waitNative(t, w, asNobodyProc, ops, []string{"OK", "OK read"}, 2*time.Second)
}

// waitNative runs ops through the mount until each gives the native
// result, which must start with the prefix want gives, failing after
// limit.
func waitNative(t *testing.T, w twins, who *syscall.SysProcAttr, ops [][]string, want []string, limit time.Duration) {
	t.Helper()
	nat := opsAs(t, who, on(w.native, ops)...)
	for i := range ops {
		if len(nat[i]) < len(want[i]) || nat[i][:len(want[i])] != want[i] {
			t.Fatalf("premise: native %v: %s, want %s", ops[i], nat[i], want[i])
		}
	}
	start := time.Now()
	for {
		got := opsAs(t, who, on(w.mnt, ops)...)
		same := true
		for i := range ops {
			same = same && got[i] == nat[i]
		}
		if same {
			t.Logf("through the mount as native after %v", time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(start) > limit {
			t.Fatalf("after %v through the mount %v gives %v, natively %v", limit, ops, got, nat)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestOpenJudgedByTheBackingFile: under cache=exclusive (attributes kept
// for a day), a file made 0600 or given an ACL that denies nobody on the
// backing side is refused to nobody at its next open through the mount, as
// natively: the open runs as the caller against the backing file as it is.
func TestOpenJudgedByTheBackingFile(t *testing.T) {
	d := startDaemon(t, withArgs("-o", "allow_other,cache=exclusive"))
	w := newTwins(t, d, "exclusive")
	w.setup(t, func(root string) {
		writeOwned(t, filepath.Join(root, "chmod"), 0, 0, 0644)
		writeOwned(t, filepath.Join(root, "acl"), 0, 0, 0644)
	})
	rdonly := fmt.Sprint(unix.O_RDONLY)
	ops := [][]string{{"open", "%/chmod", rdonly}, {"open", "%/acl", rdonly}}
	for i, r := range w.compare(t, asNobodyProc, ops...) {
		if !okResult(r) {
			t.Fatalf("premise: native %v as nobody: %s", ops[i], r)
		}
	}
	w.setup(t, func(root string) {
		must(t, os.Chmod(filepath.Join(root, "chmod"), 0600))
		setACL(t, filepath.Join(root, "acl"), aclAccess, aclWith(6, 4, 4, 4, aclEntry{aclUser, 0, nobody}))
	})
	for i, r := range w.compare(t, asNobodyProc, ops...) {
		if r != "EACCES" {
			t.Errorf("premise: native %v as nobody after the change: %s, want EACCES", ops[i], r)
		}
	}
}

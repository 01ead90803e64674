package integration

// Removing, renaming and changing through the mount is the caller's own
// call on the backing file system: where the kernel's cache of the mount
// no longer matches the backing directory (a name replaced, a file chowned
// or chmodded there under cache=exclusive), and where an ACL grants what
// the mode bits do not, unlink, rmdir, rename (with its flags), chmod,
// chown, truncate, utimes and the xattr calls give the errno the same call
// by the same process gives natively, and change what it changes natively.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReplacedNamesJudgedNatively: under cache=exclusive nobody makes
// names in a sticky directory through the mount; root then replaces them
// on the backing side with its own 0600 file and an empty directory of its
// own. nobody's unlink, rmdir, rename, rename with RENAME_EXCHANGE and
// RENAME_NOREPLACE of those names through the mount give what they give
// natively (EPERM: the sticky bit protects root's names; EEXIST) and
// remove or move nothing of root's.
func TestReplacedNamesJudgedNatively(t *testing.T) {
	d := startDaemon(t, withArgs("-o", "allow_other,cache=exclusive"))
	w := newTwins(t, d, "names")
	w.setup(t, func(root string) { mkdirOwned(t, filepath.Join(root, "pub"), 0, 0, 01777) })
	w.compare(t, asNobodyProc,
		[]string{"create", "%/pub/f", "644"},
		[]string{"create", "%/pub/g", "644"},
		[]string{"create", "%/pub/x", "644"},
		[]string{"create", "%/pub/mine", "644"},
		[]string{"mkdir", "%/pub/dd", "755"},
		// The kernel of the mount now holds every name as nobody's.
		[]string{"stat", "%/pub/f"}, []string{"stat", "%/pub/g"}, []string{"stat", "%/pub/x"}, []string{"stat", "%/pub/dd"},
	)
	w.setup(t, func(root string) {
		pub := filepath.Join(root, "pub")
		for _, name := range []string{"f", "g", "x"} {
			writeOwned(t, filepath.Join(pub, ".new"), 0, 0, 0600)
			must(t, os.Rename(filepath.Join(pub, ".new"), filepath.Join(pub, name)))
		}
		must(t, os.Remove(filepath.Join(pub, "dd")))
		mkdirOwned(t, filepath.Join(pub, "dd"), 0, 0, 0755)
	})
	nat := w.compare(t, asNobodyProc,
		[]string{"unlink", "%/pub/f"},
		[]string{"rename", "%/pub/g", "%/pub/g2"},
		[]string{"rename-exchange", "%/pub/mine", "%/pub/x"},
		[]string{"rmdir", "%/pub/dd"},
		[]string{"rename-noreplace", "%/pub/mine", "%/pub/f"},
	)
	for i, want := range []string{"EPERM", "EPERM", "EPERM", "EPERM", "EEXIST"} {
		if nat[i] != want {
			t.Errorf("premise: native op %d as nobody: %s, want %s", i, nat[i], want)
		}
	}
	w.sameState(t, "pub/f", "pub/g", "pub/g2", "pub/x", "pub/mine", "pub/dd")
}

// TestNamespaceErrnosAreNative: the ordinary refusals (no stale cache): in
// root's 0755 directory, in a sticky directory with uid 4243's names, a
// directory moved to another parent without write permission on it, a hard
// link to root's 0600 file (protected_hardlinks) and a successful rename,
// unlink and rmdir: nobody's errnos through the mount are native, and so
// is what is left.
func TestNamespaceErrnosAreNative(t *testing.T) {
	d := startDaemon(t, withArgs("-o", "allow_other"))
	w := newTwins(t, d, "ns")
	w.setup(t, func(root string) {
		mkdirOwned(t, filepath.Join(root, "ro"), 0, 0, 0755)
		writeOwned(t, filepath.Join(root, "ro/file"), 0, 0, 0644)
		mkdirOwned(t, filepath.Join(root, "ro/sub"), 0, 0, 0755)
		mkdirOwned(t, filepath.Join(root, "sticky"), 0, 0, 01777)
		writeOwned(t, filepath.Join(root, "sticky/others"), otherUID, otherUID, 0666)
		writeOwned(t, filepath.Join(root, "sticky/mine"), nobody, nobody, 0644)
		mkdirOwned(t, filepath.Join(root, "open"), 0, 0, 0777)
		mkdirOwned(t, filepath.Join(root, "open2"), 0, 0, 0777)
		mkdirOwned(t, filepath.Join(root, "open/od"), otherUID, otherUID, 0755)
		mkdirOwned(t, filepath.Join(root, "open/nd"), nobody, nobody, 0755)
		writeOwned(t, filepath.Join(root, "open/nf"), nobody, nobody, 0644)
		writeOwned(t, filepath.Join(root, "open/rootfile"), 0, 0, 0600)
	})
	nat := w.compare(t, asNobodyProc,
		[]string{"unlink", "%/ro/file"},
		[]string{"rmdir", "%/ro/sub"},
		[]string{"rename", "%/ro/file", "%/open/file"},
		[]string{"rename", "%/open/nf", "%/ro/nf"},
		[]string{"unlink", "%/sticky/others"},
		[]string{"rename", "%/sticky/others", "%/sticky/o2"},
		[]string{"rename-exchange", "%/sticky/mine", "%/sticky/others"},
		[]string{"rename", "%/open/od", "%/open2/od"},
		[]string{"link", "%/open/hard", "%/open/rootfile"},
		[]string{"symlink", "%/ro/l", "target"},
		[]string{"mkdir", "%/ro/d", "755"},
		[]string{"rename", "%/open/nd", "%/open2/nd"},
		[]string{"rename-noreplace", "%/open/nf", "%/open2/nf"},
		[]string{"unlink", "%/open2/nf"},
		[]string{"rmdir", "%/open2/nd"},
	)
	want := []string{"EACCES", "EACCES", "EACCES", "EACCES", "EPERM", "EPERM", "EPERM", "EACCES", "EPERM", "EACCES", "EACCES", "OK", "OK", "OK", "OK"}
	for i := range want {
		if nat[i] != want[i] {
			t.Errorf("premise: native op %d as nobody: %s, want %s", i, nat[i], want[i])
		}
	}
	w.sameState(t, "ro/file", "ro/sub", "open/file", "ro/nf", "sticky/others", "sticky/o2", "sticky/mine",
		"open/od", "open2/od", "open/hard", "ro/l", "ro/d", "open/nd", "open2/nd", "open/nf", "open2/nf")
}

// TestChangesJudgedByTheBackingFile: under cache=exclusive the kernel of
// the mount keeps attributes from before root chowned nobody's files to
// itself, or took write permission from files, on the backing side.
// nobody's chmod, chown, ACL and xattr changes, truncate and utimes
// through the mount then get the native refusals and change nothing.
func TestChangesJudgedByTheBackingFile(t *testing.T) {
	d := startDaemon(t, withArgs("-o", "allow_other,cache=exclusive"))
	w := newTwins(t, d, "attrs")
	owned := []string{"chmod", "chown", "xattr", "acl", "rmxattr"}
	writable := []string{"truncate", "times", "wxattr"}
	w.setup(t, func(root string) {
		for _, name := range owned {
			writeOwned(t, filepath.Join(root, name), nobody, nobody, 0644)
		}
		for _, name := range writable {
			writeOwned(t, filepath.Join(root, name), 0, 0, 0666)
		}
		must(t, unix.Setxattr(filepath.Join(root, "rmxattr"), "user.keep", []byte("v"), 0))
	})
	var stats [][]string
	for _, name := range append(owned, writable...) {
		stats = append(stats, []string{"stat", "%/" + name})
	}
	w.compare(t, asNobodyProc, stats...)
	w.setup(t, func(root string) {
		for _, name := range owned {
			must(t, os.Chown(filepath.Join(root, name), 0, 0))
		}
		for _, name := range writable {
			must(t, unix.Chmod(filepath.Join(root, name), 0644))
		}
	})
	acl := fmt.Sprintf("%x", aclWith(6, 4, 6, 6))
	nat := w.compare(t, asNobodyProc,
		[]string{"chmod", "%/chmod", "0666"},
		[]string{"chown", "%/chown", "-1", fmt.Sprint(nobody)},
		[]string{"setxattr", "%/xattr", "user.x", "31"},
		[]string{"setxattr", "%/acl", aclAccess, acl},
		[]string{"removexattr", "%/rmxattr", "user.keep"},
		[]string{"truncate", "%/truncate", "0"},
		[]string{"utimes-now", "%/times"},
		[]string{"setxattr", "%/wxattr", "user.y", "31"},
	)
	for i, want := range []string{"EPERM", "EPERM", "EACCES", "EPERM", "EACCES", "EACCES", "EACCES", "EACCES"} {
		if nat[i] != want {
			t.Errorf("premise: native op %d as nobody: %s, want %s", i, nat[i], want)
		}
	}
	w.sameState(t, append(owned, writable...)...)
	for _, name := range []string{"xattr", "rmxattr", "wxattr"} {
		a, _ := listXattrs(filepath.Join(w.backing, name))
		b, _ := listXattrs(filepath.Join(w.native, name))
		if a != b {
			t.Errorf("%s's xattrs afterwards: behind the mount %q, natively %q", name, a, b)
		}
	}
}

// TestACLGrantedChanges: root's 0644 file whose ACL grants nobody write:
// nobody's truncate, utimes to now, user.* xattr and write through the
// mount succeed as natively, and what needs ownership (chmod, explicit
// times, an ACL change) is refused as natively.
func TestACLGrantedChanges(t *testing.T) {
	d := startDaemon(t, withArgs("-o", "allow_other"))
	w := newTwins(t, d, "granted")
	w.setup(t, func(root string) {
		p := filepath.Join(root, "f")
		writeOwned(t, p, 0, 0, 0644)
		setACL(t, p, aclAccess, aclWith(6, 4, 4, 6, aclEntry{aclUser, 6, nobody}))
	})
	nat := w.compare(t, asNobodyProc,
		[]string{"write", "%/f", "more\n"},
		[]string{"truncate", "%/f", "3"},
		[]string{"utimes-now", "%/f"},
		[]string{"setxattr", "%/f", "user.z", "32"},
		[]string{"chmod", "%/f", "0666"},
		[]string{"utimes-set", "%/f"},
		[]string{"setxattr", "%/f", aclAccess, fmt.Sprintf("%x", aclWith(6, 6, 6, 6))},
	)
	for i, want := range []string{"OK", "OK", "OK", "OK", "EPERM", "EPERM", "EPERM"} {
		if nat[i] != want {
			t.Errorf("premise: native op %d as nobody: %s, want %s", i, nat[i], want)
		}
	}
	w.sameState(t, "f")
}

// TestWriteClearsSetID: nobody's write through the mount to root's
// set-user-ID and set-group-ID files that it may write clears those bits,
// as its native write does (the kernel asks the daemon to, with a chmod
// nobody could not make itself), and a 0711 program runs for nobody as
// natively (execute permission, no read permission).
func TestWriteClearsSetID(t *testing.T) {
	for _, mode := range []string{"auto", "off"} {
		t.Run("passthrough="+mode, func(t *testing.T) {
			d := startDaemon(t, withArgs("--passthrough", mode, "-o", "allow_other"))
			w := newTwins(t, d, "setid")
			prog, err := os.ReadFile("/bin/true")
			must(t, err)
			w.setup(t, func(root string) {
				writeOwned(t, filepath.Join(root, "suid"), 0, 0, 04777)
				writeOwned(t, filepath.Join(root, "sgid"), 0, 0, 02777)
				p := filepath.Join(root, "prog")
				must(t, os.WriteFile(p, prog, 0711))
				must(t, os.Chmod(p, 0711))
			})
			w.compare(t, asNobodyProc,
				[]string{"write", "%/suid", "x"},
				[]string{"write", "%/sgid", "x"},
				[]string{"exec", "%/prog"},
				[]string{"open", "%/prog", fmt.Sprint(unix.O_RDONLY)},
			)
			w.sameState(t, "suid", "sgid")
		})
	}
}

// TestListxattrIsTheCallers: a file with user.*, trusted.* and security.*
// names lists, through the mount, what it lists natively to the same
// process: no trusted.* name to nobody, to uid 4243 or to root of a user
// namespace of its own; every name to root.
func TestListxattrIsTheCallers(t *testing.T) {
	d := startDaemon(t, withArgs("-o", "allow_other"))
	w := newTwins(t, d, "lists")
	w.setup(t, func(root string) {
		p := filepath.Join(root, "f")
		writeOwned(t, p, 0, 0, 0644)
		for _, name := range []string{"user.u", "trusted.t", "security.s"} {
			must(t, unix.Setxattr(p, name, []byte("v"), 0))
		}
	})
	for _, who := range []struct {
		name    string
		proc    *syscall.SysProcAttr
		trusted bool
	}{
		{"nobody", asNobodyProc, false},
		{"uid 4243", asOtherProc, false},
		{"user-namespace root", usernsRootOf(nobody), false},
		{"root", asUID(0), true},
	} {
		nat := w.compare(t, who.proc, []string{"listxattr", "%/f"}, []string{"getxattr", "%/f", "trusted.t"})
		if strings.Contains(nat[0], "trusted.t") != who.trusted || !strings.Contains(nat[0], "user.u") {
			t.Errorf("premise: natively %s lists %s", who.name, nat[0])
		}
	}
}

// listXattrs is p's xattr names, sorted, as one string.
func listXattrs(p string) (string, error) {
	r, _ := runAttrOp("listxattr", p, nil)
	return r, nil
}

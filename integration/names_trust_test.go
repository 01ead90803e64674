package integration

// Removing and renaming through the mount is the caller's own call on the
// backing file system: where the kernel's cache of the mount no longer
// matches the backing directory (a name replaced there under
// cache=exclusive), unlink, rmdir and rename (with its flags) give the
// errno the same call by the same process gives natively, and change what
// it changes natively.

import (
	"os"
	"path/filepath"
	"testing"
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

package integration

import (
	"bytes"
	"crypto/sha256"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"golang.org/x/sys/unix"
)

// statOf lstats p.
func statOf(t testing.TB, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	return st
}

// sameStat compares what the mount must report exactly like the backing
// file: inode, size, mode, links, owner, group and modification time.
func sameStat(t testing.TB, what string, b, m unix.Stat_t) {
	t.Helper()
	if b.Ino != m.Ino || b.Size != m.Size || b.Mode != m.Mode || b.Nlink != m.Nlink ||
		b.Uid != m.Uid || b.Gid != m.Gid || b.Mtim != m.Mtim {
		t.Errorf("%s: stat differs:\n backing ino=%d size=%d mode=%o nlink=%d uid=%d gid=%d mtime=%v\n mount   ino=%d size=%d mode=%o nlink=%d uid=%d gid=%d mtime=%v",
			what, b.Ino, b.Size, b.Mode, b.Nlink, b.Uid, b.Gid, b.Mtim,
			m.Ino, m.Size, m.Mode, m.Nlink, m.Uid, m.Gid, m.Mtim)
	}
}

func fileSum(t testing.TB, p string) [32]byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatalf("open %s: %v", p, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

// compareTrees walks the backing directory and the mount side by side:
// the same names, the same stats, the same bytes and link targets.
// It returns the number of entries compared.
func compareTrees(t testing.TB, backing, mnt string) int {
	t.Helper()
	n := 0
	var walk func(rel string)
	walk = func(rel string) {
		bp, mp := filepath.Join(backing, rel), filepath.Join(mnt, rel)
		bst, mst := statOf(t, bp), statOf(t, mp)
		sameStat(t, rel, bst, mst)
		n++
		switch bst.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			if fileSum(t, bp) != fileSum(t, mp) {
				t.Errorf("%s: contents differ", rel)
			}
		case unix.S_IFLNK:
			bl, _ := os.Readlink(bp)
			ml, err := os.Readlink(mp)
			if err != nil || bl != ml {
				t.Errorf("%s: link %q through the mount, %q on backing (%v)", rel, ml, bl, err)
			}
		case unix.S_IFDIR:
			bn, mn := dirNames(t, bp), dirNames(t, mp)
			if !equalStrings(bn, mn) {
				t.Errorf("%s: entries differ:\n backing %v\n mount   %v", rel, bn, mn)
				return
			}
			for _, name := range bn {
				walk(filepath.Join(rel, name))
			}
		}
	}
	walk(".")
	return n
}

func dirNames(t testing.TB, dir string) []string {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		t.Fatalf("readdir %s: %v", dir, err)
	}
	sort.Strings(names)
	return names
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// pattern is deterministic test data: seed selects the sequence.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

func mustEqualFile(t testing.TB, p string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes differ from the %d expected", p, len(got), len(want))
	}
}

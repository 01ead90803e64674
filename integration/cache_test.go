package integration

// Caching with invalidation (fusefs/cache.go, fusefs/watch.go): with
// -o cache=auto on a local file system the kernel keeps names, negative
// names, attributes, file data and listings for an hour, and every change
// made on the backing directory behind the mount's back must still show
// through the mount (stat, read, readdir) within watchBound.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// watchBound is how long a change made on the backing directory may take
// to show through a cache=auto mount of a watched file system in these
// tests (the README's bound; bench-mount's staleness row measures the
// typical time, well under it). The caches hold for an hour, so a missed
// invalidation fails.
const watchBound = 2 * time.Second

// networkBound is the README's bound for a backing directory on a network
// file system: twice the 1 s entry and attribute timeouts of
// cache=revalidate.
const networkBound = 2 * time.Second

// eventually polls check until it returns "" or watchBound passes, then
// fails the test with its last complaint.
func eventually(t testing.TB, what string, check func() string) {
	t.Helper()
	within(t, watchBound, what, check)
}

// networkEventually is eventually for a network backing directory.
func networkEventually(t testing.TB, what string, check func() string) {
	t.Helper()
	within(t, networkBound, what, check)
}

func within(t testing.TB, bound time.Duration, what string, check func() string) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		msg := check()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen through the mount within %v: %s", what, bound, msg)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// view is what the mount shows of a name: stat, bytes, and whether its
// directory lists it.
type view struct {
	err    error
	st     unix.Stat_t
	data   []byte
	listed bool
}

// look stats p and lists its directory; with data, it also reads p (an
// open, at which the overlay revalidates what the kernel keeps of the
// file, so the attribute checks come first, without one).
func look(p string, data bool) view {
	var v view
	v.err = unix.Lstat(p, &v.st)
	if data && v.err == nil && v.st.Mode&unix.S_IFMT == unix.S_IFREG {
		v.data, v.err = os.ReadFile(p)
	}
	ents, _ := os.ReadDir(filepath.Dir(p))
	for _, e := range ents {
		if e.Name() == filepath.Base(p) {
			v.listed = true
		}
	}
	return v
}

// sameAsBacking says how the mount's view of rel differs from the backing
// directory's ("" when it does not): names and attributes, then bytes.
func sameAsBacking(b, m, rel string) string {
	if msg := sameView(rel, look(filepath.Join(b, rel), false), look(filepath.Join(m, rel), false)); msg != "" {
		return msg
	}
	return sameView(rel, look(filepath.Join(b, rel), true), look(filepath.Join(m, rel), true))
}

func sameView(rel string, bv, mv view) string {
	switch {
	case (bv.err == nil) != (mv.err == nil):
		return fmt.Sprintf("%s: backing %v, mount %v", rel, bv.err, mv.err)
	case bv.listed != mv.listed:
		return fmt.Sprintf("%s: listed on the backing side %v, through the mount %v", rel, bv.listed, mv.listed)
	case bv.err != nil:
		return ""
	case bv.st.Ino != mv.st.Ino || bv.st.Size != mv.st.Size || bv.st.Mode != mv.st.Mode || bv.st.Nlink != mv.st.Nlink:
		return fmt.Sprintf("%s: backing ino %d size %d mode %o nlink %d, mount ino %d size %d mode %o nlink %d", rel,
			bv.st.Ino, bv.st.Size, bv.st.Mode, bv.st.Nlink, mv.st.Ino, mv.st.Size, mv.st.Mode, mv.st.Nlink)
	case bv.st.Mtim != mv.st.Mtim || bv.st.Ctim != mv.st.Ctim:
		return fmt.Sprintf("%s: backing mtime %v ctime %v, mount %v %v", rel, bv.st.Mtim, bv.st.Ctim, mv.st.Mtim, mv.st.Ctim)
	case !bytes.Equal(bv.data, mv.data):
		return fmt.Sprintf("%s: backing holds %q, the mount reads %q", rel, clip(bv.data), clip(mv.data))
	}
	return ""
}

func clip(b []byte) []byte { return b[:min(len(b), 24)] }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// backingChange is one kind of change made on the backing side: setup
// prepares the backing directory, then the mount is looked at (filling
// the caches), then change runs; names are what to compare.
type backingChange struct {
	name   string
	setup  func(b string)
	change func(b string)
	names  []string
}

func backingChanges(t *testing.T) []backingChange {
	write := func(p, s string) { must(t, os.WriteFile(p, []byte(s), 0644)) }
	return []backingChange{
		{"create", nil, func(b string) { write(b+"/new", "created") }, []string{"new"}},
		{"write in place", func(b string) { write(b+"/w", "aaaaaaaa") }, func(b string) {
			f, err := os.OpenFile(b+"/w", os.O_WRONLY, 0)
			must(t, err)
			_, err = f.WriteAt([]byte("bbbb"), 2)
			must(t, err)
			must(t, f.Close())
		}, []string{"w"}},
		{"append", func(b string) { write(b+"/a", "head") }, func(b string) {
			f, err := os.OpenFile(b+"/a", os.O_WRONLY|os.O_APPEND, 0)
			must(t, err)
			_, err = f.Write([]byte("+tail"))
			must(t, err)
			must(t, f.Close())
		}, []string{"a"}},
		{"truncate", func(b string) { write(b+"/t", "0123456789") }, func(b string) { must(t, os.Truncate(b+"/t", 3)) }, []string{"t"}},
		{"rename", func(b string) { write(b+"/r1", "moved") }, func(b string) { must(t, os.Rename(b+"/r1", b+"/sub/r2")) }, []string{"r1", "sub/r2"}},
		{"rename over", func(b string) { write(b+"/x", "X"); write(b+"/y", "YY") }, func(b string) { must(t, os.Rename(b+"/x", b+"/y")) }, []string{"x", "y"}},
		{"unlink", func(b string) { write(b+"/u", "gone") }, func(b string) { must(t, os.Remove(b+"/u")) }, []string{"u"}},
		{"mkdir", nil, func(b string) { must(t, os.Mkdir(b+"/dnew", 0750)) }, []string{"dnew"}},
		{"rmdir", func(b string) { must(t, os.Mkdir(b+"/dold", 0755)) }, func(b string) { must(t, os.Remove(b+"/dold")) }, []string{"dold"}},
		{"chmod", func(b string) { write(b+"/m", "mode") }, func(b string) { must(t, os.Chmod(b+"/m", 0600)) }, []string{"m"}},
		{"chown", func(b string) { write(b+"/o", "owner") }, func(b string) { must(t, os.Chown(b+"/o", 1000, 1000)) }, []string{"o"}},
		{"link", func(b string) { write(b+"/l1", "linked") }, func(b string) { must(t, os.Link(b+"/l1", b+"/sub/l2")) }, []string{"l1", "sub/l2"}},
		{"xattr", func(b string) { write(b+"/xa", "attrs") }, func(b string) {
			must(t, unix.Setxattr(b+"/xa", "user.k", []byte("v2"), 0))
		}, []string{"xa"}},
	}
}

// prepare sets the change's directory up under the backing directory b
// and fills the mount m's caches of its names (twice: the second open
// keeps the pages); it returns the directory on both sides.
func (c backingChange) prepare(t *testing.T, b, m string) (bd, md string) {
	bd, md = filepath.Join(b, c.name), filepath.Join(m, c.name)
	must(t, os.MkdirAll(filepath.Join(bd, "sub"), 0755))
	if c.setup != nil {
		c.setup(bd)
	}
	for _, n := range c.names {
		look(filepath.Join(md, n), true)
		look(filepath.Join(md, n), true)
	}
	return bd, md
}

// TestBackingChangesShowThroughTheMount: every kind of change made on the
// backing directory shows through a cache=auto mount (stat, read,
// readdir) within watchBound, on both passthrough modes, after the mount
// has cached the old state (including the negative entry of a name that
// did not exist). A file open through the mount whose name is unlinked on
// the backing side reports nlink 0.
func TestBackingChangesShowThroughTheMount(t *testing.T) {
	eachPassthrough(t, func(t *testing.T, mode string, d *daemon) {
		b, m := d.Backing, d.Mnt
		if got := phxInfo(t, m)["cache"]; got != "watch" {
			t.Fatalf("user.phx.info cache=%q on a local backing directory, want watch", got)
		}
		for _, c := range backingChanges(t) {
			t.Run(strings.ReplaceAll(c.name, " ", "-"), func(t *testing.T) {
				bd, md := c.prepare(t, b, m)
				var open *os.File
				if c.name == "unlink" {
					f, err := os.Open(filepath.Join(md, "u"))
					must(t, err)
					open = f
					defer f.Close()
				}
				c.change(bd)
				for _, n := range c.names {
					eventually(t, c.name+" "+n, func() string { return sameAsBacking(bd, md, n) })
				}
				if open != nil {
					eventually(t, "nlink of an open file unlinked on the backing side", func() string {
						var st unix.Stat_t
						if err := unix.Fstat(int(open.Fd()), &st); err != nil || st.Nlink != 0 {
							return fmt.Sprintf("fstat: nlink %d, %v", st.Nlink, err)
						}
						return ""
					})
				}
			})
		}
		if n := infoCounter(t, m, "watch_invalidations"); n == 0 {
			t.Errorf("watch_invalidations is 0 after %d kinds of backing change", len(backingChanges(t)))
		}
	})
}

// TestExclusiveKeepsTheOldView: cache=exclusive watches nothing (the user
// promised that only the mount changes the directory), so a change made
// behind its back stays unseen; this is also what shows that the caches
// the other tests invalidate really hold.
func TestExclusiveKeepsTheOldView(t *testing.T) {
	d := startDaemon(t, withArgs("-o", "cache=exclusive"))
	b, m := d.Backing, d.Mnt
	must(t, os.WriteFile(b+"/f", []byte("old"), 0644))
	before := look(m+"/f", true)
	look(m+"/new", false)
	must(t, os.Chmod(b+"/f", 0600))
	must(t, os.WriteFile(b+"/new", []byte("n"), 0644))
	time.Sleep(200 * time.Millisecond) // far more than a watched mount takes
	if after := look(m+"/f", false); after.st.Mode != before.st.Mode {
		t.Errorf("cache=exclusive: the mode changed through the mount (%o -> %o): attributes not cached", before.st.Mode, after.st.Mode)
	}
	if v := look(m+"/new", false); !errors.Is(v.err, unix.ENOENT) {
		t.Errorf("cache=exclusive: a name created behind the mount's back shows (%v): negative entries not cached", v.err)
	}
	info := phxInfo(t, m)
	if info["cache"] != "exclusive" || info["watch"] != "off" || info["entry_timeout"] != "86400" {
		t.Errorf("user.phx.info: cache=%q watch=%q entry_timeout=%q", info["cache"], info["watch"], info["entry_timeout"])
	}
}

package integration

// File systems mounted and unmounted below the backing directory
// (fusefs/mounts.go): a mount made after the mount looked at its mount
// point shows within watchBound, as do changes made in it and its
// unmount; a plain umount stays EBUSY while the kernel keeps names below
// it (README, "Caching"), umount -l works and frees the file system.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// mountTmpfs mounts a tmpfs on dir, unmounted (lazily) at the end.
func mountTmpfs(t *testing.T, dir string) uint64 {
	t.Helper()
	must(t, unix.Mount("phx-below", dir, "tmpfs", 0, "size=16m"))
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	var st unix.Stat_t
	must(t, unix.Stat(dir, &st))
	return st.Dev
}

// reads checks that the mount reads want at p ("" for: p does not exist).
func reads(p, want string) string {
	b, err := os.ReadFile(p)
	switch {
	case want == "" && errors.Is(err, os.ErrNotExist):
		return ""
	case want == "":
		return fmt.Sprintf("%s: %q, %v; want it absent", p, b, err)
	case err != nil || string(b) != want:
		return fmt.Sprintf("%s: %q, %v; want %q", p, b, err, want)
	}
	return ""
}

// heldOn counts the daemon's descriptors on device dev.
func heldOn(t *testing.T, d *daemon, dev uint64) int {
	dir := fmt.Sprintf("/proc/%d/fd", d.Cmd.Process.Pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(dir, e.Name()), &st) == nil && st.Dev == dev {
			n++
		}
	}
	return n
}

// TestMountsBelowBacking: with the kernel holding the mount point's name
// for an hour, a tmpfs mounted there shows (its files, its own cache
// class), changes in it show, a plain umount is refused while the kernel
// holds names below it, umount -l shows the directory underneath again
// and the daemon lets go of the tmpfs; a second tmpfs mounted there (the
// same device number, as a rule) is classified and watched afresh.
func TestMountsBelowBacking(t *testing.T) {
	d := startDaemon(t)
	b, m := d.Backing, d.Mnt
	must(t, os.Mkdir(b+"/sub", 0755))
	must(t, os.WriteFile(b+"/sub/under", []byte("underlying"), 0644))
	if msg := reads(m+"/sub/under", "underlying"); msg != "" {
		t.Fatal(msg)
	}
	listDir(m + "/sub")

	dev := mountTmpfs(t, b+"/sub")
	must(t, os.WriteFile(b+"/sub/ontop", []byte("tmpfs one"), 0644))
	eventually(t, "a tmpfs mounted below the backing directory", func() string {
		if msg := reads(m+"/sub/ontop", "tmpfs one"); msg != "" {
			return msg
		}
		return reads(m+"/sub/under", "")
	})
	if info := phxInfo(t, m+"/sub/ontop"); info["cache_fs"] != "tmpfs" || info["cache"] != "watch" {
		t.Errorf("a file on the tmpfs: cache_fs=%q cache=%q", info["cache_fs"], info["cache"])
	}
	if msg := reads(m+"/sub/late", ""); msg != "" {
		t.Fatal(msg)
	}
	must(t, os.WriteFile(b+"/sub/late", []byte("late"), 0644))
	eventually(t, "a name created on the tmpfs", func() string { return reads(m+"/sub/late", "late") })

	err := unix.Unmount(b+"/sub", 0)
	if err == nil {
		t.Logf("umount succeeded: the kernel had already forgotten every name below it")
	} else if !errors.Is(err, unix.EBUSY) {
		t.Fatalf("umount: %v, want EBUSY (the README's word) or success", err)
	} else {
		must(t, unix.Unmount(b+"/sub", unix.MNT_DETACH))
	}
	eventually(t, "the directory underneath after umount -l", func() string {
		if msg := reads(m+"/sub/under", "underlying"); msg != "" {
			return msg
		}
		if msg := reads(m+"/sub/ontop", ""); msg != "" {
			return msg
		}
		if n := heldOn(t, d, dev); n != 0 {
			return fmt.Sprintf("the daemon still holds %d descriptors on the detached tmpfs", n)
		}
		return ""
	})

	again := mountTmpfs(t, b+"/sub")
	t.Logf("first tmpfs dev %d, second %d", dev, again)
	must(t, os.WriteFile(b+"/sub/second", []byte("tmpfs two"), 0644))
	eventually(t, "a second tmpfs", func() string { return reads(m+"/sub/second", "tmpfs two") })
	// A name looked up in vain is cached as missing for the hour: only an
	// event shows it once created.
	if msg := reads(m+"/sub/late", ""); msg != "" {
		t.Fatal(msg)
	}
	must(t, os.WriteFile(b+"/sub/late", []byte("late"), 0644))
	eventually(t, "a name created on the second tmpfs (watched afresh)", func() string { return reads(m+"/sub/late", "late") })
	for _, line := range []string{"noticed by polling /proc/self/mountinfo", "a file system was mounted on " + b + "/sub", "a file system was unmounted from " + b + "/sub"} {
		if !d.WaitLog(line, 0) {
			t.Errorf("the daemon did not log %q:\n%s", line, d.Stderr())
		}
	}
}

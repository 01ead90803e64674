package mounthelper

import (
	"errors"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMountLevel: mount(8)'s, systemd's and fstab's options are consumed;
// the file system's are not, nor a bare prefix.
func TestMountLevel(t *testing.T) {
	for _, o := range []string{"nofail", "_netdev", "noauto", "auto", "defaults", "user", "users", "nouser", "user=alice",
		"owner", "group", "comment=cloud", "x-systemd.automount", "x-systemd.requires=nfs.service",
		"x-systemd.mount-timeout=30", "X-mount.mkdir", "helper=x"} {
		if !MountLevel(o) {
			t.Errorf("%q is not consumed", o)
		}
	}
	for _, o := range []string{"ro", "rw", "allow_other", "cache=auto", "nosuid", "noexec", "nodev", "x-", "user=", "usersx", "fsname=x", ""} {
		if MountLevel(o) {
			t.Errorf("%q is consumed", o)
		}
	}
}

// TestParse: the command lines mount(8) gives (util-linux 2.38, seen with
// a probe helper), and flags in other places.
func TestParse(t *testing.T) {
	cases := []struct {
		argv []string
		want Args
	}{
		{[]string{"/srv/b", "/mnt/m", "-o", "ro,noexec,nosuid,nodev,cache=auto,nofail,_netdev,user,users"},
			Args{Source: "/srv/b", Target: "/mnt/m", Options: "ro,noexec,nosuid,nodev,cache=auto,nofail,_netdev,user,users"}},
		{[]string{"/srv/b", "/mnt/m", "-sfnv", "-o", "rw", "-t", "fuse.phxmount"},
			Args{Source: "/srv/b", Target: "/mnt/m", Options: "rw", Type: Type, Sloppy: true, Fake: true, NoMtab: true, Verbose: true}},
		{[]string{"-o", "ro", "/srv/b", "-oallow_other", "/mnt/m", "-o", ""},
			Args{Source: "/srv/b", Target: "/mnt/m", Options: "ro,allow_other"}},
		{[]string{"/srv/b", "/mnt/m"}, Args{Source: "/srv/b", Target: "/mnt/m"}},
	}
	for _, c := range cases {
		got, err := Parse(c.argv)
		if err != nil || got != c.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", c.argv, got, err, c.want)
		}
	}
	for _, bad := range [][]string{{"/srv/b"}, {"a", "b", "c"}, {"a", "b", "-o"}, {"a", "b", "-x"}, {"a", "b", "-t", "nfs"}, {"a", "b", "-N", "/proc/1/ns/mnt"}} {
		_, err := Parse(bad)
		want := unix.EINVAL
		if slices.Contains(bad, "-N") {
			want = unix.ENOTSUP
		}
		if !errors.Is(err, want) {
			t.Errorf("Parse(%q): %v, want %v", bad, err, want)
		}
	}
}

// TestDaemonArgs: the daemon gets the options as given and the paths after
// "--", so a path that looks like a flag stays a path.
func TestDaemonArgs(t *testing.T) {
	a := Args{Source: "-odd", Target: "/mnt/m", Options: "ro,nofail"}
	if got := a.DaemonArgs(); !slices.Equal(got, []string{"-o", "ro,nofail", "--", "-odd", "/mnt/m"}) {
		t.Errorf("%q", got)
	}
	a.Options = ""
	if got := a.DaemonArgs(); !slices.Equal(got, []string{"--", "-odd", "/mnt/m"}) {
		t.Errorf("%q", got)
	}
}

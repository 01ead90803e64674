// Package mounthelper knows mount(8)'s side of a mount: how it runs a
// helper (`mount -t fuse.phxmount BACKING MNT -o …` and an /etc/fstab
// line run /sbin/mount.fuse.phxmount BACKING MNT [-sfnv] [-N NS] [-o
// OPTS] [-t TYPE]), and which -o options are mount(8)'s own conventions,
// to be consumed rather than passed to FUSE.
//
// mount(8) (util-linux 2.38) strips noauto, auto, defaults, comment= and
// the x-* and X-* comments (x-systemd.*) before it runs a helper, but
// passes nofail, _netdev, user, users, owner and group on, and a `user`
// or `users` line adds noexec, nosuid and nodev (phxmount passes those
// three to the kernel). The daemon accepts every one of them anyway, so
// the same options work when phxmount is started by hand or by a unit.
package mounthelper

import (
	"strings"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// Type is the file system type phxmount mounts: what /proc/mounts shows,
// `mount -t` and fstab's third field name.
const Type = "fuse.phxmount"

// HelperName is the helper's file name; mount(8) looks for it in /sbin
// (and /sbin/fs.d, /sbin/fs) only, whatever the install prefix.
const HelperName = "mount." + Type

// MountLevelOptions are the options that mean something to mount(8),
// systemd or fstab, not to the file system, each with what it means there.
// A name ending in "=" takes a value; one ending in "-" is a prefix.
var MountLevelOptions = []struct{ Name, Doc string }{
	{"defaults", "fstab: the default options"},
	{"auto", "mount -a mounts it"},
	{"noauto", "mount -a and boot skip it"},
	{"nofail", "a failure is not an error at boot (systemd: wanted, not required)"},
	{"_netdev", "needs the network (systemd orders it after network-online.target)"},
	{"user", "an ordinary user may mount it (through the setuid fusermount3) and unmount it"},
	{"user=", "mount(8) records who mounted it"},
	{"nouser", "only root mounts it"},
	{"users", "every user may mount and unmount it"},
	{"nousers", "only root mounts it"},
	{"owner", "the source's owner may mount it"},
	{"noowner", "the source's owner has no say"},
	{"group", "the source's group may mount it"},
	{"nogroup", "the source's group has no say"},
	{"comment=", "fstab: a comment"},
	{"helper=", "mount(8): the umount helper"},
	{"uhelper=", "mount(8): the unprivileged umount helper"},
	{"x-", "comments for systemd and others, e.g. x-systemd.automount, x-systemd.requires=…"},
	{"X-", "comments for mount(8), e.g. X-mount.mkdir"},
}

// MountLevel reports whether the -o option opt (NAME or NAME=VALUE) is one
// of mount(8)'s own, for the daemon to accept and ignore.
func MountLevel(opt string) bool {
	for _, o := range MountLevelOptions {
		n := o.Name
		switch {
		case strings.HasSuffix(n, "=") || strings.HasSuffix(n, "-"):
			if strings.HasPrefix(opt, n) && len(opt) > len(n) {
				return true
			}
		case opt == n:
			return true
		}
	}
	return false
}

// Args is a helper's command line as mount(8) gives it.
type Args struct {
	Source, Target string
	Options        string // the -o list as given (several -o are joined)
	Type           string // -t; "" when not given
	Fake           bool   // -f: check everything, mount nothing
	Sloppy         bool   // -s: mount(8) was asked to tolerate unknown options
	Verbose        bool   // -v
	NoMtab         bool   // -n: nothing to do, mtab is gone
}

// Parse reads a helper's arguments (without the program name). Flags may
// come before, between or after the two paths, as mount(8) and people
// write them.
func Parse(argv []string) (Args, error) {
	var a Args
	var pos []string
	for i := 0; i < len(argv); i++ {
		s := argv[i]
		if !strings.HasPrefix(s, "-") || s == "-" {
			pos = append(pos, s)
			continue
		}
		if s == "-o" || s == "-t" || s == "-N" {
			if i+1 >= len(argv) {
				return a, usage("option %s needs a value", s)
			}
			i++
			if err := a.valued(s[1], argv[i]); err != nil {
				return a, err
			}
			continue
		}
		if err := a.flags(s); err != nil {
			return a, err
		}
	}
	if len(pos) != 2 {
		return a, usage("want SOURCE and MOUNTPOINT, got %d arguments", len(pos))
	}
	a.Source, a.Target = pos[0], pos[1]
	return a, nil
}

// valued takes -o, -t or -N with its value.
func (a *Args) valued(flag byte, v string) error {
	switch flag {
	case 'o':
		if a.Options != "" && v != "" {
			a.Options += ","
		}
		a.Options += v
	case 't':
		if v != Type && v != "phxmount" {
			return usage("-t %s: this helper mounts %s", v, Type)
		}
		a.Type = v
	case 'N':
		return errs.Wrap(HelperName, "", errs.New(unix.ENOTSUP, "-N %s: mounting in another namespace is not supported", v))
	}
	return nil
}

// flags takes a cluster of single-letter flags ("-fv").
func (a *Args) flags(s string) error {
	if strings.HasPrefix(s, "-o") { // -oro,allow_other
		return a.valued('o', s[2:])
	}
	for _, c := range s[1:] {
		switch c {
		case 'f':
			a.Fake = true
		case 's':
			a.Sloppy = true
		case 'v':
			a.Verbose = true
		case 'n':
			a.NoMtab = true
		default:
			return usage("unknown flag -%c (mount(8) passes -s, -f, -n, -v, -o, -t)", c)
		}
	}
	return nil
}

// DaemonArgs is phxmount's command line for the mount: the options as
// given (the daemon consumes mount(8)'s own, see MountLevel), the source
// and the mount point after "--", so a path that starts with "-" stays a
// path.
func (a Args) DaemonArgs() []string {
	var out []string
	if a.Options != "" {
		out = append(out, "-o", a.Options)
	}
	return append(out, "--", a.Source, a.Target)
}

// usage is a command line mount(8) should not have given (EINVAL).
func usage(format string, args ...any) error {
	return errs.Wrap(HelperName, "", errs.New(unix.EINVAL, format, args...))
}

package fusefs

import (
	"context"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Extended attributes: user.phx.* names go to the Control, every other
// name to the backing file.
//
// What the kernel judges natively by the file's attributes runs as the
// caller (ascaller.go), against the backing file as it is: setting and
// removing user.* names (write permission) and system.posix_acl_* (the
// owner), reading user.* names (read permission), and listing (a file
// system lists trusted.* names only to a caller with CAP_SYS_ADMIN).
// Setting and removing trusted.* and security.* names is judged by the
// caller's capabilities, which the kernel has checked before the request
// (they do not go stale as cached attributes do), and the kernel itself
// removes security.capability after a write by anyone (the caller of
// that REMOVEXATTR may not remove it with a call of its own): those run
// as the daemon. The other reads need no permission natively beyond
// reaching the file, and the kernel asks for system.posix_acl_* itself on
// permission checks: they run as the daemon too.

func (n *node) target(ctx context.Context, c Caller) XattrTarget {
	var st unix.Stat_t
	n.stat(&st)
	return XattrTarget{
		Name:   n.relPath(),
		IsRoot: n.isRoot(),
		IsDir:  st.Mode&unix.S_IFMT == unix.S_IFDIR,
		Cache:  n.cacheInfo,
		Open: func(flags int) (int, syscall.Errno) {
			var st unix.Stat_t
			if e := n.stat(&st); e != 0 {
				return -1, e
			}
			if st.Mode&unix.S_IFMT != unix.S_IFREG && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return -1, unix.EINVAL
			}
			if flags&unix.O_ACCMODE != unix.O_RDONLY && n.fsys.opts.ReadOnly {
				return -1, unix.EROFS
			}
			return n.fsys.openWaiting(ctx, flags&^(unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_TRUNC), func(fl int) (int, unix.Errno) {
				return openAsCaller(c, n.pol, n.fd, fl)
			})
		},
	}
}

func isVirtual(name string) bool { return strings.HasPrefix(name, XattrPrefix) }

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if isVirtual(attr) {
		ctl := n.fsys.ctl
		if ctl == nil {
			return 0, unix.ENODATA
		}
		c := callerOf(ctx)
		v, e := ctl.GetXattr(c, n.target(ctx, c), attr)
		if e != 0 {
			return 0, e
		}
		if len(v) > len(dest) {
			return uint32(len(v)), unix.ERANGE
		}
		return uint32(copy(dest, v)), 0
	}
	sz := 0
	get := func() unix.Errno {
		var err error
		sz, err = unix.Getxattr(procSelfFd(n.fd), attr, dest)
		return toErrno(err)
	}
	var e unix.Errno
	if strings.HasPrefix(attr, "user.") {
		e = n.asRequester(ctx, get)
	} else {
		e = get()
	}
	if e == unix.EOPNOTSUPP && isACLName(attr) {
		// A backing file system without ACLs has none: the kernel's
		// permission checks (FUSE_POSIX_ACL) take ENODATA for "no ACL"
		// and would fail with EOPNOTSUPP.
		e = unix.ENODATA
	}
	if e != 0 {
		return uint32(max(sz, 0)), e
	}
	return uint32(sz), 0
}

// isACLName says whether an xattr name is a POSIX ACL's.
func isACLName(attr string) bool {
	return attr == "system.posix_acl_access" || attr == "system.posix_acl_default"
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if isVirtual(attr) {
		ctl := n.fsys.ctl
		if ctl == nil {
			return unix.ENOTSUP
		}
		c := callerOf(ctx)
		return ctl.SetXattr(c, n.target(ctx, c), attr, data)
	}
	return n.asChanger(ctx, attr, func() unix.Errno {
		return toErrno(unix.Setxattr(procSelfFd(n.fd), attr, data, int(flags)))
	})
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if isVirtual(attr) {
		return unix.EPERM // controls and reports: nothing to remove
	}
	return n.asChanger(ctx, attr, func() unix.Errno {
		return toErrno(unix.Removexattr(procSelfFd(n.fd), attr))
	})
}

// asChanger runs fn, which sets or removes the xattr attr, as the caller,
// or as the daemon for a trusted.* or security.* name (see the top of this
// file).
func (n *node) asChanger(ctx context.Context, attr string, fn func() unix.Errno) unix.Errno {
	if strings.HasPrefix(attr, "trusted.") || strings.HasPrefix(attr, "security.") {
		return fn()
	}
	return n.asRequester(ctx, fn)
}

// Listxattr lists the backing file's names as the caller lists them (no
// trusted.* name without CAP_SYS_ADMIN), without any user.phx.* name.
func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	var buf []byte
	if e := n.asRequester(ctx, func() (e unix.Errno) { buf, e = listxattr(procSelfFd(n.fd)); return e }); e != 0 {
		return 0, e
	}
	out := make([]byte, 0, len(buf))
	for _, name := range strings.Split(string(buf), "\x00") {
		if name == "" || isVirtual(name) {
			continue
		}
		out = append(out, name...)
		out = append(out, 0)
	}
	if len(out) > len(dest) {
		return uint32(len(out)), unix.ERANGE
	}
	return uint32(copy(dest, out)), 0
}

// listxattr is listxattr(2) of p into a buffer of the size it needs.
func listxattr(p string) ([]byte, unix.Errno) {
	for {
		sz, err := unix.Listxattr(p, nil)
		if err != nil {
			return nil, toErrno(err)
		}
		buf := make([]byte, sz+256)
		sz, err = unix.Listxattr(p, buf)
		if err == unix.ERANGE {
			continue
		}
		if err != nil {
			return nil, toErrno(err)
		}
		return buf[:sz], 0
	}
}

package fusefs

import (
	"context"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Extended attributes: user.phx.* names go to the Control, every other
// name to the backing file.

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
			return openAsCaller(c, n.fd, flags&^(unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_TRUNC))
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
	sz, err := unix.Getxattr(procSelfFd(n.fd), attr, dest)
	e := toErrno(err)
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
	return toErrno(unix.Setxattr(procSelfFd(n.fd), attr, data, int(flags)))
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if isVirtual(attr) {
		return unix.EPERM // controls and reports: nothing to remove
	}
	return toErrno(unix.Removexattr(procSelfFd(n.fd), attr))
}

// Listxattr lists the backing file's names, without any user.phx.* name.
func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	p := procSelfFd(n.fd)
	var buf []byte
	for {
		sz, err := unix.Listxattr(p, nil)
		if err != nil {
			return 0, toErrno(err)
		}
		buf = make([]byte, sz+256)
		sz, err = unix.Listxattr(p, buf)
		if err == unix.ERANGE {
			continue
		}
		if err != nil {
			return 0, toErrno(err)
		}
		buf = buf[:sz]
		break
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

package fusefs

import (
	"context"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The caller's umask at a create. Natively the kernel applies the umask
// only where the parent directory has no default ACL; where it has one the
// umask is ignored and the default ACL, limited by the mode asked for,
// decides (its mask entry included). So the mount asks the kernel for
// FUSE_DONT_MASK: CREATE, MKDIR and MKNOD then carry the mode as the
// caller asked for it and the caller's umask beside it, and createMode
// decides what the backing create gets.

// umaskBridge sits between go-fuse's server and its node bridge to keep
// each CREATE, MKDIR and MKNOD's umask for the node method that serves it
// (the node API does not pass it), keyed by the request's cancel channel.
type umaskBridge struct {
	fuse.RawFileSystem
	umasks *sync.Map // <-chan struct{} -> uint32
}

func (b umaskBridge) Create(c <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	b.umasks.Store(c, in.Umask)
	defer b.umasks.Delete(c)
	return b.RawFileSystem.Create(c, in, name, out)
}

func (b umaskBridge) Mkdir(c <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	b.umasks.Store(c, in.Umask)
	defer b.umasks.Delete(c)
	return b.RawFileSystem.Mkdir(c, in, name, out)
}

func (b umaskBridge) Mknod(c <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	b.umasks.Store(c, in.Umask)
	defer b.umasks.Delete(c)
	return b.RawFileSystem.Mknod(c, in, name, out)
}

// requestUmask is the umask the request ctx serves was sent with; false
// when it carried none (a call from inside the daemon or a test).
func (f *FS) requestUmask(ctx context.Context) (uint32, bool) {
	fc, ok := ctx.(*fuse.Context)
	if !ok || fc.Cancel == nil {
		return 0, false
	}
	v, ok := f.umasks.Load(fc.Cancel)
	if !ok {
		return 0, false
	}
	return v.(uint32) & 0777, true
}

// asCreator runs fn, which creates a name in the directory n with mode, as
// the caller of the request ctx serves, and returns the mode fn must pass.
// Where the directory has no default ACL the caller's umask is applied
// here and fn runs where the request is served; where it has one (or that
// cannot be told), fn runs on a thread whose umask is the caller's, with
// the mode as asked for, so that the backing kernel applies the umask or
// the default ACL exactly as for the caller's own create, whichever the
// directory has at that moment. The one race: a default ACL added between
// the look and the create gets the umask applied too, which leaves the
// file's permissions narrower than native, never wider.
func (n *node) asCreator(ctx context.Context, mode uint32, fn func(mode uint32) unix.Errno) unix.Errno {
	umask, ok := n.fsys.requestUmask(ctx)
	if !ok {
		return n.asRequester(ctx, func() unix.Errno { return fn(mode) })
	}
	if !n.hasDefaultACL() {
		masked := mode &^ umask
		return n.asRequester(ctx, func() unix.Errno { return fn(masked) })
	}
	c, _ := requestCaller(ctx)
	return asCallerWithUmask(c, n.pol, umask, func() unix.Errno { return fn(mode) })
}

// hasDefaultACL says whether the directory may have a default ACL: true
// unless the backing file system says it has none (ENODATA) or supports
// none (EOPNOTSUPP).
func (n *node) hasDefaultACL() bool {
	_, err := unix.Getxattr(procSelfFd(n.fd), "system.posix_acl_default", nil)
	return err != unix.ENODATA && err != unix.EOPNOTSUPP
}

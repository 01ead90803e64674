package fusefs

import (
	"context"
	"syscall"
)

// This file is the seam between the overlay (nodes, files, passthrough) and
// the control protocol (the project's ioctls and the user.phx.* xattrs).
// The overlay decodes nothing: it hands the raw bytes and the caller's
// identity to a Control and returns what the Control says.

// Caller identifies the process behind a FUSE request.
type Caller struct {
	Tgid int // thread-group (process) id, mapped from the thread id FUSE reports
	Tid  int // the calling thread's id as FUSE reported it
	UID  uint32
	GID  uint32
}

// OpenFile is an open file of the overlay as the control protocol sees it.
type OpenFile struct {
	ID    uint64 // unique per open; buffers registered through it die with it
	Fd    int    // the daemon's descriptor on the backing file
	Flags int    // the flags the caller opened with (O_ACCMODE, O_DIRECT, ...)
	Name  string // path relative to the backing root
	Owner Caller // the process that opened it
	// Changed, when set, tells the overlay that the control wrote
	// [off, off+n) of the file through Fd, so that the kernel's cached
	// pages and attributes of it go.
	Changed func(off, n int64)
	// Cache, when set, reports how the kernel caches the file.
	Cache func() CacheInfo
}

// XattrTarget is the file or directory a user.phx.* xattr request names.
type XattrTarget struct {
	Name   string // path relative to the backing root ("" for the root)
	IsRoot bool
	IsDir  bool
	// Open opens the backing file on behalf of the caller, with the
	// caller's credentials: the kernel refuses what it would refuse the
	// caller (mode bits, ACLs, capabilities).
	Open func(flags int) (fd int, errno syscall.Errno)
	// Cache, when set, reports how the kernel caches the target.
	Cache func() CacheInfo
}

// Control answers the project's ioctls and user.phx.* xattrs.
type Control interface {
	// Ioctl serves one restricted ioctl: in holds the _IOC_SIZE(cmd) bytes the
	// kernel copied in, and out (of the same size, for _IOWR commands) what
	// the kernel copies back. Unknown commands get ENOTTY and are never
	// forwarded to the backing file.
	Ioctl(ctx context.Context, c Caller, f *OpenFile, cmd uint32, in, out []byte) (status int32, errno syscall.Errno)
	// GetXattr answers a user.phx.* name; ENODATA for names it does not know.
	GetXattr(c Caller, t XattrTarget, name string) ([]byte, syscall.Errno)
	// SetXattr serves a user.phx.* control.
	SetXattr(c Caller, t XattrTarget, name string, value []byte) syscall.Errno
	// Released tells the control that an open file was closed for good.
	Released(f *OpenFile)
}

// ShutdownNotifier is a Control that wants to know when the daemon begins
// shutting down (Unmount calls BeginShutdown first): from then on it
// refuses new registrations (ESHUTDOWN) and lets live I/O drain.
type ShutdownNotifier interface {
	BeginShutdown()
}

// XattrPrefix marks the virtual names that never reach a backing file.
const XattrPrefix = "user.phx."

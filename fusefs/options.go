package fusefs

import (
	"time"

	"github.com/sirupsen/logrus"
)

// PassthroughMode says whether opened files use kernel FUSE passthrough.
type PassthroughMode int

const (
	// PassthroughAuto uses passthrough when the kernel allows it and the
	// classic path otherwise, and says which.
	PassthroughAuto PassthroughMode = iota
	// PassthroughOn refuses to mount when passthrough cannot be used.
	PassthroughOn
	// PassthroughOff always uses the classic path.
	PassthroughOff
)

func (m PassthroughMode) String() string {
	switch m {
	case PassthroughOn:
		return "on"
	case PassthroughOff:
		return "off"
	}
	return "auto"
}

// The cache timeouts of cache=off (and before there were cache modes).
const (
	DefaultEntryTimeout    = time.Second
	DefaultAttrTimeout     = time.Second
	DefaultNegativeTimeout = 0
)

// Options configure an overlay. The zero value is a usable configuration:
// no Control (every project ioctl gets ENOTTY, every user.phx.* name
// ENODATA), default_permissions on, cache=auto, passthrough where the
// kernel allows it.
type Options struct {
	// Control answers the project's ioctls and user.phx.* xattrs; nil
	// refuses them.
	Control Control

	// ReadOnly mounts read-only (the kernel refuses writes with EROFS).
	ReadOnly bool
	// AllowOther lets users other than the daemon's use the mount.
	AllowOther bool
	// NoDefaultPermissions turns off the kernel's permission checks
	// (default_permissions, and with them FUSE_POSIX_ACL). Leave it off:
	// with it set nothing checks the search permission of a path or an
	// access the kernel serves from its caches; opens and changes still
	// run as the caller (ascaller.go).
	NoDefaultPermissions bool

	// Cache chooses how the kernel caches, per backing file system
	// (cache.go): auto (the default), exclusive or off.
	Cache CacheMode
	// EntryTimeout, AttrTimeout and NegativeTimeout override the kernel's
	// cache timeouts of every backing file system. Zero keeps the cache
	// mode's (cache=off: 1 s, 1 s, 0); a negative value disables that
	// cache.
	EntryTimeout    time.Duration
	AttrTimeout     time.Duration
	NegativeTimeout time.Duration

	// Passthrough selects kernel passthrough for opened files.
	Passthrough PassthroughMode

	// MaxWrite is the largest WRITE/READ the kernel sends on the classic
	// path (default: the kernel's limit, 1 MiB with the default
	// max_pages_limit). MaxReadAhead is the readahead of classic-path reads
	// (0: DefaultReadAhead; readahead.go).
	// MaxBackground is the number of asynchronous requests the kernel keeps
	// in flight (default 64).
	MaxWrite      int
	MaxReadAhead  int
	MaxBackground int

	// FsName is the source shown in /proc/mounts (default: the backing
	// directory).
	FsName string
	// ExtraMountOptions are passed to the kernel unchanged (-o names it
	// does not know itself).
	ExtraMountOptions []string
	// Debug logs every FUSE request (very verbose).
	Debug bool
	// Log receives the overlay's log lines; nil uses logrus' standard
	// logger.
	Log *logrus.Entry
	// ObserveRequest, when set, receives the service time of every timed
	// request (requests.go: TimedRequests names them).
	ObserveRequest func(op string, d time.Duration)
}

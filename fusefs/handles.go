package fusefs

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
)

// The inodes the kernel knows, by the file handle fanotify names them by,
// and the negative entries it was told to keep: what the watcher needs to
// turn an event into invalidations.

// atHandleFID is AT_HANDLE_FID (Linux 6.5): the handle as fanotify encodes
// it. Earlier kernels refuse the flag; their default encoding is the same
// for the local file systems that fanotify can mark.
const atHandleFID = 0x200

var noHandleFID atomic.Bool

// inodeHandle is the handle of the inode fd refers to.
func inodeHandle(fd int) (unix.FileHandle, error) {
	if !noHandleFID.Load() {
		h, _, err := unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH|atHandleFID)
		if !errors.Is(err, unix.EINVAL) {
			return h, err
		}
		noHandleFID.Store(true)
	}
	h, _, err := unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH)
	return h, err
}

// indexHandle records n under its handle, where its file system is
// watched. The caller holds f.nodesMu.
func (f *FS) indexHandle(n *node) {
	if n.pol.now().class != client.CacheWatch {
		return
	}
	h, err := inodeHandle(n.fd)
	if err != nil {
		return // events about it fall back to its directory and name
	}
	n.hkey = handleKey(n.pol.fsid, h.Type(), h.Bytes())
	f.hmu.Lock()
	f.handles[n.hkey] = n
	f.hmu.Unlock()
}

// unindexHandle forgets n's handle. The caller holds f.nodesMu.
func (f *FS) unindexHandle(n *node) {
	if n.hkey == "" {
		return
	}
	f.hmu.Lock()
	if f.handles[n.hkey] == n {
		delete(f.handles, n.hkey)
	}
	f.hmu.Unlock()
}

// byHandle is the live node of a handle key, or nil.
func (f *FS) byHandle(key string) *node {
	if key == "" {
		return nil
	}
	f.hmu.RLock()
	defer f.hmu.RUnlock()
	return f.handles[key]
}

// childNode is the node the overlay's tree holds under name, or nil.
func (n *node) childNode(name string) *node {
	if ch := n.GetChild(name); ch != nil {
		if c, ok := ch.Operations().(*node); ok {
			return c
		}
	}
	return nil
}

// negatives are the negative entries the kernel may be keeping: no event
// names them when the queue overflows, so they are remembered (up to a
// bound; past it, new negative entries are not cached at all).
type negatives struct {
	mu  sync.Mutex
	m   map[negKey]time.Time // until when the kernel may keep it
	max int
}

type negKey struct {
	parent uint64 // FUSE node id of the directory
	name   string
}

const maxNegatives = 1 << 16

// add remembers a negative entry kept for ttl; false when the table is
// full (the entry must then not be cached).
func (s *negatives) add(parent uint64, name string, ttl time.Duration) bool {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[negKey]time.Time)
	}
	if s.max == 0 {
		s.max = maxNegatives
	}
	if len(s.m) >= s.max {
		for k, until := range s.m {
			if until.Before(now) {
				delete(s.m, k)
			}
		}
		if len(s.m) >= s.max {
			return false
		}
	}
	s.m[negKey{parent, name}] = now.Add(ttl)
	return true
}

// drain returns every remembered entry still possibly cached and forgets
// them all.
func (s *negatives) drain() []negKey {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]negKey, 0, len(s.m))
	for k, until := range s.m {
		if !until.Before(now) {
			out = append(out, k)
		}
	}
	s.m = nil
	return out
}

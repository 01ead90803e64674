package fusefs

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The watcher: one fanotify group (FAN_REPORT_DFID_NAME | FAN_REPORT_FID,
// and FAN_REPORT_TARGET_FID where the kernel has it) with a filesystem
// mark on every local backing file system cache=auto watches. Events name
// a directory by file handle and an entry by name, and the object by file
// handle; the overlay indexes the handles of the inodes the kernel knows
// (handles.go), so an event outside the backing tree, or about an inode
// the kernel never looked up, costs a map lookup and is dropped.
//
// Events caused by the daemon itself (every change made through the mount
// on the classic path: fanotify reports the daemon's pid) need nothing:
// the kernel made the change and updated its caches. Passthrough writes
// reach the backing file from the writing process; a write by a process
// that has the file open for writing through the mount is dropped the same
// way (the kernel updated size and mtime itself), so passthrough writes
// cause no notification storm. Everything else becomes invalidations,
// collected in a set and applied by one goroutine, at most once per
// coalescing interval (watch_apply.go): a burst of events about one file
// costs one notification. A queue overflow, or an event that cannot be
// decoded, invalidates everything.
//
// The watcher fails safe: when reading events fails (or the kernel speaks
// a format it does not know), no change made behind the mount's back
// would be seen again, so every file system it watched falls back to
// revalidation (the short timeouts of cache=auto on a network file
// system), everything the kernel caches is invalidated once, and the log,
// INFO's cache field and user.phx.info (watch=failed) say so.

// watchMask is what the marks report.
const watchMask = unix.FAN_CREATE | unix.FAN_DELETE | unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO |
	unix.FAN_MODIFY | unix.FAN_ATTRIB | unix.FAN_CLOSE_WRITE | unix.FAN_DELETE_SELF |
	unix.FAN_MOVE_SELF | unix.FAN_ONDIR

// WatchStats counts what the watcher did since mount.
type WatchStats struct {
	Active        bool   // a fanotify group reads events
	Failed        bool   // reading failed: the watched file systems revalidate
	Why           string // why not, or why it failed
	Events        uint64 // events about inodes the kernel knows
	Own           uint64 // events the mount's own changes caused, dropped
	Outside       uint64 // events outside the backing tree or about unknown inodes, dropped
	Invalidations uint64 // notifications sent to the kernel
	Flushes       uint64 // times the collected invalidations were applied
	Overflows     uint64 // queue overflows (each invalidated everything)
	Malformed     uint64 // events or batches that could not be decoded (each invalidated everything)
}

// eventSource is what the reader reads events from: the fanotify
// descriptor (a test wraps it to inject faults).
type eventSource interface {
	Read(b []byte) (int, error)
	Close() error
}

// wrapEventSource, when set (tests), wraps every new watcher's source.
var wrapEventSource func(eventSource) eventSource

type watcher struct {
	fsys    *FS
	src     eventSource // the fanotify descriptor, non-blocking, in the poller
	fanFd   int         // its number, for marks
	target  bool        // FAN_REPORT_TARGET_FID: dirent events name the child
	self    int32
	initWhy string // why there is no group ("" when there is)
	// failed is why reading events failed (nil while it works).
	failed   atomic.Pointer[string]
	failOnce sync.Once

	mu      sync.Mutex
	pend    pending
	kick    chan struct{}
	done    chan struct{}
	stopped sync.WaitGroup
	once    sync.Once

	events, own, outside, invals, flushes, overflows, malformed atomic.Uint64
}

// newWatcher makes the fanotify group; without one (no CAP_SYS_ADMIN, a
// kernel before 5.9) it records why, and every file system revalidates.
func newWatcher(f *FS) *watcher {
	w := &watcher{fsys: f, self: int32(os.Getpid()), kick: make(chan struct{}, 1), done: make(chan struct{})}
	base := uint(unix.FAN_CLASS_NOTIF | unix.FAN_CLOEXEC | unix.FAN_NONBLOCK | unix.FAN_REPORT_DFID_NAME | unix.FAN_REPORT_FID)
	fd, err := unix.FanotifyInit(base|unix.FAN_REPORT_TARGET_FID, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_LARGEFILE)
	w.target = err == nil
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.FanotifyInit(base, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_LARGEFILE)
	}
	if err != nil {
		w.initWhy = "fanotify_init(FAN_REPORT_DFID_NAME): " + err.Error()
		switch {
		case errors.Is(err, unix.EPERM):
			w.initWhy += " (needs CAP_SYS_ADMIN)"
		case errors.Is(err, unix.EINVAL):
			w.initWhy += " (needs Linux >= 5.9)"
		}
		return w
	}
	w.src, w.fanFd = os.NewFile(uintptr(fd), "fanotify"), fd
	if wrapEventSource != nil {
		w.src = wrapEventSource(w.src)
	}
	w.pend.init()
	return w
}

// mark places a filesystem mark on the file system fd is on; "" when it
// is watched, else why not.
func (w *watcher) mark(fd int, p *fsPolicy) string {
	if w == nil {
		return "not watched"
	}
	if w.src == nil {
		return w.initWhy
	}
	if why := w.failed.Load(); why != nil {
		return "fanotify failed (" + *why + ")"
	}
	if p.fsid == ([8]byte{}) {
		return "the " + p.fsType + " file system reports no fsid for fanotify to name it by"
	}
	// The mark needs a descriptor that is not O_PATH: name the inode
	// through /proc, which re-opens nothing.
	err := unix.FanotifyMark(w.fanFd, unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM, watchMask, unix.AT_FDCWD, procSelfFd(fd))
	if err != nil {
		why := fmt.Sprintf("fanotify cannot mark the %s file system: %v", p.fsType, err)
		if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENODEV) {
			why += " (it does not give file handles for events)"
		}
		return why
	}
	return ""
}

// start runs the reader and the flusher (after the mount exists: they
// send notifications to it).
func (w *watcher) start() {
	if w == nil || w.src == nil {
		return
	}
	w.stopped.Add(2)
	go w.read()
	go w.flush()
}

// stop ends both goroutines and closes the group.
func (w *watcher) stop() {
	if w == nil || w.src == nil {
		return
	}
	w.once.Do(func() {
		close(w.done)
		w.src.Close() // wakes the reader
		w.stopped.Wait()
	})
}

func (w *watcher) stats() WatchStats {
	if w == nil {
		return WatchStats{Why: "cache mode does not watch"}
	}
	st := WatchStats{Active: w.src != nil, Why: w.initWhy, Events: w.events.Load(), Own: w.own.Load(),
		Outside: w.outside.Load(), Invalidations: w.invals.Load(), Flushes: w.flushes.Load(),
		Overflows: w.overflows.Load(), Malformed: w.malformed.Load()}
	if why := w.failed.Load(); why != nil {
		st.Active, st.Failed, st.Why = false, true, *why
	}
	return st
}

// read turns events into pending invalidations until the group is closed
// or reading fails.
func (w *watcher) read() {
	defer w.stopped.Done()
	buf := make([]byte, 64<<10)
	for {
		n, err := w.src.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.fail(fmt.Sprintf("read: %v", err))
			}
			return
		}
		if !w.consume(buf[:n]) {
			return
		}
		// Let a burst gather in the queue (the kernel merges repeats
		// there) rather than wake for each event: the mount's own
		// changes make events too.
		select {
		case <-time.After(coalesce):
		case <-w.done:
			return
		}
	}
}

// consume collects what one read returned; false when the watcher failed
// on it.
func (w *watcher) consume(b []byte) bool {
	evs, skipped, err := parseEvents(b)
	if errors.Is(err, errEventFormat) {
		w.fail(err.Error())
		return false
	}
	everything := ""
	switch {
	case err != nil:
		everything = fmt.Sprintf("a batch of events could not be decoded (%v)", err)
	case skipped > 0:
		everything = fmt.Sprintf("%d malformed event(s) skipped", skipped)
	}
	w.mu.Lock()
	for i := range evs {
		w.collect(&evs[i])
	}
	if everything != "" {
		// What the lost events were about is unknown.
		w.malformed.Add(1)
		w.pend.everything(everything)
	}
	w.mu.Unlock()
	w.signal()
	return true
}

// fail stops trusting events: every file system the watcher watched
// falls back to revalidation, and everything the kernel caches is
// invalidated once (by the flusher, which goes on running).
func (w *watcher) fail(why string) {
	w.failOnce.Do(func() {
		w.failed.Store(&why)
		n := w.fsys.fallBack()
		w.fsys.log.Errorf("fanotify: %s: changes made behind the mount's back are no longer reported; "+
			"%d watched file system(s) fall back to revalidation (entry and attribute timeouts %s, no negative entries) "+
			"and everything the kernel caches is invalidated", why, n, secs(RevalidateTimeout))
		w.mu.Lock()
		w.pend.everything("fanotify failed")
		w.mu.Unlock()
		w.signal()
	})
}

// fallbackWhy is why a watched file system revalidates once the watcher
// failed ("" while it works).
func (w *watcher) fallbackWhy() string {
	if w == nil {
		return ""
	}
	if why := w.failed.Load(); why != nil {
		return "fanotify failed (" + *why + "): short timeouts and revalidation"
	}
	return ""
}

// active says whether events are read (a fanotify group exists and
// reading has not failed).
func (w *watcher) active() bool { return w != nil && w.src != nil && w.failed.Load() == nil }

func (w *watcher) signal() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// collect turns one event into pending invalidations. The caller holds
// w.mu.
func (w *watcher) collect(ev *fevent) {
	if ev.mask&unix.FAN_Q_OVERFLOW != 0 {
		w.overflows.Add(1)
		w.pend.everything("the event queue overflowed")
		return
	}
	if ev.pid == w.self {
		w.own.Add(1)
		return
	}
	f := w.fsys
	dir, obj := f.byHandle(ev.dir), f.byHandle(ev.obj)
	if dir != nil && ev.name == "." {
		obj, dir = dir, nil // an event on the directory itself
	}
	if dir != nil && obj == nil && ev.mask&(unix.FAN_MODIFY|unix.FAN_ATTRIB|unix.FAN_CLOSE_WRITE) != 0 {
		obj = dir.childNode(ev.name)
	}
	if dir == nil && obj == nil {
		w.outside.Add(1)
		return
	}
	w.events.Add(1)
	if dir != nil {
		// A LOOKUP under way in the directory must not let the kernel
		// keep what it found: the name, or the attributes of an inode
		// the kernel learns of only with that reply (no notification
		// can reach an inode the kernel does not know yet).
		dir.gen.Add(1)
	}
	const dirent = unix.FAN_CREATE | unix.FAN_DELETE | unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO
	if dir != nil && ev.mask&dirent != 0 {
		var gone inodeID
		if ev.mask&unix.FAN_DELETE != 0 && w.target && obj != nil {
			gone = obj.id // the event names the very inode removed
		}
		w.pend.entry(dir.id, ev.name, gone)
		w.pend.inode(dir.id, invalData) // the listing and the directory's times
	}
	if obj == nil {
		return
	}
	switch {
	case ev.mask&(unix.FAN_MODIFY|unix.FAN_CLOSE_WRITE) != 0 && !obj.ownWrite(ev.pid):
		w.pend.inode(obj.id, invalData)
	case ev.mask&(unix.FAN_ATTRIB|dirent|unix.FAN_DELETE_SELF|unix.FAN_MOVE_SELF) != 0:
		w.pend.inode(obj.id, invalAttr)
	default:
		w.own.Add(1) // a passthrough write through the mount
	}
}

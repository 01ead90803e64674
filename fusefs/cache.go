package fusefs

import (
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/internal/errs"
)

// Caching: how long the kernel keeps names, attributes, file data and
// directory listings, chosen per backing file system (per st_dev) from
// the mount's CacheMode:
//
//   - cache=off: 1 s entry and attribute timeouts, no negative entries, no
//     kept file data or listings (what the overlay did before it watched).
//   - cache=auto on a local file system that fanotify can mark: long
//     timeouts, negative entries, FOPEN_KEEP_CACHE on classic-path files
//     and kept directory listings; every change made behind the mount's
//     back is turned into invalidations (watch.go).
//   - cache=auto on a network or cluster file system (or where no mark can
//     be placed): short timeouts; attributes re-read from the server; file
//     data kept across opens only while mtime, ctime and size are
//     unchanged (revalidation).
//   - cache=exclusive: the user promises that only this mount changes the
//     directory: the longest timeouts, nothing watched.
//
// A watched file system falls back to revalidation when the watcher fails
// (watch.go); a file system mounted below the backing directory gets its
// own policy at its first lookup, forgotten when it is unmounted
// (mounts.go).
//
// -o entry_timeout=, attr_timeout= and negative_timeout= override the
// timeouts of every class.

// CacheMode is -o cache=.
type CacheMode int

const (
	// CacheAuto watches local file systems with fanotify and caches long;
	// elsewhere it revalidates with short timeouts (the default).
	CacheAuto CacheMode = iota
	// CacheExclusive caches longest: only this mount changes the backing
	// directory.
	CacheExclusive
	// CacheOff keeps the short timeouts and keeps no data or listings.
	CacheOff
)

func (m CacheMode) String() string {
	switch m {
	case CacheExclusive:
		return "exclusive"
	case CacheOff:
		return "off"
	}
	return "auto"
}

// ParseCacheMode parses "auto", "exclusive" or "off".
func ParseCacheMode(s string) (CacheMode, bool) {
	for _, m := range []CacheMode{CacheAuto, CacheExclusive, CacheOff} {
		if m.String() == s {
			return m, true
		}
	}
	return CacheAuto, false
}

// The timeouts of the classes (entry, attribute and negative-entry alike,
// except where noted).
const (
	// WatchedTimeout: cache=auto on a watched file system; invalidation,
	// not the timeout, keeps the kernel's view current.
	WatchedTimeout = time.Hour
	// ExclusiveTimeout: cache=exclusive.
	ExclusiveTimeout = 24 * time.Hour
	// RevalidateTimeout: entries and attributes on a network file system
	// (no negative entries there).
	RevalidateTimeout = time.Second
)

// fsPolicy is what one backing file system gets. Its class, and what the
// class decides, can change while the mount serves (a watched file system
// falls back to revalidation when the watcher fails, watch.go), so they
// are read through now(); the rest is fixed when the file system is first
// met.
type fsPolicy struct {
	dev     uint64
	fsType  string
	network bool
	fsid    [8]byte // statfs f_fsid, as fanotify reports it
	// forceSync: attributes re-read from the server (AT_STATX_FORCE_SYNC):
	// cache=auto on a network file system, which is never watched.
	forceSync bool
	cur       atomic.Pointer[classPolicy]
}

// classPolicy is what a cache class decides for one file system.
type classPolicy struct {
	class client.CacheClass
	why   string

	entry, attr, negative time.Duration
	keepData              bool // FOPEN_KEEP_CACHE on classic-path files while their stamp holds
	cacheDir              bool // FOPEN_CACHE_DIR: the kernel caches listings
	keepDir               bool // and keeps them across opens
	// exact: every change behind the mount's back is invalidated (watch)
	// or promised away (exclusive), so the mount's own writes need no
	// revalidation at the next open.
	exact bool
}

// now is the class the file system has now.
func (p *fsPolicy) now() *classPolicy { return p.cur.Load() }

// setClass gives p class c, with o's -o *_timeout overrides (nil: none).
func (p *fsPolicy) setClass(c client.CacheClass, why string, o *Options) {
	cp := &classPolicy{class: c, why: why}
	switch c {
	case client.CacheWatch:
		cp.entry, cp.attr, cp.negative = WatchedTimeout, WatchedTimeout, WatchedTimeout
		cp.keepData, cp.cacheDir, cp.keepDir, cp.exact = true, true, true, true
	case client.CacheExclusive:
		cp.entry, cp.attr, cp.negative = ExclusiveTimeout, ExclusiveTimeout, ExclusiveTimeout
		cp.keepData, cp.cacheDir, cp.keepDir, cp.exact = true, true, true, true
	case client.CacheRevalidate:
		cp.entry, cp.attr, cp.negative = RevalidateTimeout, RevalidateTimeout, 0
		cp.keepData, cp.cacheDir = true, true
	default:
		cp.entry, cp.attr, cp.negative = DefaultEntryTimeout, DefaultAttrTimeout, DefaultNegativeTimeout
	}
	if o != nil {
		cp.override(o)
	}
	p.cur.Store(cp)
}

// override applies the -o *_timeout options: > 0 sets, < 0 disables.
func (cp *classPolicy) override(o *Options) {
	set := func(dst *time.Duration, v time.Duration) {
		switch {
		case v > 0:
			*dst = v
		case v < 0:
			*dst = 0
		}
	}
	set(&cp.entry, o.EntryTimeout)
	set(&cp.attr, o.AttrTimeout)
	set(&cp.negative, o.NegativeTimeout)
}

// describe is the policy in one line (the log, user.phx.info, doctor).
func (p *fsPolicy) describe() string {
	cp := p.now()
	var b strings.Builder
	fmt.Fprintf(&b, "%s: entry %s, attr %s, negative %s", cp.class, secs(cp.entry), secs(cp.attr), secs(cp.negative))
	if cp.keepData {
		b.WriteString(", file data kept across opens while mtime/ctime/size hold")
	}
	if cp.keepDir {
		b.WriteString(", listings kept")
	} else if cp.cacheDir {
		b.WriteString(", listings cached per open")
	}
	if p.forceSync {
		b.WriteString(", attributes re-read from the server")
	}
	return b.String()
}

// staleAccess is what a long attribute timeout means for permissions
// where no event ends it (cache=exclusive): "" elsewhere.
func (p *fsPolicy) staleAccess() string {
	cp := p.now()
	if cp.class != client.CacheExclusive || cp.attr <= RevalidateTimeout {
		return ""
	}
	return fmt.Sprintf("security: a permission change made on the backing side to a directory (chmod, chown, an ACL) is not enforced through the mount "+
		"for up to %s for the paths through it: the kernel checks their search permission against the attributes it cached, so a file below "+
		"a directory made 0700 there stays reachable through the mount by whoever could reach it before (a file's own mode and ACL are "+
		"checked at every open, which runs as the caller)", secs(cp.attr))
}

func secs(d time.Duration) string { return fmt.Sprintf("%gs", d.Seconds()) }

// policyOf is the policy of the backing file system fd (a descriptor on
// dev) is on, made once per file system.
func (f *FS) policyOf(fd int, dev uint64) *fsPolicy {
	if p := f.rootPol; p != nil && p.dev == dev {
		return p
	}
	f.polMu.Lock()
	p := f.pols[dev]
	f.polMu.Unlock()
	if p != nil {
		return p
	}
	p = f.newPolicy(fd, dev)
	f.polMu.Lock()
	if q := f.pols[dev]; q != nil {
		p = q
	} else {
		f.fellBack(p)
		f.pols[dev] = p
		f.logPolicy(p)
	}
	f.polMu.Unlock()
	return p
}

// newPolicy classifies the file system fd is on under the mount's mode,
// placing a fanotify mark on it where cache=auto watches it.
func (f *FS) newPolicy(fd int, dev uint64) *fsPolicy {
	p := &fsPolicy{dev: dev, fsType: "unknown"}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err == nil {
		k := fsKindOf(sfs.Type)
		p.fsType, p.network = k.name, k.network
		for i, v := range sfs.Fsid.Val {
			nativeEndian.PutUint32(p.fsid[4*i:], uint32(v))
		}
	}
	o := &f.opts
	switch {
	case o.Cache == CacheOff:
		p.setClass(client.CacheOff, "-o cache=off", o)
	case o.Cache == CacheExclusive:
		p.setClass(client.CacheExclusive, "-o cache=exclusive: only this mount changes the directory", o)
	case p.network:
		p.forceSync = true
		p.setClass(client.CacheRevalidate, p.fsType+" is shared with other machines, whose changes reach no local event: short timeouts and revalidation", o)
	default:
		if why := f.watch.mark(fd, p); why != "" {
			p.setClass(client.CacheRevalidate, why+": short timeouts and revalidation", o)
		} else {
			p.setClass(client.CacheWatch, "fanotify watches every change of the "+p.fsType+" file system", o)
		}
	}
	return p
}

// fallBack gives every watched file system the revalidate class (the
// watcher failed); it returns how many there were. Replies built from now
// on carry the short timeouts; what the kernel already keeps is the
// caller's to invalidate. The caller holds no polMu.
func (f *FS) fallBack() int {
	f.polMu.Lock()
	defer f.polMu.Unlock()
	n := 0
	for _, p := range f.pols {
		if f.fellBack(p) {
			n++
		}
	}
	return n
}

// fellBack gives p the revalidate class if it is watched and the watcher
// failed, and says whether it did. The caller holds polMu: a policy made
// while the watcher failed is caught either here, when policyOf adds it,
// or by fallBack.
func (f *FS) fellBack(p *fsPolicy) bool {
	why := f.watch.fallbackWhy()
	if why == "" || p.now().class != client.CacheWatch {
		return false
	}
	p.setClass(client.CacheRevalidate, why, &f.opts)
	return true
}

func (f *FS) logPolicy(p *fsPolicy) {
	l := f.log.WithField("fs", p.fsType)
	cp := p.now()
	if cp.class == client.CacheRevalidate {
		l.Warnf("cache=%s on %s: %s; %s", f.opts.Cache, p.fsType, cp.why, p.describe())
		return
	}
	l.Infof("cache=%s on %s: %s; %s", f.opts.Cache, p.fsType, cp.why, p.describe())
	if risk := p.staleAccess(); risk != "" {
		l.Warnf("cache=%s on %s: %s", f.opts.Cache, p.fsType, risk)
	}
}

// CacheInfo is how the kernel caches one backing file system, and what
// the invalidation has done so far (INFO, user.phx.info).
type CacheInfo struct {
	Mode                  CacheMode
	Class                 client.CacheClass
	FsType                string
	Network               bool
	Why                   string
	Describe              string
	Entry, Attr, Negative time.Duration
	// StaleAccess: what the timeouts mean for permissions changed on the
	// backing side ("" where events or short timeouts bound it).
	StaleAccess string
	Watch       WatchStats
}

// cacheInfo reports the caching of n's file system.
func (n *node) cacheInfo() CacheInfo { return n.fsys.cacheInfo(n.pol) }

// cacheInfo reports the caching of a file system.
func (f *FS) cacheInfo(p *fsPolicy) CacheInfo {
	cp := p.now()
	return CacheInfo{Mode: f.opts.Cache, Class: cp.class, FsType: p.fsType, Network: p.network, Why: cp.why,
		Describe: p.describe(), Entry: cp.entry, Attr: cp.attr, Negative: cp.negative, StaleAccess: p.staleAccess(),
		Watch: f.watch.stats()}
}

// RootCache reports how the kernel caches the backing root's file system.
func (f *FS) RootCache() CacheInfo { return f.cacheInfo(f.rootPol) }

// ProbeCache says how a mount of dir in mode would cache it, without
// mounting: it classifies dir's file system and, for cache=auto, places a
// fanotify mark on it and drops it again (doctor).
func ProbeCache(dir string, mode CacheMode) (CacheInfo, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return CacheInfo{}, errs.Wrapf(err, "%s", dir)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return CacheInfo{}, errs.Wrapf(err, "stat %s", dir)
	}
	l := logrus.New()
	l.SetOutput(io.Discard)
	f := &FS{opts: Options{Cache: mode}, log: logrus.NewEntry(l)}
	if mode == CacheAuto {
		f.watch = newWatcher(f)
		defer f.watch.stop()
	}
	return f.cacheInfo(f.newPolicy(fd, st.Dev)), nil
}

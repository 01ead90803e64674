package fusefs

import (
	"fmt"
	"io"
	"strings"
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

// fsPolicy is what one backing file system gets.
type fsPolicy struct {
	dev     uint64
	fsType  string
	network bool
	fsid    [8]byte // statfs f_fsid, as fanotify reports it
	class   client.CacheClass
	why     string

	entry, attr, negative time.Duration
	keepData              bool // FOPEN_KEEP_CACHE on classic-path files while their stamp holds
	cacheDir              bool // FOPEN_CACHE_DIR: the kernel caches listings
	keepDir               bool // and keeps them across opens
	forceSync             bool // attributes re-read from the server (AT_STATX_FORCE_SYNC)
	// exact: every change behind the mount's back is invalidated (watch)
	// or promised away (exclusive), so the mount's own writes need no
	// revalidation at the next open.
	exact bool
}

// setClass gives p the timeouts and flags of class c.
func (p *fsPolicy) setClass(c client.CacheClass, why string) {
	p.class, p.why = c, why
	p.keepData, p.cacheDir, p.keepDir, p.forceSync, p.exact = false, false, false, false, false
	switch c {
	case client.CacheWatch:
		p.entry, p.attr, p.negative = WatchedTimeout, WatchedTimeout, WatchedTimeout
		p.keepData, p.cacheDir, p.keepDir, p.exact = true, true, true, true
	case client.CacheExclusive:
		p.entry, p.attr, p.negative = ExclusiveTimeout, ExclusiveTimeout, ExclusiveTimeout
		p.keepData, p.cacheDir, p.keepDir, p.exact = true, true, true, true
	case client.CacheRevalidate:
		p.entry, p.attr, p.negative = RevalidateTimeout, RevalidateTimeout, 0
		p.keepData, p.cacheDir = true, true
		p.forceSync = p.network
	default:
		p.entry, p.attr, p.negative = DefaultEntryTimeout, DefaultAttrTimeout, DefaultNegativeTimeout
	}
}

// override applies the -o *_timeout options: > 0 sets, < 0 disables.
func (p *fsPolicy) override(o *Options) {
	set := func(dst *time.Duration, v time.Duration) {
		switch {
		case v > 0:
			*dst = v
		case v < 0:
			*dst = 0
		}
	}
	set(&p.entry, o.EntryTimeout)
	set(&p.attr, o.AttrTimeout)
	set(&p.negative, o.NegativeTimeout)
}

// describe is the policy in one line (the log, user.phx.info, doctor).
func (p *fsPolicy) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: entry %s, attr %s, negative %s", p.class, secs(p.entry), secs(p.attr), secs(p.negative))
	if p.keepData {
		b.WriteString(", file data kept across opens while mtime/ctime/size hold")
	}
	if p.keepDir {
		b.WriteString(", listings kept")
	} else if p.cacheDir {
		b.WriteString(", listings cached per open")
	}
	if p.forceSync {
		b.WriteString(", attributes re-read from the server")
	}
	return b.String()
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
	switch {
	case f.opts.Cache == CacheOff:
		p.setClass(client.CacheOff, "-o cache=off")
	case f.opts.Cache == CacheExclusive:
		p.setClass(client.CacheExclusive, "-o cache=exclusive: only this mount changes the directory")
	case p.network:
		p.setClass(client.CacheRevalidate, p.fsType+" is shared with other machines, whose changes reach no local event: short timeouts and revalidation")
	default:
		if why := f.watch.mark(fd, p); why != "" {
			p.setClass(client.CacheRevalidate, why+": short timeouts and revalidation")
		} else {
			p.setClass(client.CacheWatch, "fanotify watches every change of the "+p.fsType+" file system")
		}
	}
	p.override(&f.opts)
	return p
}

func (f *FS) logPolicy(p *fsPolicy) {
	l := f.log.WithField("fs", p.fsType)
	if p.class == client.CacheRevalidate {
		l.Warnf("cache=%s on %s: %s; %s", f.opts.Cache, p.fsType, p.why, p.describe())
		return
	}
	l.Infof("cache=%s on %s: %s; %s", f.opts.Cache, p.fsType, p.why, p.describe())
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
	Watch                 WatchStats
}

// cacheInfo reports the caching of n's file system.
func (n *node) cacheInfo() CacheInfo { return n.fsys.cacheInfo(n.pol) }

// cacheInfo reports the caching of a file system.
func (f *FS) cacheInfo(p *fsPolicy) CacheInfo {
	return CacheInfo{Mode: f.opts.Cache, Class: p.class, FsType: p.fsType, Network: p.network, Why: p.why,
		Describe: p.describe(), Entry: p.entry, Attr: p.attr, Negative: p.negative, Watch: f.watch.stats()}
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

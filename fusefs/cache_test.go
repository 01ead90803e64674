package fusefs

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
)

func TestParseCacheMode(t *testing.T) {
	for s, want := range map[string]CacheMode{"auto": CacheAuto, "exclusive": CacheExclusive, "off": CacheOff} {
		if m, ok := ParseCacheMode(s); !ok || m != want || m.String() != s {
			t.Errorf("ParseCacheMode(%q) = %v, %v", s, m, ok)
		}
	}
	for _, bad := range []string{"", "on", "Auto", "exclusive "} {
		if _, ok := ParseCacheMode(bad); ok {
			t.Errorf("ParseCacheMode(%q) accepted", bad)
		}
	}
}

// TestFsKinds: network and cluster file systems are told from local ones
// by their statfs magic; an unknown magic is local, named by its number.
func TestFsKinds(t *testing.T) {
	for magic, want := range map[int64]fsKind{
		0xEF53: {"ext4", false}, 0x58465342: {"xfs", false}, 0x01021994: {"tmpfs", false},
		0x6969: {"nfs", true}, 0x00C36400: {"ceph", true}, 0x0BD00BD0: {"lustre", true},
		0x65735546: {"fuse", true}, 0xFE534D42: {"smb2", true}, 0x47504653: {"gpfs", true},
		0x12345678: {"fs 0x12345678", false},
	} {
		if got := fsKindOf(magic); got != want {
			t.Errorf("fsKindOf(%#x) = %+v, want %+v", magic, got, want)
		}
	}
}

// TestPolicyClasses: the timeouts and flags of each class, and the -o
// *_timeout overrides (positive sets, negative disables) on every class.
func TestPolicyClasses(t *testing.T) {
	h := time.Hour
	for _, tc := range []struct {
		class                 client.CacheClass
		entry, attr, negative time.Duration
		keep, dir, keepDir    bool
		exact                 bool
	}{
		{client.CacheOff, time.Second, time.Second, 0, false, false, false, false},
		{client.CacheWatch, h, h, h, true, true, true, true},
		{client.CacheExclusive, 24 * h, 24 * h, 24 * h, true, true, true, true},
		{client.CacheRevalidate, time.Second, time.Second, 0, true, true, false, false},
	} {
		p := &fsPolicy{}
		p.setClass(tc.class, "why", nil)
		cp := p.now()
		got := []any{cp.entry, cp.attr, cp.negative, cp.keepData, cp.cacheDir, cp.keepDir, cp.exact}
		want := []any{tc.entry, tc.attr, tc.negative, tc.keep, tc.dir, tc.keepDir, tc.exact}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("%s: field %d is %v, want %v", tc.class, i, got[i], want[i])
			}
		}
		if !strings.HasPrefix(p.describe(), tc.class.String()+": entry ") {
			t.Errorf("describe: %q", p.describe())
		}
		p.setClass(tc.class, "why", &Options{EntryTimeout: 5 * time.Second, NegativeTimeout: -1})
		if cp := p.now(); cp.entry != 5*time.Second || cp.attr != tc.attr || cp.negative != 0 {
			t.Errorf("%s overridden: entry %v attr %v negative %v", tc.class, cp.entry, cp.attr, cp.negative)
		}
	}
}

// TestExclusiveStaleAccess: cache=exclusive says that a permission change
// on the backing side is not enforced for its attribute timeout; the
// other classes, bounded by events or 1 s timeouts, say nothing.
func TestExclusiveStaleAccess(t *testing.T) {
	for _, c := range []client.CacheClass{client.CacheOff, client.CacheWatch, client.CacheRevalidate, client.CacheExclusive} {
		p := &fsPolicy{}
		p.setClass(c, "why", nil)
		risk := p.staleAccess()
		if (c == client.CacheExclusive) != (risk != "") {
			t.Errorf("%s: staleAccess %q", c, risk)
		}
		if c == client.CacheExclusive && (!strings.HasPrefix(risk, "security: ") || !strings.Contains(risk, "86400s") || !strings.Contains(risk, "chmod")) {
			t.Errorf("exclusive: %q", risk)
		}
	}
}

func quietFS(mode CacheMode) *FS {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return &FS{opts: Options{Cache: mode}, log: logrus.NewEntry(l), pols: map[uint64]*fsPolicy{}, handles: map[string]*node{}}
}

// TestNewPolicyByMode: cache=off and cache=exclusive apply whatever the
// file system; cache=auto on a local file system watches it where a mark
// can be placed (root) and revalidates otherwise, saying why.
func TestNewPolicyByMode(t *testing.T) {
	dir := t.TempDir()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	unix.Fstat(fd, &st)
	for mode, want := range map[CacheMode]client.CacheClass{CacheOff: client.CacheOff, CacheExclusive: client.CacheExclusive} {
		if p := quietFS(mode).newPolicy(fd, st.Dev); p.now().class != want || p.dev != st.Dev {
			t.Errorf("cache=%s: class %s, dev %d", mode, p.now().class, p.dev)
		}
	}
	f := quietFS(CacheAuto)
	f.watch = newWatcher(f)
	defer f.watch.stop()
	p := f.newPolicy(fd, st.Dev)
	cp := p.now()
	switch {
	case f.watch.active() && cp.class != client.CacheWatch && !strings.Contains(cp.why, "cannot mark"):
		t.Errorf("cache=auto with a fanotify group on %s: %s (%s)", p.fsType, cp.class, cp.why)
	case !f.watch.active() && (cp.class != client.CacheRevalidate || !strings.Contains(cp.why, "fanotify_init")):
		t.Errorf("cache=auto without a fanotify group: %s (%s)", cp.class, cp.why)
	}
	if ci := f.cacheInfo(p); ci.Class != cp.class || ci.Describe != p.describe() || ci.Mode != CacheAuto {
		t.Errorf("cacheInfo: %+v", ci)
	}
}

// TestProbeCache: doctor's probe reports a directory's class without
// mounting, and fails on one that does not exist.
func TestProbeCache(t *testing.T) {
	ci, err := ProbeCache(t.TempDir(), CacheOff)
	if err != nil || ci.Class != client.CacheOff || ci.FsType == "" {
		t.Errorf("ProbeCache(cache=off) = %+v, %v", ci, err)
	}
	if _, err := ProbeCache(filepath.Join(t.TempDir(), "none"), CacheAuto); err == nil {
		t.Errorf("ProbeCache of a missing directory succeeded")
	}
}

// TestStampKeepsData: FOPEN_KEEP_CACHE only while size, mtime and ctime
// are those of the last open, and never where the class keeps no data.
func TestStampKeepsData(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	os.WriteFile(p, []byte("one"), 0644)
	n := &node{pol: &fsPolicy{}}
	n.pol.setClass(client.CacheExclusive, "", nil)
	open := func() uint32 {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		return n.keepData(fd)
	}
	if open() != 0 {
		t.Errorf("first open kept data")
	}
	if open() != fuse.FOPEN_KEEP_CACHE {
		t.Errorf("unchanged file: no FOPEN_KEEP_CACHE")
	}
	past := time.Now().Add(-time.Hour)
	os.Chtimes(p, past, past) // a change of mtime (and ctime) alone
	if open() != 0 {
		t.Errorf("changed mtime: data kept")
	}
	if open() != fuse.FOPEN_KEEP_CACHE {
		t.Errorf("unchanged since: no FOPEN_KEEP_CACHE")
	}
	n.pol.setClass(client.CacheOff, "", nil)
	if open() != 0 {
		t.Errorf("cache=off kept data")
	}
}

// TestNegativesBounded: remembered negative entries are bounded; expired
// ones make room; drain returns the live ones and forgets all.
func TestNegativesBounded(t *testing.T) {
	s := negatives{max: 3}
	for i, name := range []string{"a", "b", "c"} {
		if !s.add(uint64(i), name, time.Hour) {
			t.Fatalf("add %s refused", name)
		}
	}
	if s.add(9, "d", time.Hour) {
		t.Errorf("a fourth entry was accepted past the bound")
	}
	s.m[negKey{0, "a"}] = time.Now().Add(-time.Second) // expired
	if !s.add(9, "d", time.Hour) {
		t.Errorf("an expired entry did not make room")
	}
	if got := s.drain(); len(got) != 3 || len(s.drain()) != 0 {
		t.Errorf("drain: %v", got)
	}
}

// TestCacheKeys: user.phx.info's cache keys as docs/abi.md lists them,
// with watch=inactive and its reason where cache=auto has no fanotify
// group, and watch=off under the other modes.
func TestCacheKeys(t *testing.T) {
	keys := func(ci CacheInfo) map[string]string {
		m := map[string]string{}
		cacheKeys(func(k string, v any) { m[k] = fmt.Sprint(v) }, ci)
		return m
	}
	ci := CacheInfo{Mode: CacheAuto, Class: client.CacheRevalidate, FsType: "ext4", Why: "no group",
		Entry: time.Second, Attr: time.Second, Watch: WatchStats{Why: "fanotify_init: EPERM"}}
	m := keys(ci)
	want := map[string]string{"cache": "revalidate", "cache_mode": "auto", "cache_fs": "ext4", "cache_network": "false",
		"cache_why": "no group", "entry_timeout": "1", "attr_timeout": "1", "negative_timeout": "0",
		"watch": "inactive", "watch_why": "fanotify_init: EPERM", "watch_events": "0", "watch_overflows": "0"}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s=%q, want %q", k, m[k], v)
		}
	}
	ci.Mode, ci.Watch = CacheOff, WatchStats{}
	if m := keys(ci); m["watch"] != "off" || m["watch_why"] != "" {
		t.Errorf("cache=off: watch=%q watch_why=%q", m["watch"], m["watch_why"])
	}
	ci.Mode, ci.Watch = CacheAuto, WatchStats{Active: true, Invalidations: 7}
	if m := keys(ci); m["watch"] != "active" || m["watch_invalidations"] != "7" {
		t.Errorf("watching: watch=%q watch_invalidations=%q", m["watch"], m["watch_invalidations"])
	}
}

package fusefs

import "strings"

// cacheKeys writes user.phx.info's cache keys (docs/abi.md): how the
// kernel caches the target's backing file system, and what the fanotify
// watcher has done since mount.
func cacheKeys(kv func(string, any), ci CacheInfo) {
	kv("cache", ci.Class)
	kv("cache_mode", ci.Mode)
	kv("cache_fs", ci.FsType)
	kv("cache_network", ci.Network)
	kv("cache_why", strings.ReplaceAll(ci.Why, "\n", " "))
	kv("entry_timeout", ci.Entry.Seconds())
	kv("attr_timeout", ci.Attr.Seconds())
	kv("negative_timeout", ci.Negative.Seconds())
	w := ci.Watch
	switch {
	case w.Active:
		kv("watch", "active")
	case w.Failed:
		kv("watch", "failed")
		kv("watch_why", w.Why)
	case ci.Mode == CacheAuto:
		kv("watch", "inactive")
		kv("watch_why", w.Why)
	default:
		kv("watch", "off")
	}
	kv("watch_events", w.Events)
	kv("watch_own", w.Own)
	kv("watch_outside", w.Outside)
	kv("watch_invalidations", w.Invalidations)
	kv("watch_overflows", w.Overflows)
	kv("watch_malformed", w.Malformed)
}

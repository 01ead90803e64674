package fusefs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
)

// fidRec encodes an info record of a fanotify event: an fsid, a handle
// and, for DFID_NAME, a NUL-terminated name.
func fidRec(typ uint8, fsid [8]byte, htype int32, h []byte, name string) []byte {
	var b bytes.Buffer
	b.Write([]byte{typ, 0, 0, 0})
	b.Write(fsid[:])
	binary.Write(&b, nativeEndian, uint32(len(h)))
	binary.Write(&b, nativeEndian, htype)
	b.Write(h)
	if typ == unix.FAN_EVENT_INFO_TYPE_DFID_NAME {
		b.WriteString(name)
		b.WriteByte(0)
	}
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	out := b.Bytes()
	nativeEndian.PutUint16(out[2:], uint16(len(out)))
	return out
}

// event encodes struct fanotify_event_metadata and its records.
func event(mask uint64, pid int32, recs ...[]byte) []byte {
	var b bytes.Buffer
	n := metaLen
	for _, r := range recs {
		n += len(r)
	}
	binary.Write(&b, nativeEndian, uint32(n))
	b.Write([]byte{unix.FANOTIFY_METADATA_VERSION, 0})
	binary.Write(&b, nativeEndian, uint16(metaLen))
	binary.Write(&b, nativeEndian, mask)
	binary.Write(&b, nativeEndian, int32(unix.FAN_NOFD))
	binary.Write(&b, nativeEndian, pid)
	for _, r := range recs {
		b.Write(r)
	}
	return b.Bytes()
}

var testFsid = [8]byte{1, 2, 3, 4, 5, 6, 7, 8}

// TestParseEvents: metadata, a DFID_NAME and a FID record per event, as
// the kernel lays them out; an overflow event with no records; an event
// length that does not fit stops the decoding with EIO, keeping the
// events before it; an unknown metadata version is errEventFormat.
func TestParseEvents(t *testing.T) {
	dirH, objH := []byte{1, 0, 0, 0, 9, 9, 9, 9}, []byte{7, 0, 0, 0, 1, 1, 1, 1}
	buf := append(event(unix.FAN_MODIFY, 42,
		fidRec(unix.FAN_EVENT_INFO_TYPE_DFID_NAME, testFsid, 1, dirH, "file.bin"),
		fidRec(unix.FAN_EVENT_INFO_TYPE_FID, testFsid, 1, objH, "")),
		event(unix.FAN_Q_OVERFLOW, 0)...)
	evs, skipped, err := parseEvents(buf)
	if err != nil || len(evs) != 2 || skipped != 0 {
		t.Fatalf("parseEvents: %d events, %d skipped, %v", len(evs), skipped, err)
	}
	e := evs[0]
	if e.mask != unix.FAN_MODIFY || e.pid != 42 || e.name != "file.bin" ||
		e.dir != handleKey(testFsid, 1, dirH) || e.obj != handleKey(testFsid, 1, objH) {
		t.Errorf("event 0: %+v", e)
	}
	if evs[1].mask != unix.FAN_Q_OVERFLOW || evs[1].dir != "" || evs[1].obj != "" {
		t.Errorf("overflow event: %+v", evs[1])
	}
	if handleKey(testFsid, 1, dirH) == handleKey(testFsid, 2, dirH) || handleKey(testFsid, 1, dirH) == handleKey([8]byte{}, 1, dirH) {
		t.Errorf("handle keys do not tell type or fsid apart")
	}
	bad := append(append([]byte{}, buf[:len(buf)-metaLen]...), 0xff, 0xff)
	if evs, _, err := parseEvents(bad); !errors.Is(err, unix.EIO) || len(evs) != 1 {
		t.Errorf("trailing garbage: %d events, %v", len(evs), err)
	}
	other := append([]byte{}, buf...)
	other[4] = unix.FANOTIFY_METADATA_VERSION + 1
	if _, _, err := parseEvents(other); !errors.Is(err, errEventFormat) {
		t.Errorf("another metadata version: %v", err)
	}
}

// malformedBatch is three events about dir/a, dir/b and dir/c, the middle
// one with a handle longer than its record.
func malformedBatch(dir []byte) []byte {
	var b []byte
	for _, name := range []string{"a", "b", "c"} {
		ev := event(unix.FAN_CREATE, 7, fidRec(unix.FAN_EVENT_INFO_TYPE_DFID_NAME, testFsid, 1, dir, name))
		if name == "b" {
			nativeEndian.PutUint32(ev[metaLen+12:], 4096)
		}
		b = append(b, ev...)
	}
	return b
}

// TestParseEventsSkipsAMalformedEvent: an event whose record does not
// decode is skipped and counted; the events after it in the batch are
// still decoded.
func TestParseEventsSkipsAMalformedEvent(t *testing.T) {
	evs, skipped, err := parseEvents(malformedBatch([]byte("dir")))
	if err != nil || skipped != 1 || len(evs) != 2 || evs[0].name != "a" || evs[1].name != "c" {
		t.Fatalf("parseEvents: %+v, %d skipped, %v", evs, skipped, err)
	}
}

// watchFixture is a watcher over an unmounted FS with a directory and a
// file indexed by handle.
func watchFixture() (*watcher, *node, *node) {
	f := quietFS(CacheAuto)
	pol := &fsPolicy{fsid: testFsid}
	pol.setClass(client.CacheWatch, "", nil)
	dir := &node{fsys: f, pol: pol, id: inodeID{1, 2}, hkey: handleKey(testFsid, 1, []byte("dir"))}
	file := &node{fsys: f, pol: pol, id: inodeID{1, 3}, hkey: handleKey(testFsid, 1, []byte("file"))}
	f.handles[dir.hkey], f.handles[file.hkey] = dir, file
	f.pols[1] = pol
	w := &watcher{fsys: f, self: 100, target: true, kick: make(chan struct{}, 1), done: make(chan struct{})}
	f.watch = w
	w.pend.init()
	return w, dir, file
}

// TestCollectRoutesEvents: what each kind of event becomes.
func TestCollectRoutesEvents(t *testing.T) {
	w, dir, file := watchFixture()
	w.collect(&fevent{mask: unix.FAN_MODIFY, pid: 100, dir: dir.hkey, obj: file.hkey, name: "f"})
	if !w.pend.empty() || w.own.Load() != 1 {
		t.Errorf("the daemon's own change made invalidations: %+v", w.pend)
	}
	w.collect(&fevent{mask: unix.FAN_CREATE, pid: 7, dir: "elsewhere", name: "x"})
	if !w.pend.empty() || w.outside.Load() != 1 {
		t.Errorf("an event outside the tree made invalidations")
	}
	gen := dir.gen.Load()
	w.collect(&fevent{mask: unix.FAN_DELETE, pid: 7, dir: dir.hkey, obj: file.hkey, name: "f"})
	if gone, ok := w.pend.entries[entryKey{dir.id, "f"}]; !ok || gone != file.id || dir.gen.Load() == gen {
		t.Errorf("delete: entries %v, gen %d -> %d", w.pend.entries, gen, dir.gen.Load())
	}
	if w.pend.inodes[dir.id] != invalData || w.pend.inodes[file.id] != invalAttr {
		t.Errorf("delete: inodes %v (the listing and the unlinked inode's nlink)", w.pend.inodes)
	}
	w.pend.init()
	w.collect(&fevent{mask: unix.FAN_MODIFY, pid: 7, dir: dir.hkey, obj: file.hkey, name: "f"})
	w.collect(&fevent{mask: unix.FAN_ATTRIB | unix.FAN_ONDIR, pid: 7, dir: dir.hkey, name: "."})
	if w.pend.inodes[file.id] != invalData || w.pend.inodes[dir.id] != invalAttr || len(w.pend.entries) != 0 {
		t.Errorf("modify and a directory's own attrib: %v %v", w.pend.inodes, w.pend.entries)
	}
	w.pend.init()
	file.writers = map[int32]int{55: 1}
	w.collect(&fevent{mask: unix.FAN_MODIFY, pid: 55, dir: dir.hkey, obj: file.hkey, name: "f"})
	file.dropWriter(55)
	w.collect(&fevent{mask: unix.FAN_CLOSE_WRITE, pid: 55, dir: dir.hkey, obj: file.hkey, name: "f"})
	if !w.pend.empty() {
		t.Errorf("a passthrough write through the mount, or its close, made invalidations: %v", w.pend.inodes)
	}
	w.collect(&fevent{mask: unix.FAN_MODIFY, pid: 55, dir: dir.hkey, obj: file.hkey, name: "f"})
	if w.pend.inodes[file.id] != invalData {
		t.Errorf("a write by the same process after it closed the file through the mount: %v", w.pend.inodes)
	}
	w.collect(&fevent{mask: unix.FAN_Q_OVERFLOW})
	if w.pend.all == "" || w.overflows.Load() != 1 {
		t.Errorf("overflow: all %q", w.pend.all)
	}
}

// TestMalformedEventMidBatch: a malformed event in the middle of a batch
// does not lose the events after it: they are collected, and since what
// the skipped one was about is unknown, everything is invalidated too.
func TestMalformedEventMidBatch(t *testing.T) {
	w, dir, _ := watchFixture()
	dirH := []byte("dir")
	w.consume(malformedBatch(dirH))
	for _, name := range []string{"a", "c"} {
		if _, ok := w.pend.entries[entryKey{dir.id, name}]; !ok {
			t.Errorf("the event about %s was lost: %v", name, w.pend.entries)
		}
	}
	if w.pend.all == "" || w.malformed.Load() != 1 {
		t.Errorf("a skipped event did not invalidate everything: all %q, malformed %d", w.pend.all, w.malformed.Load())
	}
	if w.failed.Load() != nil {
		t.Errorf("a malformed event failed the watcher")
	}
}

// faultySource is an event source whose reads fail.
type faultySource struct{ err error }

func (s faultySource) Read([]byte) (int, error) { return 0, s.err }
func (s faultySource) Close() error             { return nil }

// TestReadErrorFallsBack: when reading events fails, the watched file
// systems fall back to revalidation (short timeouts, no negative
// entries), everything is to be invalidated once, and the cache report
// says watch=failed with the reason; a file system met afterwards is not
// marked.
func TestReadErrorFallsBack(t *testing.T) {
	w, dir, _ := watchFixture()
	w.src = faultySource{unix.EIO}
	w.stopped.Add(1)
	w.read() // returns once the read fails
	cp := dir.pol.now()
	if cp.class != client.CacheRevalidate || cp.entry != RevalidateTimeout || cp.negative != 0 || cp.exact || !strings.Contains(cp.why, "fanotify failed") {
		t.Errorf("after a read error: %+v", cp)
	}
	if w.pend.all == "" || w.active() {
		t.Errorf("after a read error: all %q, active %v", w.pend.all, w.active())
	}
	keys := map[string]string{}
	cacheKeys(func(k string, v any) { keys[k] = fmt.Sprint(v) }, w.fsys.cacheInfo(dir.pol))
	if keys["watch"] != "failed" || !strings.Contains(keys["watch_why"], "read: ") || keys["cache"] != "revalidate" || keys["entry_timeout"] != "1" {
		t.Errorf("user.phx.info after a read error: %v", keys)
	}
	if why := w.mark(-1, &fsPolicy{fsid: testFsid, fsType: "tmpfs"}); !strings.Contains(why, "fanotify failed") {
		t.Errorf("a file system met after the failure: %q", why)
	}
}

// TestLookupRepliedAfterInvalidateAll: a LOOKUP reply keeps its timeouts
// only when no invalidation of everything ran since the lookup began (it
// may have gathered the names before this answer joined them).
func TestLookupRepliedAfterInvalidateAll(t *testing.T) {
	f := quietFS(CacheAuto)
	reply := func(bump bool) *fuse.EntryOut {
		out := &fuse.EntryOut{}
		out.SetEntryTimeout(time.Hour)
		out.SetAttrTimeout(time.Hour)
		epoch := f.lookupEpoch()
		if bump {
			f.allEpoch.Add(1) // what invalidateAll does first
		}
		f.lookupReplied(epoch, "x", out)
		return out
	}
	if out := reply(false); out.EntryTimeout() != time.Hour || out.AttrTimeout() != time.Hour {
		t.Errorf("a quiet lookup lost its timeouts: %v %v", out.EntryTimeout(), out.AttrTimeout())
	}
	if out := reply(true); out.EntryTimeout() != 0 || out.AttrTimeout() != 0 {
		t.Errorf("a lookup racing an invalidation of everything kept %v %v", out.EntryTimeout(), out.AttrTimeout())
	}
}

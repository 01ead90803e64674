package fusefs

import (
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Applying what the watcher collected: one goroutine sends the FUSE
// notifications (never while holding a lock a FUSE request may wait on),
// at most once per coalescing interval, so that a burst of events about
// one inode costs one notification.
//
// How a notification meets a reply the kernel is still waiting for: every
// reply that tells the kernel of a name (LOOKUP, READDIRPLUS, CREATE,
// MKDIR, MKNOD, SYMLINK, LINK) is awaited with the directory's inode lock
// held, and an entry invalidation takes that lock, so it waits in the
// kernel until the reply is in, then drops what the reply brought
// (measured on Linux 6.18: NotifyEntry returned after the 300 ms a test
// held the LOOKUP reply back). An entry invalidation that finds nothing
// (ENOENT) therefore means the kernel caches nothing under that name. An
// inode invalidation takes no such lock: it waits while the overlay is
// still building a reply that names the inode (node.handedOut), and when
// the kernel does not know an inode the overlay has handed to it
// (node.lookups > 0: that reply is still on its way), it invalidates the
// name the inode was handed out under (which waits for the reply, as
// above) and is sent again.

// coalesce is the least time between two rounds of notifications: the
// bound a storm of events adds to how late a change shows.
const coalesce = time.Millisecond

// What an inode's pending invalidation drops.
const (
	invalAttr uint8 = 1 << iota // attributes (and ACLs) only
	invalData                   // attributes and cached pages (file data, a directory's listing)
)

// pending is the invalidations collected since the last round, by inode
// (dev, ino): the node that names an inode to the kernel may be replaced
// by a new one (the kernel forgot the inode and looked it up again)
// before the round, which then notifies the node the kernel knows now.
type pending struct {
	// all: why everything is to be invalidated ("" when not): the queue
	// overflowed, events could not be decoded, or the watcher failed.
	all     string
	entries map[entryKey]inodeID // -> the inode the event removed (zero: not known)
	inodes  map[inodeID]uint8
}

// entryKey is a name in a directory.
type entryKey struct {
	dir  inodeID
	name string
}

func (p *pending) init() {
	p.all = ""
	p.entries = make(map[entryKey]inodeID)
	p.inodes = make(map[inodeID]uint8)
}

// entry drops a name; gone, when known, is the inode the event removed.
func (p *pending) entry(dir inodeID, name string, gone inodeID) {
	k := entryKey{dir, name}
	if _, ok := p.entries[k]; !ok || gone != (inodeID{}) {
		p.entries[k] = gone
	}
}

func (p *pending) inode(id inodeID, what uint8) { p.inodes[id] |= what }

// everything asks for an invalidation of everything, saying why.
func (p *pending) everything(why string) {
	if p.all == "" {
		p.all = why
	}
}

func (p *pending) empty() bool { return p.all == "" && len(p.entries) == 0 && len(p.inodes) == 0 }

// merge adds o's invalidations to p.
func (p *pending) merge(o *pending) {
	p.everything(o.all)
	for k, gone := range o.entries {
		p.entry(k.dir, k.name, gone)
	}
	for id, what := range o.inodes {
		p.inode(id, what)
	}
}

// flush applies the pending invalidations as they come.
func (w *watcher) flush() {
	defer w.stopped.Done()
	pause := time.NewTimer(0)
	defer pause.Stop()
	for {
		select {
		case <-w.kick:
		case <-w.done:
			return
		}
		w.mu.Lock()
		p := w.pend
		w.pend.init()
		w.mu.Unlock()
		if p.empty() {
			continue
		}
		w.flushes.Add(1)
		if p.all != "" {
			w.invalidateAll(p.all)
		} else if again := w.apply(&p); !again.empty() {
			w.mu.Lock()
			w.pend.merge(&again)
			w.mu.Unlock()
			w.signal()
		}
		pause.Reset(coalesce)
		select {
		case <-pause.C:
		case <-w.done:
			return
		}
	}
}

// apply sends one round: names first (the kernel looks them up again),
// then inodes. It returns the inode invalidations that wait for a reply
// the overlay is still building, for the next round.
func (w *watcher) apply(p *pending) (again pending) {
	again.init()
	f := w.fsys
	var sent uint64
	for k, goneID := range p.entries {
		dir, _ := f.nodeByID(k.dir)
		if dir == nil {
			continue // the kernel knows nothing under it
		}
		dir.gen.Add(1)
		gone, _ := f.nodeByID(goneID)
		var e syscall.Errno = unix.ENOENT
		if gone != nil {
			// The very inode the event removed: the kernel drops the
			// entry only if it still names it, and marks it unlinked.
			e = dir.NotifyDelete(k.name, gone.EmbeddedInode())
			sent++
		}
		if e != 0 {
			// Not cached as that inode (or not known): whatever the
			// name holds, it goes.
			dir.NotifyEntry(k.name)
			sent++
		}
	}
	for id, what := range p.inodes {
		n, inFlight := f.nodeByID(id)
		switch {
		case n == nil:
			continue // forgotten: the kernel caches nothing of it
		case inFlight:
			// A reply naming it is being built: the kernel may learn of
			// it with attributes from before the change, and a
			// notification now would find nothing. After that reply.
			again.inode(id, what)
			continue
		}
		sent += w.invalidateInode(n, what)
	}
	w.invals.Add(sent)
	return again
}

// invalidateInode drops what the kernel caches of n (what: invalAttr or
// invalData), waiting for a reply that hands n to the kernel and is still
// on its way. It returns the notifications sent.
func (w *watcher) invalidateInode(n *node, what uint8) uint64 {
	off := int64(-1) // attributes only
	if what&invalData != 0 {
		off = 0
	}
	if n.NotifyContent(off, 0) != unix.ENOENT || !w.fsys.handedToKernel(n) {
		return 1
	}
	// The kernel does not know n yet, though a reply gave it n: the reply
	// is still being written. Dropping the name it came under waits for
	// that reply (the directory's lock); the inode exists then, unless
	// the kernel dropped it with the name.
	name, parent := n.Parent()
	if parent == nil {
		return 1
	}
	parent.NotifyEntry(name)
	n.NotifyContent(off, 0)
	return 3
}

// handedToKernel says whether a reply has given the kernel n (a lookup it
// has not forgotten).
func (f *FS) handedToKernel(n *node) bool {
	f.nodesMu.Lock()
	defer f.nodesMu.Unlock()
	return n.lookups > 0
}

// nodeByID is the node the overlay holds for an inode now (nil when
// none), and whether a reply naming it is being built.
func (f *FS) nodeByID(id inodeID) (n *node, inFlight bool) {
	if id == (inodeID{}) {
		return nil, false
	}
	f.nodesMu.Lock()
	defer f.nodesMu.Unlock()
	if id == f.root.id {
		return f.root, false
	}
	n = f.nodes[id]
	return n, n != nil && n.handedOut > 0
}

// invalidateAll drops everything the kernel caches about the mount: every
// name it knows (positive entries from the overlay's tree, negative ones
// remembered), every inode's attributes and pages. After a queue overflow
// (or an event lost otherwise) there is no telling what changed.
//
// A LOOKUP or READDIRPLUS whose answer is not yet in the overlay's tree
// when the names are gathered is caught by the epoch: bumped first, it
// makes such a reply drop its own answer (lookupReplied, listingReplied).
func (w *watcher) invalidateAll(why string) {
	f := w.fsys
	f.allEpoch.Add(1)
	nodes := f.liveNodes()
	for _, n := range nodes {
		n.gen.Add(1)
	}
	var sent uint64
	for _, n := range nodes {
		for name := range n.Children() {
			n.NotifyEntry(name)
			sent++
		}
	}
	for _, k := range f.negs.drain() {
		f.server.EntryNotify(k.parent, k.name)
		sent++
	}
	for _, n := range nodes {
		n.NotifyContent(0, 0)
		sent++
	}
	w.invals.Add(sent)
	f.log.Warnf("fanotify: %s: invalidated all %d inodes the kernel knows", why, len(nodes))
}

// lookupEpoch is the epoch a LOOKUP or READDIRPLUS starts in.
func (f *FS) lookupEpoch() uint64 { return f.allEpoch.Load() }

// lookupReplied lets a LOOKUP reply keep its timeouts only when nothing
// invalidated everything since the lookup began (epoch): a later
// invalidation may have gathered the names before this answer joined
// them.
func (f *FS) lookupReplied(epoch uint64, name string, out *fuse.EntryOut) {
	if f.allEpoch.Load() != epoch {
		out.SetEntryTimeout(0)
		out.SetAttrTimeout(0)
	}
	if hook := lookupRepliedHook.Load(); hook != nil {
		(*hook)(name)
	}
}

// lookupRepliedHook, when set (tests), runs as the reply to a LOOKUP of a
// name leaves the overlay: holding it back holds the reply back.
var lookupRepliedHook atomic.Pointer[func(name string)]

// listingReplied queues, when everything was invalidated since a
// READDIRPLUS of directory dir began, the names the listing holds now: the
// entry invalidations wait in the kernel until the listing's reply is in.
func (f *FS) listingReplied(epoch, dir uint64) {
	w := f.watch
	if f.allEpoch.Load() == epoch || w == nil {
		return
	}
	d := f.root
	if dir != fuse.FUSE_ROOT_ID {
		f.nodesMu.Lock()
		d = f.byID[dir]
		f.nodesMu.Unlock()
	}
	if d == nil {
		return
	}
	w.mu.Lock()
	for name := range d.Children() {
		w.pend.entry(d.id, name, inodeID{})
	}
	w.mu.Unlock()
	w.signal()
}

// liveNodes is every node the overlay holds, the root first.
func (f *FS) liveNodes() []*node {
	f.nodesMu.Lock()
	defer f.nodesMu.Unlock()
	out := make([]*node, 0, len(f.nodes)+1)
	out = append(out, f.root)
	for _, n := range f.nodes {
		out = append(out, n)
	}
	return out
}

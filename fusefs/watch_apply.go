package fusefs

import (
	"maps"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Applying what the watcher collected: one goroutine sends the FUSE
// notifications (never while holding a lock a FUSE request may wait on),
// at most once per coalescing interval, so that a burst of events about
// one inode costs one notification.

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
	all     bool                 // the queue overflowed (or reading failed): everything
	entries map[entryKey]inodeID // -> the inode the event removed (zero: not known)
	inodes  map[inodeID]uint8
	// tries counts the rounds an invalidation was sent in and found
	// nothing (ENOENT): a reply that tells the kernel of the inode or
	// name may be on its way, so it is sent again, up to maxTries.
	tries map[any]int
}

const maxTries = 3

// entryKey is a name in a directory.
type entryKey struct {
	dir  inodeID
	name string
}

func (p *pending) init() {
	p.entries = make(map[entryKey]inodeID)
	p.inodes = make(map[inodeID]uint8)
	p.tries = make(map[any]int)
}

// entry drops a name; gone, when known, is the inode the event removed.
func (p *pending) entry(dir inodeID, name string, gone inodeID) {
	k := entryKey{dir, name}
	if _, ok := p.entries[k]; !ok || gone != (inodeID{}) {
		p.entries[k] = gone
	}
}

func (p *pending) inode(id inodeID, what uint8) { p.inodes[id] |= what }

func (p *pending) empty() bool { return !p.all && len(p.entries) == 0 && len(p.inodes) == 0 }

// again queues into p what round r sent in vain, for the next round.
func (p *pending) again(r *pending, k any, send func()) {
	if n := r.tries[k] + 1; n < maxTries {
		p.tries[k] = n
		send()
	}
}

// merge adds o's invalidations to p.
func (p *pending) merge(o *pending) {
	for k, gone := range o.entries {
		p.entry(k.dir, k.name, gone)
	}
	for id, what := range o.inodes {
		p.inode(id, what)
	}
	maps.Copy(p.tries, o.tries)
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
		w.pend.all = false
		w.mu.Unlock()
		if p.empty() {
			continue
		}
		w.flushes.Add(1)
		if p.all {
			w.invalidateAll()
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
// then inodes. It returns what found nothing, to be sent again.
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
		var e syscall.Errno
		if gone != nil {
			// The very inode the event removed: the kernel drops the
			// entry only if it still names it, and marks it unlinked.
			e = dir.NotifyDelete(k.name, gone.EmbeddedInode())
		}
		if gone == nil || (e != 0 && e != unix.ENOENT) {
			e = dir.NotifyEntry(k.name)
		}
		sent++
		if e == unix.ENOENT {
			again.again(p, k, func() { again.entry(k.dir, k.name, goneID) })
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
			again.tries[id] = p.tries[id]
			continue
		}
		off := int64(-1) // attributes only
		if what&invalData != 0 {
			off = 0
		}
		sent++
		if n.NotifyContent(off, 0) == unix.ENOENT {
			again.again(p, id, func() { again.inode(id, what) })
		}
	}
	w.invals.Add(sent)
	return again
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
// there is no telling what changed.
func (w *watcher) invalidateAll() {
	f := w.fsys
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
	f.log.Warnf("fanotify: the event queue overflowed: invalidated all %d inodes the kernel knows", len(nodes))
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

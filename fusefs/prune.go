package fusefs

import (
	"cmp"
	"slices"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
)

// Every node holds a descriptor (doc.go), and the kernel keeps the inodes
// of a walk in its cache as long as memory allows: a walk of a dataset of
// a million files would take the daemon to RLIMIT_NOFILE (fs.nr_open,
// 1,048,576 by default), and from there every LOOKUP, by any user, failed
// with EMFILE. So the overlay keeps its nodes under half of its
// descriptors: past that, the pruner asks the kernel to forget the nodes
// looked up longest ago (FUSE_NOTIFY_PRUNE, Linux 6.17; before it, an
// invalidation of each one's name), down to three eighths. The kernel
// drops those it does not use (a file open, a working directory, a mount
// point stay) and sends their FORGETs, which close the descriptors. A
// pruned name costs the next access a LOOKUP, as after memory pressure.

// pruneEvery is how often the pruner checks the limit without being asked:
// RLIMIT_NOFILE may change while the daemon runs (prlimit).
const pruneEvery = time.Second

// pruneGap is how long the pruner waits after a run that the kernel did
// not follow (no node forgotten since, checked every pruneGap/10): a
// run sorts every node, so a kernel that cannot drop what it is asked to
// (files held open) must not make the pruner run at every new node. After
// a run the kernel followed, the next may come at once: a fast walk adds
// nodes faster than one run a gap would take them.
const pruneGap = 50 * time.Millisecond

// pruneBatch is how many node ids one notification carries.
const pruneBatch = 512

// nodeRoom is how many nodes the overlay keeps before it prunes: half of
// the daemon's RLIMIT_NOFILE (the rest is for opened files, registered
// buffers, the watcher and the runtime). A variable: tests stand in for it.
var nodeRoom = func() int { return shareOfNoFile(2, 64) }

// notifyPrune asks the kernel to forget nodes (FUSE_NOTIFY_PRUNE; ENOSYS
// where the kernel has none). A variable: tests take the fall-back.
var notifyPrune = func(root *fs.Inode, nodes []*fs.Inode) syscall.Errno { return root.NotifyPrune(nodes) }

// startPruner runs the pruner until the FS is unmounted (done closes);
// Wait waits for it to end.
func (f *FS) startPruner(done <-chan struct{}) {
	f.pruneAt.Store(int64(nodeRoom()))
	f.pruneWake = make(chan struct{}, 1)
	f.prunerDone = make(chan struct{})
	go func() {
		defer close(f.prunerDone)
		t := time.NewTicker(pruneEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-f.pruneWake:
			case <-t.C:
			}
			room := nodeRoom()
			f.pruneAt.Store(int64(room))
			seen := f.dropped.Load()
			if f.prune(room, room*3/4) > 0 {
				f.pruneWait(done, seen)
			}
		}
	}()
}

// wantPrune wakes the pruner (without waiting for it: a request handler
// must never wait for a notification, which may wait for the directory
// lock that request's caller holds).
func (f *FS) wantPrune() {
	select {
	case f.pruneWake <- struct{}{}:
	default:
	}
}

// awaitDropped wakes the pruner and waits up to d for a node to be
// dropped (its descriptor closed): a lookup that ran out of descriptors
// (the limit fell below the nodes, prlimit, or a walk outran the
// pruner). It reports whether one was.
func (f *FS) awaitDropped(d time.Duration) bool {
	seen := f.dropped.Load()
	f.wantPrune()
	return f.droppedSince(seen, d, time.Millisecond, nil)
}

// countNode notes a new node; the caller holds nodesMu.
func (f *FS) countNode() {
	if f.pruneWake != nil && int64(len(f.nodes)) > f.pruneAt.Load() {
		f.wantPrune()
	}
}

// pruneWait returns once the kernel followed the last run (a node was
// forgotten since: dropped moved past seen), or after pruneGap.
func (f *FS) pruneWait(done <-chan struct{}, seen int64) {
	f.droppedSince(seen, pruneGap, pruneGap/10, done)
}

// droppedSince waits until a node is dropped after the count seen (its
// descriptor closed), looking every step, for at most d or until done
// closes; it reports whether one was.
func (f *FS) droppedSince(seen int64, d, step time.Duration, done <-chan struct{}) bool {
	deadline := time.After(d)
	tick := time.NewTicker(step)
	defer tick.Stop()
	for f.dropped.Load() == seen {
		select {
		case <-done:
			return false
		case <-deadline:
			return false
		case <-tick.C:
		}
	}
	return true
}

// prune asks the kernel to forget the nodes looked up longest ago, when
// there are more than room, until target are left; it returns how many
// nodes it found (0: it asked nothing).
func (f *FS) prune(room, target int) int {
	f.nodesMu.Lock()
	if len(f.nodes) <= room {
		f.nodesMu.Unlock()
		return 0
	}
	type aged struct {
		used uint64
		n    *node
	}
	cands := make([]aged, 0, len(f.nodes))
	for _, n := range f.nodes {
		if n != f.root && n.lookups > 0 && n.nodeid != 0 {
			cands = append(cands, aged{n.used, n})
		}
	}
	had := len(f.nodes)
	f.nodesMu.Unlock()
	slices.SortFunc(cands, func(a, b aged) int { return cmp.Compare(a.used, b.used) })
	cands = cands[:min(had-target, len(cands))]
	f.prunes.Add(1)
	asked, how := len(cands), "FUSE_NOTIFY_PRUNE"
	inodes := make([]*fs.Inode, 0, pruneBatch)
	for len(cands) > 0 {
		k := min(pruneBatch, len(cands))
		inodes = inodes[:0]
		for _, c := range cands[:k] {
			inodes = append(inodes, c.n.EmbeddedInode())
		}
		if notifyPrune(f.root.EmbeddedInode(), inodes) == syscall.ENOSYS {
			how = "by name: this kernel has no FUSE_NOTIFY_PRUNE"
			for _, in := range inodes {
				if name, parent := in.Parent(); parent != nil {
					parent.NotifyEntry(name)
				}
			}
		}
		cands = cands[k:]
	}
	f.log.Debugf("%d nodes, room for %d: asked the kernel to forget the %d looked up longest ago (%s)", had, room, asked, how)
	return had
}

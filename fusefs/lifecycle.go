package fusefs

import (
	"context"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// A node's life, and why its descriptor is never used after close.
//
// The kernel holds a lookup count on every node it knows: each reply that
// names the node (LOOKUP, CREATE, MKDIR, MKNOD, SYMLINK, LINK, each entry
// of READDIRPLUS) adds one, and FORGET takes them back. go-fuse keeps the
// same count and calls OnForget when it believes the node unreferenced,
// but that call races a lookup of the same inode: the node operation that
// returns a known node runs before go-fuse registers the reply, and
// go-fuse calls OnForget without locks after its decision, so a lookup may
// revive the node in between, or complete entirely. Closing the descriptor
// then leaves a live node whose descriptor number the daemon's next open
// reuses: a name resolving to another file, judged by another file's
// permissions.
//
// So the overlay counts for itself, under FS.nodesMu:
//   - child() marks each node it returns with the request that returns it
//     (node.handedOut, FS.handouts);
//   - rawFS settles the marks once go-fuse has built the reply: each one
//     that reached the reply (its EntryOut has the node's id) adds a kernel
//     lookup (node.lookups) and records the node under its id (FS.byID);
//   - rawFS.Forget takes the kernel's lookups back before go-fuse sees them.
// OnForget closes nothing while the node has kernel lookups or unsettled
// hand-outs: a reply has revived it, or will, and the kernel will forget
// it again; if that reply fails instead, its settle closes the node
// (go-fuse will not call OnForget again). Otherwise it removes the node
// from both tables and closes its descriptors in the same step, so a node
// found in FS.nodes always has an open descriptor and a forgotten node is
// never handed out again.
//
// Nodes are keyed by (st_dev, st_ino) and the device is their StableAttr
// generation, so go-fuse's own table matches a node only to the inode it
// was made for. A node's O_PATH descriptor keeps its inode allocated, so
// the number cannot be reused by another file while the node lives.

// inodeID names a backing inode.
type inodeID struct{ dev, ino uint64 }

// handout is a node a reply being built names, and its entry in the reply.
type handout struct {
	n   *node
	out *fuse.EntryOut
}

// requestKey identifies the FUSE request a node operation serves: go-fuse
// gives every request in flight its own cancel channel, and passes it in
// the context of the node operations it runs for that request.
func requestKey(ctx context.Context) <-chan struct{} {
	if c, ok := ctx.(*fuse.Context); ok {
		return c.Cancel
	}
	return nil
}

// child returns the node for the backing inode fd (an O_PATH descriptor
// the caller owns) refers to: the live node of that inode, closing fd, or
// a new node owning fd. The node is handed out to the request until rawFS
// settles it.
func (n *node) child(ctx context.Context, fd int, st *unix.Stat_t, out *fuse.EntryOut) *fs.Inode {
	f := n.fsys
	id := inodeID{dev: st.Dev, ino: st.Ino}
	attrFromStat(&out.Attr, st)
	out.Attr.Ino = f.inoKey(st)
	pol := n.pol
	if st.Dev != pol.dev {
		pol = f.policyOf(fd, st.Dev) // a file system mounted below the backing root
	}
	// The name is the directory's (its file system's events cover it),
	// the attributes the child's.
	out.SetEntryTimeout(n.pol.now().entry)
	out.SetAttrTimeout(pol.now().attr)

	f.nodesMu.Lock()
	defer f.nodesMu.Unlock()
	ch := f.nodes[id]
	if ch != nil {
		unix.Close(fd)
	} else {
		ch = &node{fsys: f, fd: fd, id: id, pol: pol}
		f.nodes[id] = ch
		n.NewInode(ctx, ch, fs.StableAttr{Mode: st.Mode & unix.S_IFMT, Ino: out.Attr.Ino, Gen: st.Dev})
		// Published to the watcher only once its inode is made: an event
		// found it by handle and read its children while NewInode was
		// still initializing them (a data race under -race).
		f.indexHandle(ch)
		f.countNode()
	}
	f.tick++
	ch.used = f.tick
	f.handOut(ctx, ch, out)
	return ch.EmbeddedInode()
}

// handOut marks n as named by the reply of the request ctx serves, in out.
// The caller holds f.nodesMu.
func (f *FS) handOut(ctx context.Context, n *node, out *fuse.EntryOut) {
	key := requestKey(ctx)
	if key == nil {
		return // not from the kernel (a test calling a node directly)
	}
	n.handedOut++
	f.handouts[key] = append(f.handouts[key], handout{n, out})
}

// settle ends the hand-outs of a request whose reply go-fuse has built:
// each that made it into the reply is a kernel lookup of its node. A node
// that a failed reply named, and that go-fuse therefore did not register
// (its entry has no node id), is closed when nothing else holds it: no
// kernel lookup, no other hand-out, and go-fuse will not call OnForget for
// it (it already did, and OnForget deferred to this reply, or no reply
// ever named the node).
func (f *FS) settle(key <-chan struct{}, st fuse.Status) {
	f.nodesMu.Lock()
	var orphans []*node
	for _, h := range f.handouts[key] {
		n := h.n
		n.handedOut--
		switch {
		case st.Ok() && h.out.NodeId != 0:
			n.lookups++
			n.nodeid = h.out.NodeId
			n.forgetDeferred = false
			f.byID[h.out.NodeId] = n
		case h.out.NodeId == 0 && n.handedOut == 0 && n.lookups == 0 && (n.forgetDeferred || n.nodeid == 0):
			if f.dropNode(n) {
				orphans = append(orphans, n)
			}
		}
	}
	delete(f.handouts, key)
	f.nodesMu.Unlock()
	for _, n := range orphans {
		n.closeFds()
	}
}

// forgotten takes back nlookup kernel lookups of the node with that id.
func (f *FS) forgotten(nodeid, nlookup uint64) {
	f.nodesMu.Lock()
	defer f.nodesMu.Unlock()
	if n := f.byID[nodeid]; n != nil {
		n.lookups -= int64(nlookup)
	}
}

// OnForget closes the node's descriptors once the kernel holds no lookup
// of it and no reply being built names it. While a reply does, it defers
// to that reply's settle, which closes the node if the reply fails.
func (n *node) OnForget() {
	f := n.fsys
	f.nodesMu.Lock()
	if n == f.root { // the unmount: the root is in no table but the handles'
		f.unindexHandle(n)
		f.nodesMu.Unlock()
		n.closeFds()
		return
	}
	if n.lookups == 0 && n.handedOut > 0 {
		n.forgetDeferred = true
	}
	if n.lookups > 0 || n.handedOut > 0 || !f.dropNode(n) {
		// Revived (or about to be) since go-fuse decided, or already closed.
		f.nodesMu.Unlock()
		return
	}
	f.nodesMu.Unlock()
	n.closeFds()
}

// dropNode removes n from the overlay's tables, so that no lookup finds it
// again, and reports whether it was there (false: already dropped). The
// caller holds f.nodesMu and then closes n's descriptors.
func (f *FS) dropNode(n *node) bool {
	if f.nodes[n.id] != n {
		return false
	}
	delete(f.nodes, n.id)
	f.dropped.Add(1)
	if f.byID[n.nodeid] == n {
		delete(f.byID, n.nodeid)
	}
	f.unindexHandle(n)
	return true
}

// closeFds closes a dropped node's descriptors: its lock descriptors and
// its O_PATH descriptor.
func (n *node) closeFds() {
	n.mu.Lock()
	for _, d := range n.lockFds {
		n.closeLockFd(d)
	}
	n.lockFds = nil
	n.mu.Unlock()
	unix.Close(n.fd)
}

// negativeEntry remembers a negative entry the kernel is told to keep,
// for a queue overflow to invalidate; when too many are remembered, the
// kernel is told not to keep it.
func (f *FS) negativeEntry(parent uint64, name string, out *fuse.EntryOut) {
	ttl := out.EntryTimeout()
	if ttl <= 0 || !f.watch.active() {
		return
	}
	if !f.negs.add(parent, name, ttl) {
		out.SetEntryTimeout(0)
	}
}

// The reply-building requests settle their hand-outs once go-fuse has
// registered what they return; FORGET takes lookups back first.

// settled settles a request's hand-outs and passes its status on.
func (r *rawFS) settled(cancel <-chan struct{}, st fuse.Status) fuse.Status {
	r.fsys.settle(cancel, st)
	return st
}

func (r *rawFS) Lookup(c <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	defer r.fsys.requests.done(opLookup, time.Now())
	epoch := r.fsys.lookupEpoch()
	st := r.RawFileSystem.Lookup(c, h, name, out)
	if st == fuse.ENOENT && out.EntryTimeout() > 0 {
		// The node asked the kernel to keep the name's absence: a reply
		// with node id 0 is a negative entry.
		out.NodeId = 0
		st = fuse.OK
		r.fsys.negativeEntry(h.NodeId, name, out)
	}
	st = r.settled(c, st)
	r.fsys.lookupReplied(epoch, name, out)
	return st
}

func (r *rawFS) Mkdir(c <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	return r.settled(c, r.RawFileSystem.Mkdir(c, in, name, out))
}

func (r *rawFS) Mknod(c <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	return r.settled(c, r.RawFileSystem.Mknod(c, in, name, out))
}

func (r *rawFS) Create(c <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	defer r.fsys.requests.done(opCreate, time.Now())
	defer givePassthroughWriterBack() // writeas.go
	return r.settled(c, r.RawFileSystem.Create(c, in, name, out))
}

func (r *rawFS) Symlink(c <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	return r.settled(c, r.RawFileSystem.Symlink(c, h, target, name, out))
}

func (r *rawFS) Link(c <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	return r.settled(c, r.RawFileSystem.Link(c, in, name, out))
}

func (r *rawFS) ReadDirPlus(c <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	defer r.fsys.listingReplied(r.fsys.lookupEpoch(), in.NodeId)
	return r.settled(c, r.RawFileSystem.ReadDirPlus(c, in, out))
}

func (r *rawFS) Forget(nodeid, nlookup uint64) {
	r.fsys.forgotten(nodeid, nlookup)
	r.RawFileSystem.Forget(nodeid, nlookup)
}

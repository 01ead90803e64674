package fusefs

import (
	"context"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// A node's life, and why its descriptor is never used after close.
//
// The kernel holds a lookup count on every node it knows; go-fuse calls
// OnForget when that count reaches zero. A reply that names a node (LOOKUP,
// CREATE, MKDIR, MKNOD, SYMLINK, READDIRPLUS) is built in two steps: the
// node operation returns an Inode, and only then does go-fuse register it
// and count the lookup. A lookup that picks an existing node between those
// steps can therefore race a FORGET: go-fuse calls OnForget, and the reply
// then revives the node. Closing the descriptor in that OnForget would leave
// a live node whose descriptor number the next open(2) of the daemon
// reuses: a name resolving to another file, judged by another file's
// permissions.
//
// go-fuse also calls OnForget without locks after it has decided the node
// is unreferenced, so a whole lookup may revive the node in between.
//
// So the overlay counts hand-outs. child() marks each node it returns with
// the request that returns it (node.handedOut, FS.handouts); rawFS settles
// the marks once go-fuse has registered the reply. OnForget, under
// FS.nodesMu, closes nothing while a hand-out is unsettled (the reply in
// flight will revive the node) or while go-fuse counts a kernel reference
// again (Inode.Forgotten is false: it was revived); the kernel will forget
// it again later. Otherwise OnForget removes the node from FS.nodes and
// closes its descriptors, so a node found in FS.nodes always has an open
// descriptor and a forgotten node is never handed out again.
//
// Nodes are keyed by (st_dev, st_ino) and the device is their StableAttr
// generation, so go-fuse's own table matches a node only to the inode it
// was made for. A node's O_PATH descriptor keeps its inode allocated, so
// the number cannot be reused by another file while the node lives.

// inodeID names a backing inode.
type inodeID struct{ dev, ino uint64 }

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
// a new node owning fd. The node is marked handed out to the request until
// rawFS settles it.
func (n *node) child(ctx context.Context, fd int, st *unix.Stat_t, out *fuse.EntryOut) *fs.Inode {
	f := n.fsys
	id := inodeID{dev: st.Dev, ino: st.Ino}
	attrFromStat(&out.Attr, st)
	out.Attr.Ino = f.inoKey(st)
	key := requestKey(ctx)

	f.nodesMu.Lock()
	defer f.nodesMu.Unlock()
	ch := f.nodes[id]
	if ch != nil {
		unix.Close(fd)
	} else {
		ch = &node{fsys: f, fd: fd, id: id}
		f.nodes[id] = ch
		n.NewInode(ctx, ch, fs.StableAttr{Mode: st.Mode & unix.S_IFMT, Ino: out.Attr.Ino, Gen: st.Dev})
	}
	if key != nil {
		ch.handedOut++
		f.handouts[key] = append(f.handouts[key], ch)
	}
	return ch.EmbeddedInode()
}

// settle drops the hand-out marks of a request whose reply go-fuse has
// registered (or failed).
func (f *FS) settle(key <-chan struct{}) {
	f.nodesMu.Lock()
	defer f.nodesMu.Unlock()
	for _, ch := range f.handouts[key] {
		ch.handedOut--
	}
	delete(f.handouts, key)
}

// OnForget closes the node's descriptors once the kernel has forgotten it
// and no reply in flight can revive it. go-fuse calls it without locks,
// after deciding the node is unreferenced, so a lookup may have revived
// the node in between: Forgotten, read under nodesMu (which every revival
// passes through, in child), tells.
func (n *node) OnForget() {
	f := n.fsys
	f.nodesMu.Lock()
	//lint:ignore SA1019 Forgotten is the only view of go-fuse's lookup count.
	if n.handedOut > 0 || !n.Forgotten() || (n != f.root && f.nodes[n.id] != n) {
		// A reply being built names it, or one revived it since go-fuse
		// decided to call OnForget, or it was already closed.
		f.nodesMu.Unlock()
		return
	}
	delete(f.nodes, n.id)
	f.nodesMu.Unlock()

	n.mu.Lock()
	for _, fd := range n.lockFds {
		unix.Close(fd)
	}
	n.lockFds = nil
	n.mu.Unlock()
	unix.Close(n.fd)
}

// The reply-building requests: settle their hand-outs once go-fuse has
// registered what they return.

func (r *rawFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	defer r.fsys.settle(cancel)
	return r.RawFileSystem.Lookup(cancel, h, name, out)
}

func (r *rawFS) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	defer r.fsys.settle(cancel)
	return r.RawFileSystem.Mkdir(cancel, in, name, out)
}

func (r *rawFS) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	defer r.fsys.settle(cancel)
	return r.RawFileSystem.Mknod(cancel, in, name, out)
}

func (r *rawFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	defer r.fsys.settle(cancel)
	return r.RawFileSystem.Create(cancel, in, name, out)
}

func (r *rawFS) Symlink(cancel <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	defer r.fsys.settle(cancel)
	return r.RawFileSystem.Symlink(cancel, h, target, name, out)
}

func (r *rawFS) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	defer r.fsys.settle(cancel)
	return r.RawFileSystem.ReadDirPlus(cancel, in, out)
}

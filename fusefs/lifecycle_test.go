package fusefs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// lifecycleFS is an overlay that is not mounted, with one node on a file
// of the backing directory, for driving the node lifecycle by hand.
func lifecycleFS(t *testing.T) (*FS, *node) {
	t.Helper()
	backing := t.TempDir()
	f, _, err := newFS(backing, "", Options{Cache: CacheOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(f.root.fd) })
	p := filepath.Join(backing, "file")
	if err := os.WriteFile(p, []byte("x"), 0644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	n := &node{fsys: f, fd: fd, id: inodeID{dev: st.Dev, ino: st.Ino}, pol: f.rootPol}
	f.nodes[n.id] = n
	return f, n
}

// pendingReply is a request in flight: its key and the entry its reply fills.
type pendingReply struct {
	ctx *fuse.Context
	out *fuse.EntryOut
}

func newRequest() pendingReply {
	return pendingReply{ctx: &fuse.Context{Cancel: make(chan struct{})}, out: &fuse.EntryOut{}}
}

// handOutTo marks n as named by r's reply, as child() does.
func handOutTo(f *FS, n *node, r pendingReply) {
	f.nodesMu.Lock()
	f.handOut(r.ctx, n, r.out)
	f.nodesMu.Unlock()
}

// nodeClosed says whether n is out of the tables and its descriptor closed
// (the number is free, or names another file now).
func nodeClosed(f *FS, n *node) bool {
	f.nodesMu.Lock()
	inTable := f.nodes[n.id] == n
	f.nodesMu.Unlock()
	var st unix.Stat_t
	err := unix.Fstat(n.fd, &st)
	open := err == nil && st.Dev == n.id.dev && st.Ino == n.id.ino
	return !inTable && !open
}

// TestForgetDeferredToAFailedReply: go-fuse calls OnForget while a reply
// being built names the node, so OnForget leaves it open; that reply then
// fails (go-fuse registered nothing). go-fuse will not call OnForget
// again, so the failed reply's settle closes the node.
func TestForgetDeferredToAFailedReply(t *testing.T) {
	f, n := lifecycleFS(t)
	n.lookups, n.nodeid = 1, 42 // the kernel knew it
	f.byID[42] = n
	r := newRequest()
	handOutTo(f, n, r)
	f.forgotten(42, 1) // FORGET: the kernel's last lookup
	n.OnForget()       // go-fuse decides; the hand-out holds it
	if nodeClosed(f, n) {
		t.Fatalf("OnForget closed a node that a reply being built names")
	}
	f.settle(r.ctx.Cancel, fuse.EIO) // the reply fails: no node id in it
	if !nodeClosed(f, n) {
		t.Fatalf("a node whose OnForget deferred to a reply that failed is still open (lookups %d, hand-outs %d)", n.lookups, n.handedOut)
	}
}

// TestForgetDeferredToASuccessfulReply: the same, with a reply that
// succeeds: the node lives on, with the reply's lookup.
func TestForgetDeferredToASuccessfulReply(t *testing.T) {
	f, n := lifecycleFS(t)
	n.lookups, n.nodeid = 1, 42
	f.byID[42] = n
	r := newRequest()
	handOutTo(f, n, r)
	f.forgotten(42, 1)
	n.OnForget()
	r.out.NodeId = 43
	f.settle(r.ctx.Cancel, fuse.OK)
	if nodeClosed(f, n) || n.lookups != 1 {
		t.Fatalf("after a successful reply revived it: closed %v, lookups %d", nodeClosed(f, n), n.lookups)
	}
	n.OnForget() // a reply went out: the kernel holds it; nothing closes
	if nodeClosed(f, n) {
		t.Fatalf("OnForget closed a node the kernel holds")
	}
}

// TestNeverNamedNodeOfAFailedReply: a new node whose only reply fails was
// never registered by go-fuse, which will never call OnForget for it: the
// settle closes it, unless another reply being built names it too.
func TestNeverNamedNodeOfAFailedReply(t *testing.T) {
	f, n := lifecycleFS(t)
	a, b := newRequest(), newRequest()
	handOutTo(f, n, a)
	handOutTo(f, n, b)
	f.settle(a.ctx.Cancel, fuse.EIO)
	if nodeClosed(f, n) {
		t.Fatalf("closed a node that another reply being built names")
	}
	f.settle(b.ctx.Cancel, fuse.ENOENT)
	if !nodeClosed(f, n) {
		t.Fatalf("a node no reply ever named is still open")
	}
}

package fusefs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// FS is a mounted overlay.
type FS struct {
	backing    string
	mountpoint string
	opts       Options
	ctl        Control
	log        *logrus.Entry
	server     *fuse.Server
	root       *node
	rootDev    uint64

	// nodes maps a backing inode to its live node, so that a second lookup
	// of a known inode reuses the node (and its descriptor); byID maps the
	// FUSE node ids the kernel knows to nodes; handouts lists, per request
	// in flight, the nodes its reply names (see lifecycle.go).
	nodesMu  sync.Mutex
	nodes    map[inodeID]*node
	byID     map[uint64]*node // by FUSE node id
	handouts map[<-chan struct{}][]handout
	// tick orders the lookups (node.used), for the pruner (prune.go);
	// guarded by nodesMu. pruneAt is the node count past which it runs,
	// pruneWake wakes it, prunes counts its runs.
	tick      uint64
	pruneAt   atomic.Int64
	pruneWake chan struct{}
	// prunerDone closes when the pruner ends, after the unmount.
	prunerDone chan struct{}
	prunes     atomic.Int64
	dropped    atomic.Int64 // nodes dropped from the tables (the pruner's progress)
	// waiters counts the requests waiting now for a lock or a lease
	// (wait.go: FS.waitWhile).
	waiters atomic.Int64
	// userHandles counts each user's open files and directories
	// (handles_user.go).
	userHandles userHandles

	// Caching (cache.go): a policy per backing file system, the fanotify
	// watcher (nil unless cache=auto), the watched inodes by file handle
	// and the negative entries the kernel keeps (handles.go).
	rootPol *fsPolicy
	polMu   sync.Mutex
	pols    map[uint64]*fsPolicy
	watch   *watcher
	hmu     sync.RWMutex
	handles map[string]*node
	negs    negatives
	// allEpoch counts the invalidations of everything (watch_apply.go).
	allEpoch atomic.Uint64
	mounts   *mountMonitor // mounts below the backing directory (mounts.go)

	nextFileID atomic.Uint64

	// flushOwners carries the lock owner of a FLUSH from the raw layer to
	// the file's Flush, keyed by the request's cancel channel; umasks the
	// umask of a CREATE, MKDIR or MKNOD to the node (umask.go).
	flushOwners sync.Map
	umasks      sync.Map

	requests requestTimer // requests.go

	ptMu     sync.Mutex
	ptWanted bool   // files are handed out as passthrough files
	ptActive bool   // and the kernel accepted a registration
	ptReason string // why passthrough is active or not
	ptWarned bool

	raKB int // readahead set on the mount (readahead.go)

	unmountOnce sync.Once
	unmountErr  error
}

// Mount mounts an overlay of the backing directory on mountpoint and
// serves it in the background. It sets the process umask to 0 and raises
// RLIMIT_NOFILE. Call Unmount (or unmount the mountpoint) and
// Wait to end it.
func Mount(backing, mountpoint string, o Options) (*FS, error) {
	f, st, err := newFS(backing, mountpoint, o)
	if err != nil {
		return nil, err
	}
	mo := f.mountOptions()
	fo := &fs.Options{
		MountOptions: mo,
		// Every reply carries its node's timeouts (fsPolicy), negative
		// entries too (rawFS.Lookup).
		NullPermissions: true,
		RootStableAttr:  &fs.StableAttr{Ino: st.Ino},
		Logger:          logAdapter(f.log),
	}
	raw := fs.NewNodeFS(f.root, fo)
	bridge := umaskBridge{RawFileSystem: raw, umasks: &f.umasks}
	server, err := fuse.NewServer(&rawFS{RawFileSystem: bridge, fsys: f}, mountpoint, &fo.MountOptions)
	if err != nil {
		f.watch.stop()
		unix.Close(f.root.fd)
		return nil, errs.Wrapf(err, "mount %s on %s", f.backing, mountpoint)
	}
	f.server = server
	go server.Serve()
	if err := server.WaitMount(); err != nil {
		_ = server.Unmount()
		f.watch.stop()
		return nil, errs.Wrapf(err, "mount %s on %s", f.backing, mountpoint)
	}
	f.watch.start()
	f.mounts = startMountMonitor(f)
	unmounted := make(chan struct{})
	f.startPruner(unmounted)
	go func() {
		server.Wait()
		close(unmounted)
		f.watch.stop()
		f.mounts.stop()
	}()
	f.tuneReadahead()
	f.probePassthrough()
	if o.Passthrough == PassthroughOn {
		if ok, why := f.PassthroughActive(); !ok {
			_ = f.Unmount()
			f.Wait()
			return nil, errs.New(unix.EOPNOTSUPP, "--passthrough on: passthrough unavailable: %s", why)
		}
	}
	return f, nil
}

// newFS opens the backing directory and makes the overlay around it.
func newFS(backing, mountpoint string, o Options) (*FS, *unix.Stat_t, error) {
	log := o.Log
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	abs, err := filepath.Abs(backing)
	if err != nil {
		return nil, nil, errs.New(unix.EINVAL, "backing directory %q", backing)
	}
	rootFd, err := unix.Open(abs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, errs.Wrapf(err, "backing directory %s", abs)
	}
	var st unix.Stat_t
	if err := unix.Fstat(rootFd, &st); err != nil {
		unix.Close(rootFd)
		return nil, nil, errs.Wrapf(err, "stat backing directory %s", abs)
	}
	RaiseNoFile(log)
	// The kernel applies the caller's umask before it sends a create; the
	// daemon's own must not mask the mode a second time.
	unix.Umask(0)

	f := &FS{
		backing:    abs,
		mountpoint: mountpoint,
		opts:       o,
		ctl:        o.Control,
		log:        log,
		rootDev:    st.Dev,
		nodes:      make(map[inodeID]*node),
		byID:       make(map[uint64]*node),
		handouts:   make(map[<-chan struct{}][]handout),
		pols:       make(map[uint64]*fsPolicy),
		handles:    make(map[string]*node),
		ptWanted:   o.Passthrough != PassthroughOff,
	}
	f.requests.observe, f.requests.log = o.ObserveRequest, log
	if o.Passthrough == PassthroughOff {
		f.ptReason = "disabled by --passthrough off"
	}
	if o.Cache == CacheAuto {
		f.watch = newWatcher(f)
	}
	f.root = &node{fsys: f, fd: rootFd, id: inodeID{dev: st.Dev, ino: st.Ino}}
	f.rootPol = f.newPolicy(rootFd, st.Dev)
	f.root.pol = f.rootPol
	f.pols[st.Dev] = f.rootPol
	f.logPolicy(f.rootPol)
	f.indexHandle(f.root)
	return f, &st, nil
}

// mountOptions are go-fuse's options for the overlay's Options.
func (f *FS) mountOptions() fuse.MountOptions {
	o := f.opts
	mo := fuse.MountOptions{
		AllowOther:    o.AllowOther,
		MaxWrite:      o.MaxWrite,
		MaxBackground: o.MaxBackground,
		FsName:        o.FsName,
		Name:          "phxmount",
		DirectMount:   true,
		EnableLocks:   true,
		Debug:         o.Debug,
		// Asynchronous direct I/O: lets the kernel keep several O_DIRECT
		// requests of one file in flight on the classic path.
		// READDIRPLUS_AUTO: the kernel asks for attributes with the names
		// only while it uses them (ls -l, find), not for a plain readdir.
		// DONT_MASK: a create carries the caller's mode and umask apart,
		// for the backing kernel to apply the umask or a default ACL
		// (umask.go).
		ExtraCapabilities: fuse.CAP_ASYNC_DIO | fuse.CAP_READDIRPLUS_AUTO | fuse.CAP_DONT_MASK,
		// POSIX_ACL (with default_permissions only: the kernel turns
		// default_permissions on with it): the kernel's permission checks
		// read the backing files' ACLs through GETXATTR, so a user an ACL
		// grants more than the mode bits is let through to the daemon,
		// and one it denies is stopped. The kernel keeps an inode's ACLs
		// with its attributes and drops them with them: when the attribute
		// timeout ends, when the watcher invalidates the inode
		// (watch_apply.go), and before it refuses (it re-reads both once).
		// It never keeps the root inode's (made before INIT): a caller who
		// does not own the backing root costs a GETXATTR per path walk
		// through it (docs/perf-notes.md section 9). What it lets through
		// is judged again by the backing kernel: opens and every change
		// run as the caller (ascaller.go).
		EnableAcl: !o.NoDefaultPermissions,
		// A symlink's target never changes (a new target is a new
		// inode): the kernel may keep it wherever it keeps names.
		EnableSymlinkCaching: o.Cache != CacheOff,
		Logger:               logAdapter(f.log),
	}
	if mo.MaxWrite == 0 {
		mo.MaxWrite = 1 << 20 // clamped by go-fuse to the kernel's limit
	}
	if mo.MaxBackground == 0 {
		mo.MaxBackground = 64
	}
	if mo.FsName == "" {
		mo.FsName = f.backing
	}
	if !o.NoDefaultPermissions {
		mo.Options = append(mo.Options, "default_permissions")
	}
	if o.ReadOnly {
		mo.Options = append(mo.Options, "ro")
	}
	mo.Options = append(mo.Options, o.ExtraMountOptions...)
	return mo
}

// Server is the go-fuse server (for tests and tools).
func (f *FS) Server() *fuse.Server { return f.server }

// Backing is the absolute path of the backing directory.
func (f *FS) Backing() string { return f.backing }

// Wait blocks until the file system is unmounted and its pruner ended.
func (f *FS) Wait() {
	f.server.Wait()
	if f.prunerDone != nil {
		<-f.prunerDone
	}
}

// Unmount unmounts the overlay (retrying while it is busy, then lazily).
// The control is told first that shutdown began (ShutdownNotifier).
func (f *FS) Unmount() error {
	f.unmountOnce.Do(func() {
		if sn, ok := f.ctl.(ShutdownNotifier); ok {
			sn.BeginShutdown()
		}
		var err error
		for i := 0; i < 5; i++ {
			if err = f.server.Unmount(); err == nil {
				break
			}
			if !strings.Contains(err.Error(), "busy") && errs.Errno(err) != unix.EBUSY {
				break
			}
		}
		if err != nil {
			if lerr := unix.Unmount(f.mountpoint, unix.MNT_DETACH); lerr == nil {
				err = nil
			}
		}
		f.unmountErr = err
	})
	return f.unmountErr
}

// PassthroughActive says whether opened files use kernel passthrough, and
// why (or why not), in words fit for a log line, doctor and user.phx.info.
func (f *FS) PassthroughActive() (bool, string) {
	f.ptMu.Lock()
	defer f.ptMu.Unlock()
	return f.ptWanted && f.ptActive, f.ptReason
}

func (f *FS) passthroughWanted() bool {
	f.ptMu.Lock()
	defer f.ptMu.Unlock()
	return f.ptWanted
}

// passthroughLost records that the kernel sent a READ or WRITE for a file
// that was handed out as passthrough: go-fuse failed to register its
// backing descriptor and switched passthrough off for the whole mount.
func (f *FS) passthroughLost(op, name string) {
	f.ptMu.Lock()
	defer f.ptMu.Unlock()
	if !f.ptActive || f.ptWarned {
		return
	}
	f.ptWarned = true
	f.ptActive = false
	f.ptWanted = false
	f.ptReason = fmt.Sprintf("lost: the kernel sent %s for %q, so registering its backing file failed and go-fuse disabled passthrough for the mount; classic path from now on", op, name)
	f.log.Warnf("passthrough: %s", f.ptReason)
}

// probePassthrough registers one backing descriptor with the kernel, the
// way go-fuse does at open, and unregisters it: when that fails, go-fuse
// would switch passthrough off silently at the first open.
func (f *FS) probePassthrough() {
	f.ptMu.Lock()
	defer f.ptMu.Unlock()
	if !f.ptWanted {
		return
	}
	why := ""
	if ks := f.server.KernelSettings(); ks == nil || ks.Flags64()&fuse.CAP_PASSTHROUGH == 0 {
		why = "the kernel does not offer FUSE passthrough (needs Linux >= 6.9)"
	} else {
		fd, what, err := f.probeFile()
		if err != nil {
			why = "no file to probe with: " + err.Error()
		} else {
			id, errno := f.server.RegisterBackingFd(&fuse.BackingMap{Fd: int32(fd)})
			unix.Close(fd)
			if errno != 0 {
				why = fmt.Sprintf("registering a backing file (%s) failed: %v", what, errno)
				switch errno {
				case syscall.EPERM:
					why += " (needs CAP_SYS_ADMIN)"
				case syscall.ELOOP:
					why += " (the backing directory is itself on a stacked file system)"
				}
			} else {
				f.server.UnregisterBackingFd(id)
			}
		}
	}
	if why != "" {
		f.ptWanted = false
		f.ptActive = false
		f.ptReason = why
		return
	}
	f.ptActive = true
	f.ptReason = "kernel FUSE passthrough: reads and writes of opened files bypass the daemon"
}

// probeFile opens a regular file of the backing file system: an unnamed
// O_TMPFILE in the backing root, or else an existing file at its top.
func (f *FS) probeFile() (int, string, error) {
	fd, err := unix.Openat(f.root.fd, ".", unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0600)
	if err == nil {
		return fd, "O_TMPFILE in the backing root", nil
	}
	d, err := os.Open(f.backing)
	if err != nil {
		return -1, "", err
	}
	defer d.Close()
	ents, _ := d.ReadDir(256)
	for _, e := range ents {
		if e.Type().IsRegular() {
			fd, err := unix.Openat(f.root.fd, e.Name(), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
			if err == nil {
				return fd, "an existing backing file", nil
			}
		}
	}
	mfd, err := unix.MemfdCreate("phxmount-probe", unix.MFD_CLOEXEC)
	if err != nil {
		return -1, "", err
	}
	return mfd, "a memfd (the backing root is read-only and has no file to probe with)", nil
}

// inoKey is the inode number reported for a backing stat: the backing
// st_ino on the backing root's device, a mix with the device elsewhere.
func (f *FS) inoKey(st *unix.Stat_t) uint64 {
	if st.Dev == f.rootDev {
		return st.Ino
	}
	h := st.Ino ^ (st.Dev * 0x9E3779B97F4A7C15)
	if h <= 1 {
		h += 2
	}
	return h
}

// RaiseNoFile lifts RLIMIT_NOFILE to fs.nr_open (root) or the hard limit:
// every inode the kernel caches holds a descriptor. Mount calls it; a
// daemon that gives up CAP_SYS_RESOURCE, which raising past the hard
// limit needs, calls it first.
func RaiseNoFile(log *logrus.Entry) {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) != nil {
		return
	}
	want := lim.Max
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		var n uint64
		if _, err := fmt.Sscan(string(b), &n); err == nil && n > want {
			want = n
		}
	}
	nl := unix.Rlimit{Cur: want, Max: want}
	if unix.Setrlimit(unix.RLIMIT_NOFILE, &nl) != nil {
		nl = unix.Rlimit{Cur: lim.Max, Max: lim.Max}
		_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &nl)
	}
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil {
		log.Debugf("RLIMIT_NOFILE %d", lim.Cur)
	}
}

// rawFS wraps go-fuse's node bridge to see what the node API hides: the
// lock owner of a FLUSH.
type rawFS struct {
	fuse.RawFileSystem
	fsys *FS
}

// Tmpfile, like Open and Create, may register a passthrough file's
// backing descriptor as fscred.Writer (writeas.go): the thread gets the
// daemon's credentials back before the reply.
func (r *rawFS) Tmpfile(cancel <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	defer givePassthroughWriterBack()
	return r.RawFileSystem.Tmpfile(cancel, in, out)
}

func (r *rawFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	defer r.fsys.requests.done(opFlush, time.Now())
	r.fsys.flushOwners.Store(cancel, in.LockOwner)
	defer r.fsys.flushOwners.Delete(cancel)
	return r.RawFileSystem.Flush(cancel, in)
}

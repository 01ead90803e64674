// Package fusefs is phxmount's overlay filesystem: a go-fuse v2 node tree
// over a backing directory in which every ordinary operation passes through
// to the backing files, and the project's ioctls and user.phx.* xattrs are
// answered by a Control (see control.go).
//
// # Name resolution
//
// Every node holds an O_PATH descriptor on its backing inode, taken at
// lookup. Operations resolve names relative to the parent's descriptor with
// the *at system calls (openat, fstatat, mkdirat, unlinkat, renameat2,
// linkat, symlinkat, readlinkat, fchownat, utimensat, mknodat, fchmodat2)
// and re-open a node's own inode through /proc/self/fd, so no path string is
// ever joined: long paths, renames under open files and concurrent changes
// to the backing tree behave as on the backing directory. The daemon raises
// RLIMIT_NOFILE to fs.nr_open at mount because every inode the kernel
// caches costs one descriptor, and keeps its nodes under half of it: past
// that, the kernel is asked to forget those looked up longest ago
// (prune.go), so a walk of more files than the daemon has descriptors
// works. An open file holds a descriptor too, so one user (root
// excepted) holds at most an eighth of them open, and all users but root
// together a quarter (handles_user.go).
//
// # Identity
//
// stat through the mount reports the backing file's st_ino, size, mode,
// nlink, uid, gid and times; only st_dev differs (it is the FUSE mount's).
// Inodes from file systems mounted below the backing root (another st_dev)
// get a number mixed with their device so that they cannot collide.
//
// # Permissions
//
// The daemon usually runs as root, so the mount is made with
// default_permissions (unless Options.NoDefaultPermissions is set) and
// FUSE_POSIX_ACL: the kernel checks every access against the mode, owner,
// group and POSIX ACLs the backing file reports, as it would on the backing
// directory. Whatever then acts on the backing files runs with the
// caller's credentials (ascaller.go): opens and opendirs (an execve's open
// asks for execute permission as the caller), creates, links, symlinks,
// mkdir and mknod (with the caller's umask, or the directory's default
// ACL, as natively: umask.go), unlink, rmdir and rename with its flags,
// chmod, chown, truncate and utimes, and the xattr calls judged by a
// file's attributes (user.*, system.posix_acl_*, listxattr). The backing
// kernel judges each against the files as they are at that moment, with
// the caller's groups and capabilities, and nothing is chowned afterwards:
// a name replaced or a permission changed on the backing side since the
// kernel cached it gives the caller the errno its own call there gives.
// What the kernel still decides on the attributes it cached is the search
// permission of the directories on a path (for up to its node's attribute
// timeout, cache.go). Run as the daemon: a mode that only clears the
// set-ID bits (the kernel's own, after a write), trusted.* and security.*
// changes (the kernel has judged the caller's capabilities), the kernel's
// reads of ACLs. The kernel never keeps the mount root's ACLs (it makes
// the root inode before FUSE_POSIX_ACL is agreed on and leaves such an
// inode uncached for good), so a caller who does not own the backing root
// costs one GETXATTR per path walk through it.
//
// # Passthrough
//
// Opened regular files use kernel FUSE passthrough (Linux >= 6.9,
// CAP_SYS_ADMIN): reads and writes go from the kernel to the backing file
// with no daemon round trip. go-fuse silently disables passthrough for the
// whole mount when registering a backing descriptor fails; the overlay
// probes a registration at mount and watches for READ/WRITE requests on
// files that were meant to be passthrough, and reports the state through
// PassthroughActive.
//
// # Caching
//
// Every reply carries the timeouts of its node's backing file system,
// chosen from Options.Cache per st_dev (cache.go): long ones, negative
// entries, FOPEN_KEEP_CACHE on classic-path files and kept listings where a
// fanotify filesystem mark sees every change (watch.go turns the changes
// made behind the mount's back into NotifyEntry, NotifyDelete and
// NotifyContent; a queue overflow invalidates everything), short ones and
// revalidation where other machines can change the files (network and
// cluster file systems: attributes re-read with AT_STATX_FORCE_SYNC, pages
// kept only while mtime, ctime and size hold; keepcache.go). A LOOKUP that
// raced an event in its directory is answered with zero timeouts (no
// notification reaches an inode the kernel does not know yet), and an
// invalidation of an inode whose reply is still being built waits for it.
//
// # ioctls and virtual xattrs
//
// No ioctl ever reaches a backing descriptor: every ioctl goes to the
// Control, and without a Control every ioctl gets ENOTTY. Names starting
// with XattrPrefix (user.phx.) never reach a backing file: get and set go
// to the Control (ENODATA / ENOTSUP without one), remove gets EPERM. listxattr
// hides every user.phx.* name, including user.phx.info: a tool that copies
// xattrs (cp -a, rsync -X, tar --xattrs) must not copy the virtual ones.
//
// # Locks
//
// flock locks are taken on the backing descriptor of the open file. POSIX
// record locks are taken as open-file-description locks on one backing
// descriptor per (inode, lock owner), which gives them POSIX semantics
// (a process's locks are shared by its descriptors and released when it
// closes any of them) and makes them visible to processes that lock the
// backing file directly. Those descriptors count with their user's open
// files (ENOLCK past the user's share). A lock that waits (F_SETLKW,
// flock without LOCK_NB) does not block one of the daemon's threads: it
// is tried again, without blocking, at once when a lock on its inode is
// let go through the mount, else after pauses that grow to 10 ms (more
// with thousands of waiters), and a signal to the waiting caller ends it
// with EINTR, as natively (locks.go, wait.go). An OFD lock's owner is its
// open file: its locks end at that file's RELEASE.
package fusefs

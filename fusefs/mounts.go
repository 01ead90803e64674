package fusefs

import (
	"os"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/procfs"
)

// Mounts below the backing directory. The overlay resolves every name
// relative to a descriptor, so a file system mounted on BACKING/sub shows
// through the mount once the kernel looks sub up again, and one unmounted
// from there stops showing then; left alone, that is after the entry
// timeout (an hour where watched, a day under cache=exclusive). The mount
// monitor polls /proc/self/mountinfo, which signals POLLPRI on every change
// of the mount table on every kernel this runs on (fanotify's mount events
// need Linux 6.15), and when a mount below BACKING appears or goes it
// drops the mount point's name from the kernel's cache, and with it every
// name the kernel keeps below. The file system met there gets its own
// cache policy at the next lookup (cache.go); the policy of a file system
// unmounted from below BACKING is forgotten, so that a new one given the
// same device number (tmpfs and other anonymous devices reuse theirs at
// once) is classified, and marked, afresh.
//
// What remains (README, "Caching"): the overlay holds an O_PATH descriptor
// on every inode the kernel knows, so `umount BACKING/sub` fails with
// EBUSY while the kernel keeps any name below it. `umount -l` detaches
// it; the monitor then drops the names, the kernel forgets the inodes no
// process uses, and their descriptors are closed, which frees the file
// system.

// MountMonitorHow is how mounts below the backing directory are noticed
// (the log at mount, doctor).
const MountMonitorHow = "polling /proc/self/mountinfo (POLLPRI at every change of the mount table; fanotify's mount events would need Linux 6.15)"

// mountMonitor notices mounts and unmounts below the backing directory.
type mountMonitor struct {
	fsys  *FS
	root  string                    // the backing directory as the mount table names it
	fd    int                       // /proc/self/mountinfo, polled for POLLPRI
	evfd  int                       // wakes the poll to stop
	below map[string][]procfs.Mount // by mount point relative to root
	done  chan struct{}
}

// startMountMonitor starts noticing mounts below the backing directory;
// nil (and a log line saying what that means) where it cannot.
func startMountMonitor(f *FS) *mountMonitor {
	m, err := newMountMonitor(f)
	if err != nil {
		f.log.Warnf("mounts below %s are not noticed (%v): one mounted or unmounted there shows through the mount after the entry timeout", f.backing, err)
		return nil
	}
	f.log.Infof("mounts below %s: noticed by %s", f.backing, MountMonitorHow)
	go m.loop()
	return m
}

func newMountMonitor(f *FS) (*mountMonitor, error) {
	root, err := os.Readlink(procSelfFd(f.root.fd))
	if err != nil {
		return nil, err
	}
	ms, err := procfs.Mounts()
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(procfs.Root+"/self/mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &mountMonitor{fsys: f, root: root, fd: fd, evfd: evfd, below: mountsBelow(ms, root), done: make(chan struct{})}, nil
}

// stop ends the monitor.
func (m *mountMonitor) stop() {
	if m == nil {
		return
	}
	var one [8]byte
	one[0] = 1
	unix.Write(m.evfd, one[:])
	<-m.done
	unix.Close(m.fd)
	unix.Close(m.evfd)
}

func (m *mountMonitor) loop() {
	defer close(m.done)
	for {
		fds := []unix.PollFd{{Fd: int32(m.fd), Events: unix.POLLPRI}, {Fd: int32(m.evfd), Events: unix.POLLIN}}
		_, err := unix.Poll(fds, -1)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			m.fsys.log.Errorf("mounts below %s are no longer noticed: poll /proc/self/mountinfo: %v", m.fsys.backing, err)
			return
		case fds[1].Revents != 0:
			return
		case fds[0].Revents&(unix.POLLPRI|unix.POLLERR) != 0:
			m.changed()
		}
	}
}

// changed compares the mounts below the backing directory with the last
// ones seen, drops the names of the mount points that changed and
// forgets the policies of the file systems unmounted.
func (m *mountMonitor) changed() {
	f := m.fsys
	ms, err := procfs.Mounts()
	if err != nil {
		f.log.Warnf("mounts below %s: %v", f.backing, err)
		return
	}
	cur := mountsBelow(ms, m.root)
	for _, rel := range changedMountPoints(m.below, cur) {
		what := "unmounted from"
		if len(cur[rel]) > len(m.below[rel]) {
			what = "mounted on"
		}
		f.log.Infof("a file system was %s %s/%s: its name is dropped from the kernel's cache", what, f.backing, rel)
		f.forgetName(rel)
		f.forgetPolicies(gone(m.below[rel], cur[rel]))
	}
	m.below = cur
}

// mountsBelow is the mounts on each mount point strictly below root, by
// path relative to root.
func mountsBelow(ms []procfs.Mount, root string) map[string][]procfs.Mount {
	prefix := strings.TrimSuffix(root, "/") + "/"
	out := map[string][]procfs.Mount{}
	for _, mt := range ms {
		if rel, ok := strings.CutPrefix(mt.MountPoint, prefix); ok && rel != "" {
			out[rel] = append(out[rel], mt)
		}
	}
	return out
}

// changedMountPoints lists, sorted, the mount points whose mounts differ.
func changedMountPoints(prev, cur map[string][]procfs.Mount) []string {
	sameIDs := func(a, b procfs.Mount) bool { return a.ID == b.ID }
	var out []string
	for rel, now := range cur {
		if !slices.EqualFunc(prev[rel], now, sameIDs) {
			out = append(out, rel)
		}
	}
	for rel := range prev {
		if _, ok := cur[rel]; !ok {
			out = append(out, rel)
		}
	}
	sort.Strings(out)
	return out
}

// gone is the devices of the mounts in prev that are not in cur.
func gone(prev, cur []procfs.Mount) []uint64 {
	var out []uint64
	for _, p := range prev {
		if !slices.ContainsFunc(cur, func(c procfs.Mount) bool { return c.ID == p.ID }) {
			out = append(out, p.Dev)
		}
	}
	return out
}

// forgetName drops the name at rel (relative to the backing root) from
// the kernel's cache, with everything it keeps below it, where the
// overlay's tree holds the directory it is in (elsewhere the kernel keeps
// nothing of it).
func (f *FS) forgetName(rel string) {
	dir := f.root
	parts := strings.Split(rel, "/")
	for _, name := range parts[:len(parts)-1] {
		if dir = dir.childNode(name); dir == nil {
			return
		}
	}
	dir.gen.Add(1)
	dir.NotifyEntry(parts[len(parts)-1])
}

// forgetPolicies forgets the cache policies of devs (but the backing
// root's): nodes keep the one they have, the next file system met on one
// of these devices gets a new one.
func (f *FS) forgetPolicies(devs []uint64) {
	f.polMu.Lock()
	defer f.polMu.Unlock()
	for _, dev := range devs {
		if dev != f.rootDev {
			delete(f.pols, dev)
		}
	}
}

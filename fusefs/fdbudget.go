package fusefs

import "golang.org/x/sys/unix"

// The daemon's descriptors are shared by every user of the mount, and a
// request that finds none left fails for whoever sent it. They are shared
// out as fractions of RLIMIT_NOFILE: the nodes of the names the kernel
// caches up to a half (prune.go), the open files, directories and lock
// owners of all users but root up to a quarter, each user's up to an
// eighth (handles_user.go, locks.go), the registered buffers up to a
// quarter (control_buffers.go); the rest is root's, the runtime's and the
// watcher's.

// shareOfNoFile is the daemon's RLIMIT_NOFILE divided by div, and at least
// least (1<<30 where the limit is unknown or unlimited). Read at each
// call: prlimit may change the limit while the daemon runs.
func shareOfNoFile(div uint64, least int) int {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) != nil || rl.Cur > 1<<40 {
		return 1 << 30
	}
	return max(int(rl.Cur/div), least)
}

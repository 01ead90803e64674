package main

import (
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/procfs"
)

// phxmount wait [--timeout S] MOUNTPOINT: the one readiness check. It
// returns once MOUNTPOINT is a phxmount mount whose daemon serves requests
// and has settled what it reports (its passthrough state is known): the
// moment the daemon logs "mounted;". Scripts, tests and service managers
// wait with it instead of reading the log.

const waitUsage = "usage: phxmount wait [--timeout SECONDS] MOUNTPOINT"

func waitCmd(args []string) int {
	timeout := 30 * time.Second
	var mnt string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "--timeout" && i+1 < len(args):
			i++
			s, err := strconv.ParseFloat(args[i], 64)
			if err != nil || s <= 0 {
				return fail(2, "wait: --timeout %q: want seconds > 0", args[i])
			}
			timeout = time.Duration(s * float64(time.Second))
		case mnt == "" && !strings.HasPrefix(a, "-"):
			mnt = a
		default:
			return fail(2, "wait: %q: %s", a, waitUsage)
		}
	}
	if mnt == "" {
		return fail(2, "wait: %s", waitUsage)
	}
	why := waitReady(mnt, timeout)
	if why != "" {
		return fail(1, "wait: %s not ready after %v: %s", mnt, timeout, why)
	}
	return 0
}

// waitReady polls until mnt is ready; it returns "" then, or why not at
// the deadline.
func waitReady(mnt string, timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	for {
		why := notReady(mnt)
		if why == "" || time.Now().After(deadline) {
			return why
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// notReady says what keeps mnt from being a ready phxmount mount ("" when
// it is one).
func notReady(mnt string) string {
	abs, err := filepath.Abs(mnt)
	if err != nil {
		return err.Error()
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	m, ok := procfs.MountAt(abs)
	switch {
	case !ok:
		return "not a mount point"
	case m.FSType != "fuse.phxmount":
		return "mounted, but " + m.FSType + ", not fuse.phxmount"
	}
	buf := make([]byte, 64<<10)
	n, err := unix.Getxattr(abs, "user.phx.info", buf)
	if err != nil {
		return "user.phx.info: " + err.Error()
	}
	if info := string(buf[:n]); !strings.Contains(info, "\npassthrough=") || strings.Contains(info, "\npassthrough=unknown") {
		return "the daemon has not settled its passthrough state yet"
	}
	return ""
}

package main

import (
	"os"
	"strings"
)

// fuseWakeParam is a fuse module parameter some kernels have and mainline
// does not (this project's development machines: 6.18.44-fc). Measured
// there, Y made every FUSE round trip a quarter to a half cheaper (unlink
// 6.4-8.1x native against 9.4-10.6x; docs/perf-notes.md §9): the daemon's
// reader is woken on the caller's CPU instead of an idle one. It is one
// switch for every FUSE file system of the node, so phxmount only reports
// it; an administrator sets it.
const fuseWakeParam = "/sys/module/fuse/parameters/wake_here"

// checkFuseWake is doctor's note on fuseWakeParam (read from path), or
// false where the kernel has no such parameter.
func checkFuseWake(path string) (finding, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return finding{}, false
	}
	f := finding{What: "fuse wake_here", Note: true}
	switch v := strings.TrimSpace(string(b)); v {
	case "Y", "1":
		f.Detail = "Y: FUSE wakes the daemon on the caller's CPU (metadata round trips a quarter to a half cheaper; docs/perf-notes.md §9)"
	case "N", "0":
		f.Detail = "N: this kernel can wake the daemon on the caller's CPU; as root, echo Y > " + path +
			" made metadata round trips a quarter to a half cheaper on the development machines (every FUSE file system of the node; docs/perf-notes.md §9)"
	default:
		f.Detail = "unknown value " + v
	}
	return f, true
}

package main

import (
	"fmt"

	"github.com/phxmount/phxmount/fusefs"
)

// checkCache reports whether fanotify can watch, and how a mount of dir
// (the current directory when none is named) would cache in mode.
func checkCache(mode fusefs.CacheMode, dir string) []finding {
	what := dir
	if dir == "" {
		dir, what = ".", "the current directory"
	}
	ci, err := fusefs.ProbeCache(dir, mode)
	if err != nil {
		return []finding{{What: "cache", Detail: err.Error()}}
	}
	fan := finding{What: "fanotify", OK: ci.Watch.Active,
		Detail: "FAN_REPORT_DFID_NAME and filesystem marks: cache=auto watches local file systems and caches long"}
	switch {
	case mode != fusefs.CacheAuto:
		fan.OK, fan.Detail = true, fmt.Sprintf("not used with -o cache=%s", mode)
	case !ci.Watch.Active:
		fan.Detail = ci.Watch.Why + ": cache=auto revalidates every file system with short timeouts"
	}
	note := finding{What: "cache", Note: true,
		Detail: fmt.Sprintf("-o cache=%s on %s (%s): %s; %s", mode, what, ci.FsType, ci.Describe, ci.Why)}
	return []finding{fan, note}
}

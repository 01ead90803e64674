package main

import (
	"fmt"

	"github.com/phxmount/phxmount/client"
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
		Detail: "FAN_REPORT_DFID_NAME and filesystem marks: cache=auto watches local file systems and caches long " +
			"(should reading events fail while mounted, they fall back to revalidate: user.phx.info says watch=failed)"}
	switch {
	case mode != fusefs.CacheAuto:
		fan.OK, fan.Detail = true, fmt.Sprintf("not used with -o cache=%s", mode)
	case !ci.Watch.Active:
		fan.Detail = ci.Watch.Why + ": cache=auto revalidates every file system with short timeouts"
	}
	note := finding{What: "cache", Note: true,
		Detail: fmt.Sprintf("-o cache=%s on %s (%s): %s; %s", mode, what, ci.FsType, ci.Describe, ci.Why)}
	below := finding{What: "mounts below BACKING", Note: true,
		Detail: "noticed by " + fusefs.MountMonitorHow + ": one mounted or unmounted there shows through the mount within moments; " +
			"umount of it fails with EBUSY while the kernel keeps names below it (the overlay holds a descriptor per name): umount -l, " +
			"then the names are dropped and the file system freed once no process uses it"}
	return []finding{fan, note, checkPermissionLag(ci), below}
}

// checkPermissionLag says how soon a permission change made on the
// backing side is enforced through the mount. Opens, creates, removals,
// renames and attribute and xattr changes run as the caller, so the
// backing kernel judges each against the file as it is at that moment;
// what the kernel of the mount checks against what it cached is the search
// permission of the directories on a path, so under cache=exclusive a
// chmod 0700 of a directory there leaves what is below it reachable
// through the mount for a day.
func checkPermissionLag(ci fusefs.CacheInfo) finding {
	f := finding{What: "permission changes", OK: ci.StaleAccess == ""}
	const atOpen = "a chmod, chown or ACL change of a file on the backing side is enforced at its next open (opens and changes run as the caller); of a directory, for the paths through it, "
	switch {
	case !f.OK:
		f.Detail = ci.StaleAccess + " (use -o cache=auto where anyone else changes permissions)"
	case ci.Class == client.CacheWatch:
		f.Detail = atOpen + "as soon as its fanotify event is applied (milliseconds)"
	default:
		f.Detail = atOpen + fmt.Sprintf("within the %gs attribute timeout", ci.Attr.Seconds())
	}
	return f
}

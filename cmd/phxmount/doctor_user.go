package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// What an ordinary user's mount lacks (docs/install.md, "Without root"):
// a daemon that is not root mounts through the setuid fusermount3, serves
// the classic path only (passthrough needs CAP_SYS_ADMIN, which
// checkPassthrough reports), cannot hand files it creates to the caller,
// and allow_other needs user_allow_other in /etc/fuse.conf.

// fuseConf is where fusermount3 reads user_allow_other.
var fuseConf = "/etc/fuse.conf"

// userFindings are the checks of a daemon that is not root (none for root,
// which mounts directly and acts as each caller).
func userFindings() []finding {
	if os.Geteuid() == 0 {
		return nil
	}
	return []finding{checkFusermount(), checkAllowOther(), {What: "ownership hand-off",
		Detail: fmt.Sprintf("not root: what is created through the mount belongs to uid %d, and requests of other uids are refused (EACCES)", os.Geteuid())}}
}

// checkFusermount: an ordinary user mounts through a setuid-root
// fusermount3 (or fusermount); without one nothing mounts.
func checkFusermount() finding {
	f := finding{What: "fusermount3", Required: true}
	for _, name := range []string{"fusermount3", "fusermount"} {
		p, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			continue
		}
		sys, _ := st.Sys().(*syscall.Stat_t)
		if st.Mode()&os.ModeSetuid == 0 || sys == nil || sys.Uid != 0 {
			f.Detail = p + " is not setuid root: an ordinary user cannot mount"
			return f
		}
		f.OK, f.Detail = true, p+" (setuid root): mounts without root, the classic path only"
		return f
	}
	f.Detail = "not found (Debian package fuse3): an ordinary user cannot mount"
	return f
}

// checkAllowOther: -o allow_other for an ordinary user's mount needs
// user_allow_other in /etc/fuse.conf.
func checkAllowOther() finding {
	f := finding{What: "allow_other", Detail: "no user_allow_other in " + fuseConf + ": only you can use your mounts; -o allow_other is refused"}
	file, err := os.Open(fuseConf)
	if err != nil {
		f.Detail = fuseConf + ": " + err.Error() + ": only you can use your mounts; -o allow_other is refused"
		return f
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "user_allow_other" {
			f.OK, f.Detail = true, "user_allow_other in "+fuseConf+": -o allow_other lets other users in"
		}
	}
	return f
}

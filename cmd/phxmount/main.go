// Command phxmount mounts the Phoenix overlay of a backing directory:
// `phxmount [options] BACKING MOUNTPOINT` (see --help), and `phxmount
// doctor` reports what this machine offers without mounting. Run as
// mount.fuse.phxmount, it is mount(8)'s helper (helper.go).
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector/nvidia"
	"github.com/phxmount/phxmount/fusefs"
	"github.com/phxmount/phxmount/internal/buildinfo"
	"github.com/phxmount/phxmount/internal/mounthelper"
	"github.com/phxmount/phxmount/internal/procfs"
	"github.com/phxmount/phxmount/phxfs"
)

// The main goroutine keeps the main thread, so no FUSE request is ever
// served there: a request that changes its thread's credentials
// (fusefs/writeas.go, fusefs/ascaller.go) does so on a thread the runtime
// can end should they not come back, which it cannot do with the main one.
func init() { runtime.LockOSThread() }

func main() {
	if filepath.Base(os.Args[0]) == mounthelper.HelperName {
		os.Exit(mountHelper(os.Args[1:])) // mount(8) runs /sbin/mount.fuse.phxmount
	}
	os.Exit(run(os.Args[1:]))
}

// fail prints the one line a user sees and returns the exit status.
func fail(code int, format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "phxmount: "+format+"\n", args...)
	return code
}

func run(args []string) int {
	if len(args) > 0 && args[0] == "doctor" {
		return doctor(newLogger(logrus.WarnLevel, "text", os.Stderr), args[1:])
	}
	if len(args) > 0 && args[0] == "wait" {
		return waitCmd(args[1:])
	}
	c, err := parseArgs(args)
	if err != nil {
		var ue *usageError
		switch {
		case errors.As(err, &ue) && ue.msg == "help":
			fmt.Print(usageText())
			return 0
		case errors.As(err, &ue) && ue.msg == "version":
			fmt.Print(buildinfo.Get())
			return 0
		}
		return fail(2, "%v", err)
	}
	if err := checkDirs(c); err != nil {
		return fail(2, "%v", err)
	}
	if err := checkEnv(c); err != nil {
		return fail(2, "%v", err)
	}
	return serve(c)
}

// logMounted says what was mounted, with passthrough and caching, in the
// line the tests and scripts/bench-mount.sh look for.
func logMounted(log *logrus.Entry, c *config, fsys *fusefs.FS, control bool) {
	active, why := fsys.PassthroughActive()
	pt := "inactive"
	if active {
		pt = "active"
	}
	ci := fsys.RootCache()
	log.WithFields(logrus.Fields{
		"backing":     fsys.Backing(),
		"mountpoint":  c.mountpoint,
		"passthrough": pt,
		"cache":       ci.Class,
		"ro":          c.fs.ReadOnly,
		"allow_other": c.fs.AllowOther,
		"control":     control,
	}).Infof("mounted; passthrough %s: %s; cache=%s on %s: %s", pt, why, c.fs.Cache, ci.FsType, ci.Describe)
}

// checkEnv refuses bad tuning variables before anything is mounted: they
// are never ignored or clamped.
func checkEnv(c *config) error {
	if err := phxfs.CheckEnv(); err != nil {
		return err
	}
	if c.vendor == "nvidia" || c.vendor == "auto" {
		if err := nvidia.CheckEnv(); err != nil {
			return err
		}
	}
	return nil
}

// checkDirs validates BACKING and MOUNTPOINT before anything is mounted.
func checkDirs(c *config) error {
	st, err := os.Stat(c.backing)
	switch {
	case err != nil:
		return fmt.Errorf("backing directory %s: %v", c.backing, pathErr(err))
	case !st.IsDir():
		return fmt.Errorf("backing directory %s: not a directory", c.backing)
	}
	st, err = os.Stat(c.mountpoint)
	switch {
	case err != nil:
		return fmt.Errorf("mountpoint %s: %v", c.mountpoint, pathErr(err))
	case !st.IsDir():
		return fmt.Errorf("mountpoint %s: not a directory", c.mountpoint)
	}
	abs, err := filepath.Abs(c.mountpoint)
	if err == nil {
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			abs = real
		}
		if isMountPoint(abs) {
			return fmt.Errorf("mountpoint %s: busy: already a mount point", c.mountpoint)
		}
	}
	b, _ := filepath.Abs(c.backing)
	if rb, err := filepath.EvalSymlinks(b); err == nil && rb == abs {
		return fmt.Errorf("mountpoint %s is the backing directory", c.mountpoint)
	}
	return nil
}

func pathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// isMountPoint says whether dir is the mount point of some mount in this
// namespace (per /proc/self/mountinfo, so bind mounts count too).
func isMountPoint(dir string) bool {
	if _, err := procfs.Mounts(); err != nil {
		var st, pst unix.Stat_t
		if unix.Stat(dir, &st) != nil || unix.Stat(filepath.Dir(dir), &pst) != nil {
			return false
		}
		return st.Dev != pst.Dev
	}
	_, ok := procfs.MountAt(dir)
	return ok
}

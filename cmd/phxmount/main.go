// Command phxmount mounts the Phoenix overlay of a backing directory:
// `phxmount [options] BACKING MOUNTPOINT` (see --help), and `phxmount
// doctor` reports what this machine offers without mounting.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"phxmount/connector/nvidia"
	"phxmount/fusefs"
	"phxmount/internal/procfs"
	"phxmount/phxfs"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// fail prints the one line a user sees and returns the exit status.
func fail(code int, format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "phxmount: "+format+"\n", args...)
	return code
}

func newLogger(level logrus.Level) *logrus.Entry {
	l := logrus.New()
	l.SetOutput(os.Stderr)
	l.SetLevel(level)
	l.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: "15:04:05.000"})
	return logrus.NewEntry(l).WithField("component", "phxmount")
}

func run(args []string) int {
	if len(args) > 0 && args[0] == "doctor" {
		lvl := logrus.WarnLevel
		return doctor(newLogger(lvl), args[1:])
	}
	if len(args) > 0 && args[0] == "wait" {
		return waitCmd(args[1:])
	}
	c, err := parseArgs(args)
	if err != nil {
		var ue *usageError
		if errors.As(err, &ue) && ue.msg == "help" {
			fmt.Print(usage)
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
	log := newLogger(c.logLevel)
	c.fs.Log = log

	ctl, closeCtl, err := newControl(c, log)
	if err != nil {
		return fail(1, "%v", err)
	}
	defer closeCtl()
	c.fs.Control = ctl

	fsys, err := fusefs.Mount(c.backing, c.mountpoint, c.fs)
	if err != nil {
		return fail(1, "%v", err)
	}
	logMounted(log, c, fsys, ctl != nil)
	// The control exists before the overlay: tell it how to report the
	// overlay's passthrough state (INFO and user.phx.info). From here on
	// the mount answers as ready (phxmount wait), after the line above.
	if s, ok := ctl.(interface{ SetPassthrough(func() (bool, string)) }); ok {
		s.SetPassthrough(fsys.PassthroughActive)
	}

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		fsys.Wait()
		close(done)
	}()
	select {
	case s := <-sigs:
		log.Infof("%v: unmounting %s", s, c.mountpoint)
		if err := fsys.Unmount(); err != nil {
			log.Errorf("unmount %s: %v", c.mountpoint, err)
		}
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			log.Warnf("%s was detached lazily; processes still using it will see ENOTCONN", c.mountpoint)
		}
	case <-done:
		log.Infof("%s was unmounted", c.mountpoint)
	}
	return 0
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

package main

import (
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/daemonize"
	"github.com/phxmount/phxmount/internal/mounthelper"
)

// helperTimeout bounds how long the mount helper waits for the daemon to
// serve.
const helperTimeout = 60 * time.Second

// mountHelper is phxmount run as /sbin/mount.fuse.phxmount by mount(8)
// (`mount -t fuse.phxmount`, an /etc/fstab line, a systemd .mount unit):
// it checks the command line as the daemon would, starts the daemon in a
// session of its own and returns once the mount serves. Exit status 2: a
// bad command line or option; 1: the mount failed (the daemon's own status
// when it exited, having said why).
func mountHelper(argv []string) int {
	a, err := mounthelper.Parse(argv)
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fail(2, "%v", err)
		}
		return fail(1, "%v", err)
	}
	args := a.DaemonArgs()
	c, err := parseArgs(args)
	if err == nil {
		err = checkDirs(c)
	}
	if err == nil {
		err = checkEnv(c)
	}
	if err != nil {
		return fail(2, "%v", err)
	}
	if a.Fake {
		return 0 // mount -f: everything checked, nothing mounted
	}
	self, err := os.Executable()
	if err != nil {
		return fail(1, "%s: %v", mounthelper.HelperName, err)
	}
	err = daemonize.Start(self, append([]string{"phxmount"}, args...), func() string { return notReady(c.mountpoint) }, helperTimeout)
	var ee *daemonize.ExitError
	switch {
	case errors.As(err, &ee) && ee.Status > 0:
		return ee.Status // the daemon said why on our stderr
	case err != nil:
		return fail(1, "%s %s: %v", mounthelper.HelperName, c.mountpoint, err)
	}
	return 0
}

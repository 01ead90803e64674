// Package daemonize runs the daemon in the background the way a mount
// helper must: mount(8) waits for its helper to exit, so the helper starts
// the daemon in a session of its own and returns once the mount serves,
// or with the daemon's failure. It also tells a service manager that the
// daemon is ready (sd_notify, for a Type=notify unit).
package daemonize

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// Env is set to "1" in the environment of a daemon that Start runs.
const Env = "PHXMOUNT_DAEMONIZED"

// Child reports whether this process is a daemon that Start runs: it
// detaches (Detach) once it serves.
func Child() bool { return os.Getenv(Env) == "1" }

// Start runs the program path with args (args[0] is its name) as a
// daemon: in a session of its own, stdin and stdout on /dev/null, stderr
// inherited (what the daemon says before it serves reaches whoever ran
// the helper), Env set. It polls ready, which says what is missing ("" once
// the mount serves), and returns nil then; the daemon's failure when it
// exits first; or, after timeout, ETIMEDOUT, having stopped the daemon
// with SIGTERM.
func Start(path string, args []string, ready func() string, timeout time.Duration) error {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return errs.Wrapf(err, "daemonize: open %s", os.DevNull)
	}
	defer null.Close()
	cmd := &exec.Cmd{Path: path, Args: args, Env: append(os.Environ(), Env+"=1"),
		Stdin: null, Stdout: null, Stderr: os.Stderr, SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	if err := cmd.Start(); err != nil {
		return errs.Wrapf(err, "daemonize: start %s", path)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(timeout)
	why := ready()
	for why != "" {
		select {
		case err := <-exited:
			if ready() == "" {
				return nil // it served, and has already gone again
			}
			return exitError(cmd, err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Signal(unix.SIGTERM)
			return errs.New(unix.ETIMEDOUT, "daemonize: the daemon (pid %d) did not serve within %v (%s); stopped it", cmd.Process.Pid, timeout, why)
		}
		why = ready()
	}
	return nil
}

// ExitError is a daemon that ended before it served.
type ExitError struct {
	Status int    // its exit status; -1 when a signal ended it
	State  string // how it ended, in words
}

func (e *ExitError) Error() string {
	return "daemonize: the daemon " + e.State + " before it served"
}

// Unwrap gives the errno every error of the project carries.
func (e *ExitError) Unwrap() error { return unix.EIO }

// exitError describes a daemon that exited before it served.
func exitError(cmd *exec.Cmd, err error) error {
	st := cmd.ProcessState
	if st == nil {
		return errs.Wrapf(err, "daemonize: wait for the daemon")
	}
	if st.Exited() {
		return &ExitError{Status: st.ExitCode(), State: "exited with status " + strconv.Itoa(st.ExitCode())}
	}
	return &ExitError{Status: -1, State: "ended (" + st.String() + ")"}
}

// Detach points the daemon's stdin, stdout and stderr at /dev/null, as a
// daemon that serves must: whoever ran the helper may be gone. The caller
// has moved its log elsewhere first.
func Detach() error {
	fd, err := unix.Open(os.DevNull, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return errs.Wrapf(err, "daemonize: open %s", os.DevNull)
	}
	defer unix.Close(fd)
	for _, to := range []int{0, 1, 2} {
		if err := unix.Dup3(fd, to, 0); err != nil {
			return errs.Wrapf(err, "daemonize: redirect fd %d", to)
		}
	}
	return nil
}

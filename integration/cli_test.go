package integration

// The command line: bad input is one line on stderr and status 2,
// signals unmount cleanly, doctor reports without mounting, and wait
// is the readiness check.

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCLIErrors: bad input gives exactly one line on stderr and status 2,
// and mounts nothing.
func TestCLIErrors(t *testing.T) {
	requireMountEnv(t)
	bin := phxmountBin(t)
	dir := t.TempDir()
	backing, mnt := filepath.Join(dir, "b"), filepath.Join(dir, "m")
	os.Mkdir(backing, 0755)
	os.Mkdir(mnt, 0755)
	busy := t.TempDir()
	if err := unix.Mount("tmpfs", busy, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	defer unix.Unmount(busy, unix.MNT_DETACH)

	cases := []struct {
		name string
		args []string
		want string
	}{
		{"bad -o", []string{"-o", "frobnicate", backing, mnt}, "unknown mount option"},
		{"bad timeout", []string{"-o", "entry_timeout=soon", backing, mnt}, "entry_timeout"},
		{"bad cache mode", []string{"-o", "cache=sometimes", backing, mnt}, "cache=auto, cache=exclusive or cache=off"},
		{"bad flag", []string{"--frob", backing, mnt}, "unknown option"},
		{"bad passthrough", []string{"--passthrough", "maybe", backing, mnt}, "--passthrough"},
		{"bad vendor", []string{"--vendor", "amd", backing, mnt}, "--vendor"},
		{"bad engine", []string{"--engine", "aio", backing, mnt}, "--engine"},
		{"bad workers", []string{"--workers", "-3", backing, mnt}, "--workers"},
		{"bad log level", []string{"--log-level", "loud", backing, mnt}, "--log-level"},
		{"bad log format", []string{"--log-format", "xml", backing, mnt}, "--log-format"},
		{"bad metrics address", []string{"--metrics", "9464", backing, mnt}, "--metrics"},
		{"bad flag as an option", []string{"-o", "vendor=amd", backing, mnt}, "--vendor"},
		{"unwritable log file", []string{"--log-file", "/proc/nope/log", backing, mnt}, "log file"},
		{"missing value", []string{backing, mnt, "-o"}, "needs a value"},
		{"one argument", []string{backing}, "need BACKING and MOUNTPOINT"},
		{"missing backing", []string{filepath.Join(dir, "nope"), mnt}, "no such file"},
		{"backing is a file", []string{"/etc/hostname", mnt}, "not a directory"},
		{"missing mountpoint", []string{backing, filepath.Join(dir, "nope")}, "no such file"},
		{"busy mountpoint", []string{backing, busy}, "already a mount point"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(bin, c.args...)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			done := make(chan error, 1)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("phxmount %v did not exit", c.args)
			}
			if code := cmd.ProcessState.ExitCode(); code != 2 {
				t.Errorf("exit status %d, want 2 (stderr %q)", code, stderr.String())
			}
			lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
			if len(lines) != 1 || !strings.Contains(strings.ToLower(lines[0]), strings.ToLower(c.want)) {
				t.Errorf("stderr %q: want one line mentioning %q", stderr.String(), c.want)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout %q, want nothing", stdout.String())
			}
			if isMounted(mnt) {
				t.Errorf("%s is mounted after a failed start", mnt)
			}
		})
	}
}

// TestSignalsUnmount: SIGTERM and SIGINT unmount cleanly and exit 0.
func TestSignalsUnmount(t *testing.T) {
	for _, sig := range []unix.Signal{unix.SIGTERM, unix.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			d := startDaemon(t)
			// An idle open directory must not keep the mount.
			os.WriteFile(filepath.Join(d.Mnt, "f"), []byte("x"), 0644)
			if err := d.Signal(sig); err != nil {
				t.Fatal(err)
			}
			code, ok := d.WaitExit(15 * time.Second)
			if !ok {
				t.Fatalf("phxmount still running 15 s after %v", sig)
			}
			if code != 0 {
				t.Errorf("exit status %d after %v, want 0:\n%s", code, sig, d.Stderr())
			}
			if d.Mounted() {
				t.Fatalf("%s still mounted after %v", d.Mnt, sig)
			}
			mustEqualFile(t, filepath.Join(d.Backing, "f"), []byte("x"))
		})
	}
}

// TestDoctor: doctor reports the checks without mounting.
func TestDoctor(t *testing.T) {
	requireMountEnv(t)
	out, err := exec.Command(phxmountBin(t), "doctor").CombinedOutput()
	if err != nil {
		t.Fatalf("doctor: %v\n%s", err, out)
	}
	for _, want := range []string{"/dev/fuse", "FUSE passthrough", "fanotify", "cache", "io_uring", "phxfs kernel module", "libcuda", "transport"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
}

// TestWait: phxmount wait, the one readiness check, is 0 on a ready
// phxmount mount, 1 (saying why) on a directory that is not one or another
// file system's mount point, 2 on a bad command line.
func TestWait(t *testing.T) {
	d := startDaemon(t)
	bin := phxmountBin(t)
	code := func(args ...string) (int, string) {
		out, err := exec.Command(bin, append([]string{"wait"}, args...)...).CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), string(out)
		}
		return 0, string(out)
	}
	if c, out := code(d.Mnt); c != 0 {
		t.Errorf("wait on the mount: %d %s", c, out)
	}
	if c, out := code("--timeout", "0.2", d.Backing); c != 1 || !strings.Contains(out, "not a mount point") {
		t.Errorf("wait on a plain directory: %d %s", c, out)
	}
	if c, out := code("--timeout", "0.2", "/proc"); c != 1 || !strings.Contains(out, "not fuse.phxmount") {
		t.Errorf("wait on /proc: %d %s", c, out)
	}
	for _, bad := range [][]string{nil, {"--timeout", "x", d.Mnt}, {d.Mnt, d.Mnt}} {
		if c, out := code(bad...); c != 2 {
			t.Errorf("wait %v: %d %s, want 2", bad, c, out)
		}
	}
}

package daemonize

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"
)

// TestHelperDaemon is the daemon the tests start: PHX_DAEMON_DIR names
// where it reports, PHX_DAEMON_MODE what it does.
func TestHelperDaemon(t *testing.T) {
	if !Child() {
		t.Skip("helper process for TestStart (runs only when re-executed)")
	}
	dir := os.Getenv("PHX_DAEMON_DIR")
	switch os.Getenv("PHX_DAEMON_MODE") {
	case "fail":
		fmt.Fprintln(os.Stderr, "daemon: cannot mount")
		os.Exit(3)
	case "hang":
		time.Sleep(time.Minute)
	}
	in, _ := os.Readlink("/proc/self/fd/0")
	report := fmt.Sprintf("sid=%v stdin=%s", unix.Getpid() == mustSid(), in)
	if err := Detach(); err != nil {
		report += " detach: " + err.Error()
	}
	errOut, _ := os.Readlink("/proc/self/fd/2")
	report += " stderr=" + errOut
	os.WriteFile(filepath.Join(dir, "report"), []byte(report), 0644)
	os.WriteFile(filepath.Join(dir, "ready"), nil, 0644)
	time.Sleep(time.Second) // a daemon stays
	os.Exit(0)
}

func mustSid() int {
	sid, _ := unix.Getsid(0)
	return sid
}

func start(t *testing.T, mode string, timeout time.Duration) (string, error) {
	dir := t.TempDir()
	t.Setenv("PHX_DAEMON_DIR", dir)
	t.Setenv("PHX_DAEMON_MODE", mode)
	ready := func() string {
		if _, err := os.Stat(filepath.Join(dir, "ready")); err != nil {
			return "not ready yet"
		}
		return ""
	}
	return dir, Start(os.Args[0], []string{os.Args[0], "-test.run=^TestHelperDaemon$"}, ready, timeout)
}

// TestStart: the daemon runs in its own session with stdin on /dev/null,
// Start returns once it is ready, and Detach leaves its stderr on
// /dev/null.
func TestStart(t *testing.T) {
	dir, err := start(t, "serve", 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "report"))
	if string(b) != "sid=true stdin=/dev/null stderr=/dev/null" {
		t.Errorf("daemon report %q", b)
	}
}

// TestStartFails: a daemon that exits before it is ready gives its status.
func TestStartFails(t *testing.T) {
	_, err := start(t, "fail", 20*time.Second)
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Status != 3 || !errors.Is(err, unix.EIO) || !strings.Contains(err.Error(), "exited with status 3 before it served") {
		t.Fatalf("error %v", err)
	}
}

// TestStartTimeout: a daemon that never serves is stopped, with ETIMEDOUT.
func TestStartTimeout(t *testing.T) {
	_, err := start(t, "hang", 300*time.Millisecond)
	if !errors.Is(err, unix.ETIMEDOUT) || !strings.Contains(err.Error(), "not ready yet") {
		t.Fatalf("error %v", err)
	}
}

// TestNotify: READY=1 reaches the socket systemd names; without one,
// Notify says nothing was sent.
func TestNotify(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if sent, err := Notify(daemon.SdNotifyReady); sent || err != nil {
		t.Fatalf("no socket: sent %v, %v", sent, err)
	}
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	if sent, err := Notify(daemon.SdNotifyReady); !sent || err != nil {
		t.Fatalf("sent %v, %v", sent, err)
	}
	buf := make([]byte, 64)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := conn.Read(buf)
	if err != nil || string(buf[:n]) != "READY=1" {
		t.Fatalf("got %q, %v", buf[:n], err)
	}
}

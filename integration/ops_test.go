package integration

// Operating phxmount: the mount(8) helper, readiness through sd_notify,
// SIGHUP, the metrics endpoint, --version and --log-format, and doctor's
// exit status. scripts/acceptance.sh does the same through an installed
// tree, mount(8) and /etc/fstab.

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector/nvidia"
)

// daemonPid is the pid of the phxmount that serves mnt (0: none).
func daemonPid(mnt string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(string(b), "\x00")
		if err == nil && len(args) > 2 && filepath.Base(args[0]) == "phxmount" && args[len(args)-2] == mnt {
			return pid
		}
	}
	return 0
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestMountHelper: run as mount.fuse.phxmount with the arguments mount(8)
// gives, phxmount checks them, starts the daemon in its own session and
// returns once the mount serves; mount(8)'s and systemd's options are
// consumed; -f mounts nothing; a bad option is one line and status 2; a
// daemon that fails says why, status 1; umount ends the daemon.
func TestMountHelper(t *testing.T) {
	requireMountEnv(t)
	c := newMountConfig(t, nil)
	helper := filepath.Join(t.TempDir(), "mount.fuse.phxmount")
	if err := os.Symlink(phxmountBin(t), helper); err != nil {
		t.Fatal(err)
	}
	data := writePattern(t, filepath.Join(c.backing, "f"), 3<<20+11, 0644)
	log := filepath.Join(t.TempDir(), "phxmount.log")
	run := func(args ...string) (int, string) {
		out, err := exec.Command(helper, args...).CombinedOutput()
		return exitCode(err), string(out)
	}
	if code, out := run(c.backing, c.mountpoint, "-f", "-o", "vendor=emu,nofail"); code != 0 || out != "" || isMounted(c.mountpoint) {
		t.Fatalf("-f: %d %q, mounted %v", code, out, isMounted(c.mountpoint))
	}
	if code, out := run(c.backing, c.mountpoint, "-o", "vendor=emu,frobnicate"); code != 2 || strings.Count(out, "\n") != 1 || !strings.Contains(out, "frobnicate") {
		t.Errorf("bad option: %d %q", code, out)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	if code, out := run(c.backing, c.mountpoint, "-o", "vendor=emu,metrics="+busy.Addr().String()); code != 1 || !strings.Contains(out, "metrics") || isMounted(c.mountpoint) {
		t.Errorf("a daemon that cannot start: %d %q", code, out)
	}
	opts := "vendor=emu,rw,nofail,_netdev,users,nosuid,nodev,noexec,x-systemd.automount,log_file=" + log
	if code, out := run(c.backing, c.mountpoint, "-n", "-o", opts, "-t", "fuse.phxmount"); code != 0 || out != "" {
		t.Fatalf("mount: %d %q\n%s", code, out, readLog(log))
	}
	pid := daemonPid(c.mountpoint)
	t.Cleanup(func() {
		if isMounted(c.mountpoint) {
			unix.Unmount(c.mountpoint, unix.MNT_DETACH)
		}
	})
	if sid, _ := unix.Getsid(pid); pid == 0 || sid != pid {
		t.Errorf("daemon %d is not in a session of its own (sid %d)", pid, sid)
	}
	mustEqualFile(t, filepath.Join(c.mountpoint, "f"), data)
	if m := mountOptions(t, c.mountpoint); !strings.Contains(m, "nosuid") || strings.Contains(m, "nofail") || strings.Contains(m, "_netdev") {
		t.Errorf("mount options %q: want nosuid, and no mount(8) option", m)
	}
	if err := unix.Unmount(c.mountpoint, 0); err != nil {
		t.Fatal(err)
	}
	if !waitFor(10*time.Second, func() bool { return unix.Kill(pid, 0) != nil }) {
		t.Fatalf("daemon %d still runs after umount", pid)
	}
	if l := readLog(log); !strings.Contains(l, "mounted;") || !strings.Contains(l, "was unmounted") {
		t.Errorf("log:\n%s", l)
	}
}

func readLog(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// mountOptions is the mount's per-mount options in /proc/self/mountinfo.
func mountOptions(t *testing.T, mnt string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 5 && f[4] == mnt {
			return f[5] + " " + l
		}
	}
	t.Fatalf("%s not in mountinfo", mnt)
	return ""
}

// TestSdNotify: under a Type=notify unit (NOTIFY_SOCKET), the daemon sends
// READY=1 once the mount serves (phxmount wait agrees at that moment), and
// STOPPING=1 when told to stop.
func TestSdNotify(t *testing.T) {
	requireMountEnv(t)
	c := newMountConfig(t, nil)
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	bin := phxmountBin(t)
	cmd := exec.Command(bin, "--vendor", "emu", c.backing, c.mountpoint)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		if isMounted(c.mountpoint) {
			unix.Unmount(c.mountpoint, unix.MNT_DETACH)
		}
	}()
	msg := func() string {
		buf := make([]byte, 4096)
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		return string(buf[:n])
	}
	ready := msg()
	if out, err := exec.Command(bin, "wait", "--timeout", "0.05", c.mountpoint).CombinedOutput(); err != nil {
		t.Errorf("READY=1 came before the mount served: %s", out)
	}
	if !strings.HasPrefix(ready, "READY=1\n") || !strings.Contains(ready, "STATUS=serving "+c.backing+" on "+c.mountpoint) {
		t.Errorf("first notification %q", ready)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if stop := msg(); stop != "STOPPING=1" {
		t.Errorf("at SIGTERM: %q", stop)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("exit: %v", err)
	}
}

// TestSIGHUP: SIGHUP never ends the mount: with --log-file it reopens the
// log (moved away as logrotate does), without one it says so and goes on.
// (With --log-file, startDaemon waits its 5 s for "mounted;" on stderr.)
func TestSIGHUP(t *testing.T) {
	log := filepath.Join(t.TempDir(), "p.log")
	for _, withFile := range []bool{true, false} {
		args := []string{"--vendor", "emu"}
		if withFile {
			args = append(args, "--log-file", log)
		}
		d := startDaemon(t, withArgs(args...))
		data := writePattern(t, filepath.Join(d.Backing, "f"), 1<<20, 0644)
		if withFile {
			os.Rename(log, log+".1")
		}
		want, where := "SIGHUP: no --log-file to reopen; still serving", d.Stderr
		if withFile {
			want, where = "SIGHUP: reopened the log file "+log, func() string { return readLog(log) }
		}
		for i := 1; i <= 3; i++ { // one at a time: signals pending together merge
			d.Signal(syscall.SIGHUP)
			if !waitFor(10*time.Second, func() bool { return strings.Count(where(), want) == i }) {
				t.Fatalf("log file %v: no %d x %q in:\n%s", withFile, i, want, where())
			}
		}
		if withFile && (!strings.Contains(readLog(log+".1"), "mounted;") || d.Stderr() != "") {
			t.Errorf("the log before SIGHUP %q; stderr %q", readLog(log+".1"), d.Stderr())
		}
		mustEqualFile(t, filepath.Join(d.Mnt, "f"), data)
		d.stop(t)
		if code, _ := d.WaitExit(time.Second); code != 0 {
			t.Errorf("exit status %d", code)
		}
	}
}

// TestMetricsEndpoint: --metrics serves Prometheus text whose READ byte
// counter moves by exactly the bytes a READ ioctl moved, with the ioctl
// in the latency histogram and the bytes under the transport.
func TestMetricsEndpoint(t *testing.T) {
	d, data, path := startEmuFile(t, 2<<20+5, "--metrics", "127.0.0.1:0", "--log-format", "json")
	m := regexp.MustCompile(`metrics: serving (http://127\.0\.0\.1:\d+/metrics)`).FindStringSubmatch(d.Stderr())
	if m == nil {
		t.Fatalf("no metrics URL in the log:\n%s", d.Stderr())
	}
	for _, l := range strings.Split(strings.TrimSpace(d.Stderr()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil || rec["msg"] == nil {
			t.Errorf("--log-format json: not a JSON record: %q", l)
		}
	}
	f, mem, buf := openRegistered(t, path, 4<<20)
	before := scrapeMetrics(t, m[1])
	n, err := f.Read(buf, 0, int64(len(data)), 0)
	if err != nil || n != int64(len(data)) || string(mem.Bytes()[:n]) != string(data) {
		t.Fatalf("READ = %d, %v", n, err)
	}
	after := scrapeMetrics(t, m[1])
	for _, c := range []struct {
		name string
		want float64
	}{
		{"phxmount_ioctl_bytes_read_total", float64(n)},
		{`phxmount_transport_bytes_total{direction="read",transport="host"}`, float64(n)},
		{`phxmount_ioctl_duration_seconds_count{command="read"}`, 1},
		{"phxmount_ioctl_calls_total", 1},
		{"phxmount_buffers_live", 0},
	} {
		if got := after[c.name] - before[c.name]; got != c.want {
			t.Errorf("%s moved by %v, want %v", c.name, got, c.want)
		}
	}

	// The requests a program blocks in are timed: an open and a close
	// are an OPEN, a FLUSH and (asynchronously) a RELEASE.
	of, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	of.Close()
	for _, r := range []string{"open", "flush", "release"} {
		name := `phxmount_request_duration_seconds_count{request="` + r + `"}`
		var got float64
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if got = scrapeMetrics(t, m[1])[name] - after[name]; got >= 1 {
				break
			}
		}
		if got < 1 {
			t.Errorf("%s moved by %v after an open and a close, want at least 1", name, got)
		}
	}
}

// TestMetricsLoopbackByDefault: --metrics :PORT (no host) listens on
// 127.0.0.1 only and says so in the log; the endpoint has no
// authentication.
func TestMetricsLoopbackByDefault(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu", "--metrics", ":0"))
	m := regexp.MustCompile(`metrics: serving (http://127\.0\.0\.1:(\d+)/metrics) \(--metrics :0: bound 127\.0\.0\.1:\d+, loopback only\)`).FindStringSubmatch(d.Stderr())
	if m == nil {
		t.Fatalf("no loopback metrics line in the log:\n%s", d.Stderr())
	}
	if got := scrapeMetrics(t, m[1]); len(got) == 0 {
		t.Errorf("%s: no samples", m[1])
	}
	if c, err := net.Dial("tcp6", "[::1]:"+m[2]); err == nil {
		c.Close()
		t.Errorf("--metrics :0 also listens on [::1]:%s", m[2])
	}
}

// scrapeMetrics fetches the endpoint: each sample by its name and labels.
func scrapeMetrics(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("content type %q", ct)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 8<<20))
	for sc.Scan() {
		l := sc.Text()
		if i := strings.LastIndexByte(l, ' '); i > 0 && !strings.HasPrefix(l, "#") {
			v, err := strconv.ParseFloat(l[i+1:], 64)
			if err == nil {
				out[l[:i]] = v
			}
		}
	}
	return out
}

// TestVersion: --version prints the version, the commit and the build,
// and exits 0 without mounting.
func TestVersion(t *testing.T) {
	out, err := exec.Command(phxmountBin(t), "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^phxmount \S+\ncommit: \S+\n(date: .*\n)?module: \S+\ngo: go1\.\d+`).Match(out) {
		t.Errorf("--version:\n%s", out)
	}
}

// TestDoctorExitStatus: doctor fails (1) when the path asked for cannot
// work here: --vendor nvidia without a GPU, --passthrough on where it is
// unavailable; --json is the same report as JSON.
func TestDoctorExitStatus(t *testing.T) {
	requireMountEnv(t)
	bin := phxmountBin(t)
	doc := func(args ...string) (int, string) {
		out, err := exec.Command(bin, append([]string{"doctor"}, args...)...).Output()
		return exitCode(err), string(out)
	}
	gpus := 0
	if c, err := nvidia.Open(); err == nil {
		ds, _ := c.Devices()
		gpus = len(ds)
		c.Close()
	}
	code, out := doc("--vendor", "nvidia")
	if (gpus == 0) != (code == 1) || (gpus == 0 && !strings.Contains(out, "FAIL libcuda")) {
		t.Errorf("--vendor nvidia with %d GPUs: exit %d\n%s", gpus, code, out)
	}
	code, out = doc("--json", "--passthrough", "on", "--vendor", "emu")
	var r struct {
		OK       bool
		Asked    map[string]string
		Missing  []string
		Findings []struct {
			What         string
			OK, Required bool
		}
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	ptOK := false
	for _, f := range r.Findings {
		if f.What == "FUSE passthrough" {
			ptOK = f.OK
			if !f.Required {
				t.Errorf("--passthrough on: passthrough is not required")
			}
		}
	}
	if r.OK != ptOK || (code == 0) != ptOK || r.Asked["passthrough"] != "on" || r.Asked["vendor"] != "emu" || (!ptOK && r.Missing[0] != "FUSE passthrough") {
		t.Errorf("--passthrough on, passthrough here %v: exit %d, report %+v", ptOK, code, r)
	}
	if code, _ := doc("--vendor", "amd"); code != 2 {
		t.Errorf("--vendor amd: exit %d, want 2", code)
	}
}

// TestHelperSyslog: a daemon the mount helper started without log_file=
// has no terminal once it serves, and logs to syslog (/dev/log). Where no
// syslog daemon owns /dev/log, the test listens there itself.
func TestHelperSyslog(t *testing.T) {
	requireMountEnv(t)
	if _, err := os.Lstat("/dev/log"); err == nil {
		t.Log("/dev/log belongs to this machine's syslog: the messages are not checked")
		return
	}
	sock, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: "/dev/log", Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove("/dev/log")
	defer sock.Close()
	c := newMountConfig(t, nil)
	helper := filepath.Join(t.TempDir(), "mount.fuse.phxmount")
	if err := os.Symlink(phxmountBin(t), helper); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(helper, c.backing, c.mountpoint, "-o", "vendor=emu").CombinedOutput(); err != nil || len(out) != 0 {
		t.Fatalf("mount: %v %q", err, out)
	}
	defer unix.Unmount(c.mountpoint, unix.MNT_DETACH)
	var got []string
	buf := make([]byte, 64<<10)
	for !strings.Contains(strings.Join(got, "\n"), "mounted;") {
		sock.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := sock.Read(buf)
		if err != nil {
			t.Fatalf("no \"mounted;\" in syslog: %v; got:\n%s", err, strings.Join(got, "\n"))
		}
		got = append(got, string(buf[:n]))
	}
	if !strings.Contains(got[0], "phxmount[") {
		t.Errorf("syslog message %q: want the tag phxmount[PID]", got[0])
	}
}

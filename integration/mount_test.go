package integration

// Helpers shared by every integration test: mounts, comparing a mount with
// its backing directory, other users.
//
// API (stable; other test files build on it):
//
//	requireMountEnv(t)                  skip (printing why) unless root with /dev/fuse
//	phxmountBin(t) string               path of a phxmount binary built from this tree
//	mountOverlay(t, opts...) (backing, mnt string)
//	                                    start `phxmount` as a subprocess on a fresh
//	                                    backing dir and mountpoint, wait for the mount,
//	                                    unmount and stop it in t.Cleanup (even when the
//	                                    test fails or the daemon died)
//	startDaemon(t, opts...) *daemon     the same, returning the daemon (for signal and
//	                                    crash tests): d.Backing, d.Mnt, d.Cmd, d.Stderr(),
//	                                    d.Signal(sig), d.WaitExit(timeout), d.Mounted(),
//	                                    d.WaitLog(substring, timeout); it returns once
//	                                    `phxmount wait` says the mount is ready
//	mountInProcess(t, fusefs.Options, opts...) (backing, mnt string, fsys *fusefs.FS)
//	                                    the overlay served by the test process itself
//	                                    (a Control test double can be plugged in)
//	startEmuFile(t, size, args...) (d *daemon, data []byte, path string)
//	                                    startDaemon with --vendor emu and args, its
//	                                    backing directory holding "f": size bytes of
//	                                    writePattern (data); path is f through the mount
//	eachPassthrough(t, func(t, mode string, d *daemon))
//	                                    subtests passthrough=auto and passthrough=off,
//	                                    each on a fresh startDaemon(--passthrough MODE)
//	runCmd(t, name, args...) string     run a command (60 s limit), failing the test
//	                                    with its output when it fails
//	needTool(t, name)                   skip unless the tool is installed
//
// Options for mountOverlay/startDaemon/mountInProcess:
//
//	withArgs("-o", "allow_other", "--passthrough", "off")  extra phxmount arguments
//	withBacking(dir)                    use an existing backing directory
//	withMountpoint(dir)                 use an existing mountpoint directory
//	withEnv("PHX_ENGINE=sync")          extra environment for the daemon
//
// Mounts live under t.TempDir(); the backing directory is world-traversable
// (0755) so that tests can drop privileges. The binary is bin/phxmount when
// it is newer than every Go source of the tree, otherwise it is built once
// per test run into a temporary directory.
//
// Comparing the mount with its backing directory:
//
//	compareTrees(t, backing, mnt) int   the same names, stats, bytes and link targets,
//	                                    side by side; returns the entries compared
//	sameStat(t, what, b, m)             the stat fields the mount reports exactly
//	statOf(t, path) unix.Stat_t         lstat, failing the test on error
//	mustEqualFile(t, path, want)        the file holds exactly want
//	pattern(n, seed) []byte             deterministic test data
//
// Other users:
//
//	nobody                              uid and gid 65534
//	asUser(uid) *syscall.Credential     uid, gid uid, no supplementary groups
//	asNobody(script, env...) (string, error)
//	                                    a shell script as nobody, umask 027
//
// The client side (ioctl_test.go): writePattern, emuBuffer, register,
// openClient, openRegistered (open read-only and register an emulated
// buffer), phxInfo, infoCounter, waitFor, and startChild/startChildTest (the
// test binary re-executed as another client, TestIoctlHelperChild).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/fusefs"
	"github.com/phxmount/phxmount/internal/procfs"
)

// requireMountEnv skips the test unless it can mount FUSE file systems.
func requireMountEnv(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("integration: skipped: needs root to mount FUSE (run as root, e.g. make integration as root)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("integration: skipped: no /dev/fuse (%v)", err)
	}
}

// repoRoot is the directory holding go.mod.
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("integration: go.mod not found above the working directory")
		}
		dir = parent
	}
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// phxmountBin returns a phxmount binary built from this tree.
func phxmountBin(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		root := repoRoot(t)
		if p := os.Getenv("PHXMOUNT_BIN"); p != "" {
			binPath = p
			return
		}
		cand := filepath.Join(root, "bin", "phxmount")
		if st, err := os.Stat(cand); err == nil && !sourcesNewerThan(root, st.ModTime()) {
			binPath = cand
			return
		}
		dir, err := os.MkdirTemp("", "phxmount-bin-")
		if err != nil {
			binErr = err
			return
		}
		out := filepath.Join(dir, "phxmount")
		cmd := exec.Command("go", "build", "-o", out, "./cmd/phxmount")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/phxmount: %v\n%s", err, b)
			return
		}
		binPath = out
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// sourcesNewerThan reports whether a non-test Go file of the tree (or
// go.mod/go.sum) changed after mt.
func sourcesNewerThan(root string, mt time.Time) bool {
	newer := false
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || newer {
			return filepath.SkipDir
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (strings.HasPrefix(name, ".") || name == "bin" || name == "module" || name == "python") {
				return filepath.SkipDir
			}
			return nil
		}
		if (strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go")) || name == "go.mod" || name == "go.sum" {
			if info, err := d.Info(); err == nil && info.ModTime().After(mt) {
				newer = true
			}
		}
		return nil
	})
	return newer
}

type mountConfig struct {
	args       []string
	backing    string
	mountpoint string
	env        []string
}

// mountOption configures mountOverlay, startDaemon and mountInProcess.
type mountOption func(*mountConfig)

// withArgs adds phxmount arguments (placed before BACKING MOUNTPOINT).
func withArgs(args ...string) mountOption {
	return func(c *mountConfig) { c.args = append(c.args, args...) }
}

// withBacking uses an existing backing directory.
func withBacking(dir string) mountOption { return func(c *mountConfig) { c.backing = dir } }

// withMountpoint uses an existing mountpoint directory.
func withMountpoint(dir string) mountOption { return func(c *mountConfig) { c.mountpoint = dir } }

// withEnv adds KEY=VALUE entries to the daemon's environment.
func withEnv(kv ...string) mountOption { return func(c *mountConfig) { c.env = append(c.env, kv...) } }

func newMountConfig(t testing.TB, opts []mountOption) *mountConfig {
	t.Helper()
	c := &mountConfig{}
	for _, o := range opts {
		o(c)
	}
	if c.backing == "" || c.mountpoint == "" {
		base := t.TempDir()
		// t.TempDir's parent is 0700: open both for tests that drop privileges.
		for _, d := range []string{filepath.Dir(base), base} {
			if err := os.Chmod(d, 0755); err != nil {
				t.Fatal(err)
			}
		}
		if c.backing == "" {
			c.backing = filepath.Join(base, "backing")
			mustMkdir(t, c.backing)
		}
		if c.mountpoint == "" {
			c.mountpoint = filepath.Join(base, "mnt")
			mustMkdir(t, c.mountpoint)
		}
	}
	return c
}

func mustMkdir(t testing.TB, dir string) {
	t.Helper()
	if err := os.Mkdir(dir, 0755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0755); err != nil {
		t.Fatal(err)
	}
}

// daemon is a phxmount subprocess.
type daemon struct {
	Backing, Mnt string
	Cmd          *exec.Cmd
	stderr       *syncBuffer
	exited       chan struct{}
	exitErr      error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Stderr is what the daemon has logged so far.
func (d *daemon) Stderr() string { return d.stderr.String() }

// Signal sends sig to the daemon.
func (d *daemon) Signal(sig os.Signal) error { return d.Cmd.Process.Signal(sig) }

// WaitExit waits for the daemon to exit and returns its exit status (-1
// for a signal, or on timeout with ok false).
func (d *daemon) WaitExit(timeout time.Duration) (code int, ok bool) {
	select {
	case <-d.exited:
		return d.Cmd.ProcessState.ExitCode(), true
	case <-time.After(timeout):
		return -1, false
	}
}

// Mounted says whether the mountpoint is a FUSE mount right now.
func (d *daemon) Mounted() bool { return isMounted(d.Mnt) }

// startDaemon starts phxmount and waits until the mount is up.
func startDaemon(t testing.TB, opts ...mountOption) *daemon {
	t.Helper()
	requireMountEnv(t)
	bin := phxmountBin(t)
	c := newMountConfig(t, opts)
	args := append(append([]string{}, c.args...), c.backing, c.mountpoint)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), c.env...)
	d := &daemon{Backing: c.backing, Mnt: c.mountpoint, Cmd: cmd, stderr: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout = d.stderr
	cmd.Stderr = d.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		d.exitErr = cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() { d.stop(t) })
	// phxmount wait, the one readiness check; the daemon may die first.
	ready := make(chan []byte, 1)
	go func() {
		out, _ := exec.Command(bin, "wait", "--timeout", "15", c.mountpoint).CombinedOutput()
		ready <- out
	}()
	select {
	case out := <-ready:
		if len(out) > 0 {
			t.Fatalf("phxmount %s: %s\n%s", strings.Join(args, " "), out, d.Stderr())
		}
	case <-d.exited:
		t.Fatalf("phxmount %s exited before mounting (%v):\n%s", strings.Join(args, " "), d.exitErr, d.Stderr())
	}
	// The daemon logs "mounted;" before it answers as ready; the pipe to
	// this process may still carry it.
	d.WaitLog("mounted;", 5*time.Second)
	return d
}

// WaitLog waits until the daemon's log contains s.
func (d *daemon) WaitLog(s string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for !strings.Contains(d.Stderr(), s) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// stop unmounts and ends the daemon, whatever state it is in.
func (d *daemon) stop(t testing.TB) {
	select {
	case <-d.exited:
	default:
		d.Cmd.Process.Signal(syscall.SIGTERM)
		if _, ok := d.WaitExit(10 * time.Second); !ok {
			t.Logf("phxmount did not exit 10 s after SIGTERM; killing it")
			d.Cmd.Process.Kill()
			d.WaitExit(5 * time.Second)
		}
	}
	if isMounted(d.Mnt) {
		unix.Unmount(d.Mnt, unix.MNT_DETACH)
	}
	if t.Failed() {
		t.Logf("phxmount log:\n%s", d.Stderr())
	}
}

// startEmuFile starts a daemon on the emulated device (--vendor emu, then
// args) whose backing directory holds "f": size bytes of writePattern. It
// returns the daemon, f's bytes and f's path through the mount.
func startEmuFile(t testing.TB, size int64, args ...string) (d *daemon, data []byte, path string) {
	t.Helper()
	d = startDaemon(t, withArgs(append([]string{"--vendor", "emu"}, args...)...))
	data = writePattern(t, filepath.Join(d.Backing, "f"), size, 0644)
	return d, data, filepath.Join(d.Mnt, "f")
}

// eachPassthrough runs fn as the subtests passthrough=auto and
// passthrough=off, each on a fresh daemon started with --passthrough MODE.
func eachPassthrough(t *testing.T, fn func(t *testing.T, mode string, d *daemon)) {
	for _, mode := range []string{"auto", "off"} {
		t.Run("passthrough="+mode, func(t *testing.T) {
			fn(t, mode, startDaemon(t, withArgs("--passthrough", mode)))
		})
	}
}

// mountOverlay mounts the overlay with the phxmount binary; see the API at
// the top of this file.
func mountOverlay(t testing.TB, opts ...mountOption) (backing, mnt string) {
	t.Helper()
	d := startDaemon(t, opts...)
	return d.Backing, d.Mnt
}

// mountInProcess serves the overlay from the test process. Only the
// backing/mountpoint options apply.
func mountInProcess(t testing.TB, o fusefs.Options, opts ...mountOption) (backing, mnt string, fsys *fusefs.FS) {
	t.Helper()
	requireMountEnv(t)
	c := newMountConfig(t, opts)
	fsys, err := fusefs.Mount(c.backing, c.mountpoint, o)
	if err != nil {
		t.Fatalf("fusefs.Mount: %v", err)
	}
	t.Cleanup(func() {
		if err := fsys.Unmount(); err != nil {
			t.Logf("unmount %s: %v", c.mountpoint, err)
		}
		done := make(chan struct{})
		go func() { fsys.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Logf("in-process server did not stop 10 s after unmount")
		}
	})
	return c.backing, c.mountpoint, fsys
}

// isMounted says whether dir is a FUSE mount point (per mountinfo).
func isMounted(dir string) bool {
	m, ok := procfs.MountAt(dir)
	return ok && strings.HasPrefix(m.FSType, "fuse")
}

// runCmd runs a command with a timeout and returns its combined output,
// failing the test when it fails.
func runCmd(t testing.TB, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// statOf lstats p.
func statOf(t testing.TB, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	return st
}

// sameStat compares what the mount must report exactly like the backing
// file: inode, size, mode, links, owner, group and modification time.
func sameStat(t testing.TB, what string, b, m unix.Stat_t) {
	t.Helper()
	if b.Ino != m.Ino || b.Size != m.Size || b.Mode != m.Mode || b.Nlink != m.Nlink ||
		b.Uid != m.Uid || b.Gid != m.Gid || b.Mtim != m.Mtim {
		t.Errorf("%s: stat differs:\n backing ino=%d size=%d mode=%o nlink=%d uid=%d gid=%d mtime=%v\n mount   ino=%d size=%d mode=%o nlink=%d uid=%d gid=%d mtime=%v",
			what, b.Ino, b.Size, b.Mode, b.Nlink, b.Uid, b.Gid, b.Mtim,
			m.Ino, m.Size, m.Mode, m.Nlink, m.Uid, m.Gid, m.Mtim)
	}
}

func fileSum(t testing.TB, p string) [32]byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatalf("open %s: %v", p, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

// compareTrees walks the backing directory and the mount side by side:
// the same names, the same stats, the same bytes and link targets.
// It returns the number of entries compared.
func compareTrees(t testing.TB, backing, mnt string) int {
	t.Helper()
	n := 0
	var walk func(rel string)
	walk = func(rel string) {
		bp, mp := filepath.Join(backing, rel), filepath.Join(mnt, rel)
		bst, mst := statOf(t, bp), statOf(t, mp)
		sameStat(t, rel, bst, mst)
		n++
		switch bst.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			if fileSum(t, bp) != fileSum(t, mp) {
				t.Errorf("%s: contents differ", rel)
			}
		case unix.S_IFLNK:
			bl, _ := os.Readlink(bp)
			ml, err := os.Readlink(mp)
			if err != nil || bl != ml {
				t.Errorf("%s: link %q through the mount, %q on backing (%v)", rel, ml, bl, err)
			}
		case unix.S_IFDIR:
			bn, mn := dirNames(t, bp), dirNames(t, mp)
			if !equalStrings(bn, mn) {
				t.Errorf("%s: entries differ:\n backing %v\n mount   %v", rel, bn, mn)
				return
			}
			for _, name := range bn {
				walk(filepath.Join(rel, name))
			}
		}
	}
	walk(".")
	return n
}

func dirNames(t testing.TB, dir string) []string {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		t.Fatalf("readdir %s: %v", dir, err)
	}
	sort.Strings(names)
	return names
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// pattern is deterministic test data: seed selects the sequence.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

func mustEqualFile(t testing.TB, p string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes differ from the %d expected", p, len(got), len(want))
	}
}

func needTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("skipped: %s not installed (Debian package %s)", name, map[string]string{"getfattr": "attr", "setfattr": "attr", "python3": "python3"}[name])
	}
}

const nobody = 65534

// asUser is the credential of uid with gid uid and no supplementary groups.
func asUser(uid uint32) *syscall.Credential {
	return &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}
}

// asNobody runs a shell script as uid/gid 65534 (nobody/nogroup) with
// umask 027, returning its output and error.
func asNobody(script string, env ...string) (string, error) {
	cmd := exec.Command("sh", "-c", "umask 027; "+script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: asUser(nobody)}
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "LC_ALL=C"}, env...)
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	return string(out), err
}

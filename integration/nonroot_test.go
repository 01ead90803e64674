package integration

// The non-root story (docs/install.md, "Without root"): an ordinary user
// mounts with the setuid fusermount3 and gets the classic path, reads and
// the ioctl path for its own processes; no passthrough, no ownership
// hand-off, only its own uid served; doctor says what is missing.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/phxmount/phxmount/client"
)

// nobodyReads is the mode of the ioctl client TestNonRootMount runs as
// nobody (TestNonRootHelperChild).
const nobodyReads = "nonroot-read"

// TestNonRootMount: as nobody, phxmount mounts through fusermount3 and
// serves reads (classic path, passthrough inactive) and READ ioctls to
// nobody's processes; root, another uid, gets EACCES from the kernel (no
// allow_other); what nobody creates is nobody's; doctor, as nobody, names
// what is missing and fails --passthrough on; fusermount3 -u unmounts.
func TestNonRootMount(t *testing.T) {
	requireMountEnv(t)
	fm, err := exec.LookPath("fusermount3")
	if err != nil {
		t.Skip("fusermount3 not installed (Debian package fuse3; scripts/deps.sh installs it)")
	}
	c := newMountConfig(t, nil)
	bin := strings.TrimSuffix(c.backing, "backing") + "phxmount" // beside backing and mnt, which nobody can reach
	if b, err := os.ReadFile(phxmountBin(t)); err != nil || os.WriteFile(bin, b, 0755) != nil {
		t.Fatalf("copy phxmount for nobody: %v", err)
	}
	openDevFuse(t, bin)
	data := writePattern(t, c.backing+"/data.bin", 1<<20+77, 0644)
	for _, p := range []string{c.backing, c.mountpoint, c.backing + "/data.bin"} {
		if err := os.Chown(p, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	d := startNonRoot(t, bin, "--vendor", "emu", c.backing, c.mountpoint)
	defer func() {
		if isMounted(c.mountpoint) {
			syscall.Unmount(c.mountpoint, syscall.MNT_DETACH)
		}
	}()
	if out, err := asNobody(bin+" wait --timeout 15 "+c.mountpoint, "PATH=/usr/bin:/bin"); err != nil {
		t.Fatalf("not mounted as nobody: %v %s\n%s", err, out, d.Stderr())
	}
	if l := d.Stderr(); !strings.Contains(l, "mounted; passthrough inactive") || !strings.Contains(l, "user_id=65534") && !strings.Contains(mountOptions(t, c.mountpoint), "user_id=65534") {
		t.Errorf("log / mount: %s", l)
	}
	checkNonRootAccess(t, c.backing, c.mountpoint, data)
	ch := startChildTest(t, "TestNonRootHelperChild", asUser(nobody), nobodyReads, c.mountpoint+"/data.bin")
	if got := ch.expect(t, ""); got != fmt.Sprintf("read %d true", len(data)) {
		rest := []string{got}
		for l := range ch.lines {
			rest = append(rest, l)
		}
		t.Errorf("READ ioctl as nobody: %q", rest)
	}
	checkNonRootDoctor(t, bin)
	if out, err := asNobody(fm + " -u " + c.mountpoint); err != nil {
		t.Fatalf("fusermount3 -u: %v %s", err, out)
	}
	if code, ok := d.WaitExit(10 * time.Second); !ok || code != 0 {
		t.Errorf("after fusermount3 -u: exited %v, status %d\n%s", ok, code, d.Stderr())
	}
}

// startNonRoot starts phxmount as nobody.
func startNonRoot(t *testing.T, bin string, args ...string) *daemon {
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: asUser(nobody)}
	cmd.Env = []string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin", "LC_ALL=C"}
	cmd.Dir = "/"
	d := &daemon{Mnt: args[len(args)-1], Cmd: cmd, stderr: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = d.stderr, d.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		d.exitErr = cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() { d.stop(t) })
	return d
}

// checkNonRootAccess: nobody reads byte for byte and owns what it creates;
// root is refused by the kernel (the mount has no allow_other).
func checkNonRootAccess(t *testing.T, backing, mnt string, data []byte) {
	script := "cmp " + backing + "/data.bin " + mnt + "/data.bin && echo hi > " + mnt + "/new && stat -c '%u' " + backing + "/new"
	if out, err := asNobody(script); err != nil || strings.TrimSpace(out) != fmt.Sprint(nobody) {
		t.Errorf("as nobody: %v %q", err, out)
	}
	if _, err := os.ReadFile(mnt + "/data.bin"); !os.IsPermission(err) {
		t.Errorf("root read nobody's mount: %v, want EACCES", err)
	}
}

// checkNonRootDoctor: doctor as nobody says what an ordinary user lacks,
// passes the default path and fails --passthrough on.
func checkNonRootDoctor(t *testing.T, bin string) {
	out, err := asNobody(bin + " doctor --json")
	var r struct {
		OK       bool
		Findings []struct {
			What     string
			OK       bool
			Required bool
			Detail   string
		}
	}
	if err != nil || json.Unmarshal([]byte(out), &r) != nil {
		t.Fatalf("doctor as nobody: %v\n%s", err, out)
	}
	got := map[string]bool{}
	for _, f := range r.Findings {
		got[f.What] = f.OK
	}
	for what, want := range map[string]bool{"/dev/fuse": true, "fusermount3": true, "CAP_SYS_ADMIN": false, "FUSE passthrough": false, "ownership hand-off": false} {
		if ok, seen := got[what]; !seen || ok != want {
			t.Errorf("doctor as nobody: %q ok=%v (reported %v), want ok=%v\n%s", what, ok, seen, want, out)
		}
	}
	if _, seen := got["allow_other"]; !seen || !r.OK {
		t.Errorf("doctor as nobody: no allow_other finding, or the default path fails:\n%s", out)
	}
	if out, err := asNobody(bin + " doctor --passthrough on"); exitCode(err) != 1 || !strings.Contains(out, "FAIL FUSE passthrough") {
		t.Errorf("doctor --passthrough on as nobody: %v\n%s", err, out)
	}
}

// openDevFuse: fusermount3 opens /dev/fuse as the user, so it must be
// mode 0666, as Debian's udev makes it (a machine without udev may leave
// it 0600). With 0600, doctor as nobody fails on it; then the test gives
// /dev/fuse the usual 0666 (and its mode back at the end).
func openDevFuse(t *testing.T, bin string) {
	st, err := os.Stat("/dev/fuse")
	if err != nil {
		t.Fatal(err)
	}
	orig := st.Mode().Perm()
	t.Cleanup(func() { os.Chmod("/dev/fuse", orig) })
	if err := os.Chmod("/dev/fuse", 0600); err != nil {
		t.Fatal(err)
	}
	out, err := asNobody(bin + " doctor")
	if exitCode(err) != 1 || !strings.Contains(out, "FAIL /dev/fuse") || !strings.Contains(out, "permission denied") {
		t.Errorf("doctor as nobody with /dev/fuse 0600: %v\n%s", err, out)
	}
	if err := os.Chmod("/dev/fuse", 0666); err != nil {
		t.Fatal(err)
	}
}

// TestNonRootHelperChild is the ioctl client TestNonRootMount runs as
// nobody: it registers an emulated-device buffer on PHX_CHILD_ARGS (a
// file of the mount), READs the whole file and prints "read N SAME".
func TestNonRootHelperChild(t *testing.T) {
	if os.Getenv("PHX_CHILD") != nobodyReads {
		t.Skip("helper process for TestNonRootMount (runs only when re-executed)")
	}
	path := os.Getenv("PHX_CHILD_ARGS")
	want, err := os.ReadFile(path)
	if err != nil {
		os.Stdout.WriteString("error " + err.Error() + "\n")
		return
	}
	f, err := client.OpenFile(path, os.O_RDONLY)
	if err != nil {
		os.Stdout.WriteString("error " + err.Error() + "\n")
		return
	}
	defer f.Close()
	mem := emuBuffer(t, 0, (int64(len(want))+65535)&^65535)
	buf := register(t, f, mem)
	n, err := f.Read(buf, 0, int64(len(want)), 0)
	fmt.Printf("read %d %v\n", n, err == nil && bytes.Equal(mem.Bytes()[:n], want))
}

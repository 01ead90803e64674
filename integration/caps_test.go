package integration

// The daemon serves with no capability it does not use
// (cmd/phxmount/caps.go): above all not CAP_SYS_RESOURCE, with which its
// writes for a caller would pass disk quotas and reserved blocks.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// capSets reads the capability sets of every thread of pid.
func capSets(t *testing.T, pid int) map[string]map[string]uint64 {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("threads of %d: %v", pid, err)
	}
	out := map[string]map[string]uint64{}
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a thread that ended
		}
		sets := map[string]uint64{}
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.HasPrefix(k, "Cap") {
				n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				if err != nil {
					t.Fatalf("%s: %q", p, l)
				}
				sets[k] = n
			}
		}
		out[p] = sets
	}
	return out
}

// TestDaemonServesWithoutUnneededCapabilities: once mounted, no thread of
// the daemon holds a capability it says it gave up, in any set (the
// bounding set included, so nothing it executes gets them back); the list
// has CAP_SYS_RESOURCE and capabilities this test process holds (so the
// check is not vacuous); and the daemon keeps what it serves with.
func TestDaemonServesWithoutUnneededCapabilities(t *testing.T) {
	d := startDaemon(t)
	m := regexp.MustCompile(`capabilities: serving without (\S+) \(mask (0x[0-9a-f]+)\)`).FindStringSubmatch(d.Stderr())
	if m == nil {
		t.Fatalf("no capabilities line in the log:\n%s", d.Stderr())
	}
	mask, _ := strconv.ParseUint(m[2], 0, 64)
	if mask&(1<<unix.CAP_SYS_RESOURCE) == 0 || !strings.Contains(m[1], "CAP_SYS_RESOURCE") {
		t.Errorf("the daemon keeps CAP_SYS_RESOURCE: %s", m[0])
	}
	self := capSets(t, os.Getpid())
	var ours map[string]uint64
	for _, s := range self {
		ours = s
	}
	if ours["CapBnd"]&mask == 0 {
		t.Fatalf("this test process holds none of %s (bounding %#x): the check would be vacuous", m[1], ours["CapBnd"])
	}
	keep := uint64(1)<<unix.CAP_SYS_ADMIN | 1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID | 1<<unix.CAP_CHOWN | 1<<unix.CAP_FOWNER
	for task, sets := range capSets(t, d.Cmd.Process.Pid) {
		for _, set := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
			if v := sets[set]; v&mask != 0 {
				t.Errorf("%s: %s %#x holds %#x of the capabilities the daemon gave up", task, set, v, v&mask)
			}
		}
		if want := ours["CapPrm"] & keep; sets["CapPrm"]&want != want {
			t.Errorf("%s: CapPrm %#x lacks %#x, which the daemon serves with", task, sets["CapPrm"], want&^sets["CapPrm"])
		}
	}
}

// TestReservedBlocksApplyThroughTheMount: on an ext4 file system with
// reserved blocks, uid 1000's writes through the mount stop at ENOSPC
// where its native writes do, in both passthrough modes: the daemon's
// writes use no reserved block. Two owners of the reserve: root, as
// mkfs.ext4 leaves it (ext4 gives the reserve to a writer whose fsuid is
// its owner's: the daemon's writes must not be uid 0's), and uid 4242
// (root would get them by CAP_SYS_RESOURCE alone).
func TestReservedBlocksApplyThroughTheMount(t *testing.T) {
	requireMountEnv(t)
	for _, tool := range []string{"mkfs.ext4", "tune2fs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipped: %s not installed (Debian package e2fsprogs)", tool)
		}
	}
	for _, owner := range []string{"root", "4242"} {
		t.Run("reserved-for-"+owner, func(t *testing.T) { reservedBlocksApply(t, owner) })
	}
}

func reservedBlocksApply(t *testing.T, owner string) {
	dir := t.TempDir()
	os.Chmod(filepath.Dir(dir), 0755)
	os.Chmod(dir, 0755)
	img, fsdir := filepath.Join(dir, "ext4.img"), filepath.Join(dir, "ext4")
	must(t, os.Mkdir(fsdir, 0755))
	runCmd(t, "truncate", "-s", "48M", img)
	runCmd(t, "mkfs.ext4", "-q", "-m", "25", img)
	if owner != "root" {
		runCmd(t, "tune2fs", "-u", owner, "-g", owner, img)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, fsdir).CombinedOutput(); err != nil {
		t.Skipf("skipped: cannot loop-mount an ext4 image here: %v %s", err, out)
	}
	t.Cleanup(func() { unix.Unmount(fsdir, unix.MNT_DETACH) })
	backing := filepath.Join(fsdir, "b")
	must(t, os.Mkdir(backing, 0777))
	must(t, os.Chmod(backing, 01777))
	var st unix.Statfs_t
	must(t, unix.Statfs(fsdir, &st))
	reserved := int64(st.Bfree-st.Bavail) * st.Bsize
	fill := func(path string, how ...string) (string, int64) {
		t.Helper()
		op := "fill"
		if len(how) > 0 {
			op = how[0]
		}
		got := nsOp(t, &syscall.SysProcAttr{Credential: user1000}, op, path)
		var e string
		var n int64
		if _, err := fmt.Sscanf(got, "%s %d", &e, &n); err != nil {
			t.Fatalf("fill %s: %q", path, got)
		}
		must(t, os.Remove(filepath.Join(backing, filepath.Base(path))))
		unix.Sync()
		return e, n
	}
	nativeErr, native := fill(filepath.Join(backing, "native"))
	if nativeErr != "ENOSPC" {
		t.Fatalf("native fill by uid 1000 ended with %s after %d bytes", nativeErr, native)
	}
	for _, pt := range []string{"off", "auto"} {
		t.Run("passthrough-"+pt, func(t *testing.T) {
			d := startDaemon(t, withBacking(backing), withArgs("--passthrough", pt, "-o", "allow_other"))
			e, n := fill(filepath.Join(d.Mnt, "mount"))
			t.Logf("native: %s after %d bytes; through the mount: %s after %d bytes; reserved %d bytes", nativeErr, native, e, n, reserved)
			if e != "ENOSPC" || n > native+reserved/2 {
				t.Errorf("through the mount: %s after %d bytes, native ENOSPC after %d (the reserve is %d bytes): the daemon wrote into the reserved blocks", e, n, native, reserved)
			}
			if pt != "off" {
				return
			}
			// The WRITE ioctls: the daemon's I/O workers write the bytes.
			e, n = fill(filepath.Join(d.Mnt, "ioctl"), "fill-ioctl")
			t.Logf("by WRITE ioctls: %s after %d bytes", e, n)
			if e != "ENOSPC" || n > native+reserved/2 {
				t.Errorf("by WRITE ioctls: %s after %d bytes, native ENOSPC after %d (the reserve is %d bytes): the daemon wrote into the reserved blocks", e, n, native, reserved)
			}
		})
	}
}

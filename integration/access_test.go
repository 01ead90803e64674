package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

const nobody = 65534

// asNobody runs a shell script as uid/gid 65534 (nobody/nogroup) with
// umask 027, returning its output and error.
func asNobody(script string, env ...string) (string, error) {
	cmd := exec.Command("sh", "-c", "umask 027; "+script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}}
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "LC_ALL=C"}, env...)
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestPermissionsAllowOther: with allow_other, the root daemon grants
// nobody exactly what the backing files grant nobody.
func TestPermissionsAllowOther(t *testing.T) {
	backing, mnt := mountOverlay(t, withArgs("-o", "allow_other"))
	secret := filepath.Join(backing, "secret")
	if err := os.WriteFile(secret, []byte("root only\n"), 0600); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(backing, "public"), []byte("everyone\n"), 0644)
	os.Mkdir(filepath.Join(backing, "shared"), 0777)
	os.Chmod(filepath.Join(backing, "shared"), 0777)

	if out, err := asNobody(`cat "$M/public"`, "M="+mnt); err != nil || out != "everyone\n" {
		t.Fatalf("nobody reading a 0644 file: %q %v", out, err)
	}
	out, err := asNobody(`cat "$M/secret"`, "M="+mnt)
	if err == nil || !strings.Contains(out, "Permission denied") {
		t.Fatalf("nobody read a 0600 root file through the mount: %q %v", out, err)
	}
	for _, script := range []string{
		`echo x > "$M/secret"`,
		`echo x > "$M/newfile"`, // the root is 0755 root
		`rm -f "$M/public"`,
		`chmod 666 "$M/public"`,
		`touch -d 2000-01-01 "$M/public"`,
		`mv "$M/public" "$M/shared/p"`,
	} {
		if out, err := asNobody(script, "M="+mnt); err == nil {
			t.Errorf("nobody: %s succeeded through the mount (%s)", script, out)
		}
	}
	if _, err := os.Stat(filepath.Join(backing, "newfile")); err == nil {
		t.Errorf("nobody created a file in a root 0755 directory")
	}
	// user.* xattrs need write permission on a regular file: refused, and
	// for that reason (a missing setfattr fails here rather than passing).
	if _, err := exec.LookPath("setfattr"); err != nil {
		t.Errorf("setfattr not installed (Debian package attr; scripts/deps.sh installs it): %v", err)
	} else if out, err := asNobody(`setfattr -n user.x -v 1 "$M/public"`, "M="+mnt); err == nil || !strings.Contains(out, "Permission denied") {
		t.Errorf("nobody setting an xattr on root's 0644 file: %v %q, want Permission denied", err, out)
	}
	if _, err := unix.Getxattr(filepath.Join(backing, "public"), "user.x", make([]byte, 16)); err != unix.ENODATA {
		t.Errorf("user.x on the backing file after nobody's setfattr: %v, want ENODATA", err)
	}
	// Creating where nobody may: owned by nobody, mode after its umask.
	if out, err := asNobody(`echo mine > "$M/shared/f" && mkdir "$M/shared/d" && ln -s f "$M/shared/l" && mkfifo "$M/shared/p"`, "M="+mnt); err != nil {
		t.Fatalf("nobody creating in a 0777 directory: %v %s", err, out)
	}
	for name, mode := range map[string]uint32{"f": 0640, "d": 0750, "l": 0777, "p": 0640} {
		st := statOf(t, filepath.Join(backing, "shared", name))
		if st.Uid != nobody || st.Gid != nobody {
			t.Errorf("shared/%s is owned by %d:%d on the backing directory, want %d:%d", name, st.Uid, st.Gid, nobody, nobody)
		}
		if st.Mode&07777 != mode {
			t.Errorf("shared/%s has mode %o, want %o (umask 027)", name, st.Mode&07777, mode)
		}
	}
	compareTrees(t, backing, mnt)
}

// TestWithoutAllowOther: another user cannot use the mount at all.
func TestWithoutAllowOther(t *testing.T) {
	backing, mnt := mountOverlay(t)
	os.WriteFile(filepath.Join(backing, "public"), []byte("everyone\n"), 0644)
	if out, err := asNobody(`cat "$M/public"`, "M="+mnt); err == nil {
		t.Fatalf("nobody used a mount without allow_other: %q", out)
	}
}

// TestReadOnly: -o ro refuses writes with EROFS and keeps reads working.
func TestReadOnly(t *testing.T) {
	backing, mnt := mountOverlay(t, withArgs("-o", "ro"))
	os.WriteFile(filepath.Join(backing, "f"), []byte("data"), 0644)
	mustEqualFile(t, filepath.Join(mnt, "f"), []byte("data"))
	err := os.WriteFile(filepath.Join(mnt, "g"), []byte("x"), 0644)
	if err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("write on a ro mount: %v", err)
	}
	if _, err := os.OpenFile(filepath.Join(mnt, "f"), os.O_WRONLY, 0); err == nil {
		t.Fatalf("open for writing on a ro mount succeeded")
	}
}

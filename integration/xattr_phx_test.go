package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestXattrInfo: getfattr -n user.phx.info on a file and on the mount root
// reports the transport, device, engine and counters; other user.phx.*
// names are ENODATA, and listxattr hides them.
func TestXattrInfo(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu"))
	writePattern(t, filepath.Join(d.Backing, "f"), 123457, 0644)
	for _, p := range []string{filepath.Join(d.Mnt, "f"), d.Mnt} {
		out := runCmd(t, "getfattr", "--only-values", "-n", "user.phx.info", p)
		for _, want := range []string{"transport=host\n", "vendor=emu\n", "page_size=65536\n", "buffers_live=0\n", "engine="} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: user.phx.info lacks %q:\n%s", p, want, out)
			}
		}
		// The daemon wires the overlay's passthrough state into the control.
		if !strings.Contains(out, "passthrough=active\n") && !strings.Contains(out, "passthrough=inactive\n") {
			t.Errorf("%s: user.phx.info does not report the passthrough state:\n%s", p, out)
		}
	}
	if info := phxInfo(t, filepath.Join(d.Mnt, "f")); info["size"] != "123457" || info["path"] != "f" {
		t.Errorf("file info: %v", info)
	}
	if _, err := unix.Getxattr(filepath.Join(d.Mnt, "f"), "user.phx.nothing", make([]byte, 100)); err != unix.ENODATA {
		t.Errorf("unknown user.phx name: %v, want ENODATA", err)
	}
	if err := unix.Setxattr(filepath.Join(d.Mnt, "f"), "user.phx.info", []byte("x"), 0); err != unix.ENOTSUP {
		t.Errorf("setting user.phx.info: %v, want ENOTSUP", err)
	}
	if out := runCmd(t, "getfattr", "-d", "-m", "-", filepath.Join(d.Mnt, "f")); strings.Contains(out, "user.phx") {
		t.Errorf("listxattr shows a user.phx name:\n%s", out)
	}
}

// TestXattrLoad: a process registers a buffer and hands its token to a
// shell script, which loads files with setfattr; bad values, unknown
// tokens, out-of-bounds loads and files the caller may not read are refused
// and move no byte.
func TestXattrLoad(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu", "-o", "allow_other"))
	data := writePattern(t, filepath.Join(d.Backing, "f"), 3<<20+5, 0644)
	secret := filepath.Join(d.Backing, "secret")
	writePattern(t, secret, 1<<20, 0622) // nobody may write (so set xattrs) but not read
	f := openClient(t, filepath.Join(d.Mnt, "f"), unix.O_RDONLY)
	m := emuBuffer(t, 0, 4<<20)
	b := register(t, f, m)
	tok := b.Token.String()
	mf := filepath.Join(d.Mnt, "f")

	setf := func(v string, file string) (string, error) {
		out, err := exec.Command("setfattr", "-n", "user.phx.load", "-v", v, file).CombinedOutput()
		return string(out), err
	}
	for _, c := range []struct{ v, want string }{
		{"token=" + tok, "Invalid argument"},
		{"token=" + tok + ",offset=0,color=red", "Invalid argument"},
		{"token=" + strings.Repeat("0", 32) + ",offset=0", "Key was rejected"},
		{"token=" + tok + ",offset=0x400000", "Bad address"}, // at the end: nothing fits
		{"token=" + tok + ",offset=1048576,length=3145733", "Bad address"},
		{"token=" + tok + ",offset=0,length=4000000", "Invalid argument"}, // past EOF
	} {
		out, err := setf(c.v, mf)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("setfattr %q: %v %q, want %q", c.v, err, out, c.want)
		}
	}
	// Nobody may set xattrs on the 0622 file but not read it.
	out, err := asNobody("setfattr -n user.phx.load -v token=" + tok + ",offset=0 " + filepath.Join(d.Mnt, "secret"))
	if err == nil || !strings.Contains(out, "Permission denied") {
		t.Errorf("nobody loading a file it may not read: %v %q", err, out)
	}
	if !allBytes(m.Bytes(), 0xA5) {
		t.Fatalf("a refused load moved bytes")
	}
	// The load itself, run by another user (nobody) holding the token.
	out, err = asNobody("setfattr -n user.phx.load -v token=" + tok + ",offset=4096 " + mf)
	if err != nil {
		// nobody lacks write permission on the 0644 file: the kernel
		// refuses user.* xattrs then; root does it.
		if out2, err2 := setf("token="+tok+",offset=4096", mf); err2 != nil {
			t.Fatalf("setfattr load: %v %s / %s", err2, out, out2)
		}
	}
	if !bytes.Equal(m.Bytes()[4096:4096+len(data)], data) || !allBytes(m.Bytes()[:4096], 0xA5) || !allBytes(m.Bytes()[4096+len(data):], 0xA5) {
		t.Fatalf("loaded bytes differ from the file")
	}
	if _, err := setf("token="+tok+",offset=0,length=100,file_offset=0x200000", mf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.Bytes()[:100], data[2<<20:2<<20+100]) {
		t.Fatalf("partial load differs")
	}
	if got := infoCounter(t, d.Mnt, "xattr_loads"); got != 2 {
		t.Errorf("xattr_loads = %d, want 2", got)
	}
	// The token dies with the buffer.
	f.Deregister(b)
	if out, err := setf("token="+tok+",offset=0", mf); err == nil || !strings.Contains(out, "Key was rejected") {
		t.Errorf("load with a released token: %v %q", err, out)
	}
	if _, err := os.Stat(secret); err != nil {
		t.Fatal(err)
	}
}

package integration

// Extended attributes: user.* names pass through to the backing file;
// user.phx.info reports the transport, device, engine, counters and the
// passthrough state (checked against the FUSE request log); user.phx.load
// loads a file into a registered buffer named by its token.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestXattrs: user.* names pass through both ways; user.phx.* names never
// reach the backing file and are not listed.
func TestXattrs(t *testing.T) {
	needTool(t, "getfattr")
	needTool(t, "setfattr")
	backing, mnt := mountOverlay(t)
	f := filepath.Join(mnt, "f")
	if err := os.WriteFile(f, []byte("x"), 0644); err != nil {
		t.Fatal(err)
	}
	runCmd(t, "setfattr", "-n", "user.color", "-v", "blue", f)
	buf := make([]byte, 64)
	n, err := unix.Getxattr(filepath.Join(backing, "f"), "user.color", buf)
	if err != nil || string(buf[:n]) != "blue" {
		t.Fatalf("backing user.color = %q, %v", buf[:max(n, 0)], err)
	}
	if err := unix.Setxattr(filepath.Join(backing, "f"), "user.size", []byte("large"), 0); err != nil {
		t.Fatal(err)
	}
	if out := runCmd(t, "getfattr", "--absolute-names", "--only-values", "-n", "user.size", f); out != "large" {
		t.Fatalf("getfattr user.size through the mount = %q", out)
	}
	// A user.phx.* name planted on the backing file is neither read nor listed.
	if err := unix.Setxattr(filepath.Join(backing, "f"), "user.phx.planted", []byte("p"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Getxattr(f, "user.phx.planted", buf); err != unix.ENODATA {
		t.Fatalf("get user.phx.planted through the mount: %v, want ENODATA", err)
	}
	// user.phx.info is the control's (phxmount always wires one), never the
	// file's.
	big := make([]byte, 64<<10)
	n, err = unix.Getxattr(f, "user.phx.info", big)
	if err != nil || !strings.Contains(string(big[:max(n, 0)]), "path=f\n") || !strings.Contains(string(big[:max(n, 0)]), "\ntransport=") {
		t.Fatalf("get user.phx.info: %v\n%s", err, big[:max(n, 0)])
	}
	if _, err := unix.Getxattr(filepath.Join(backing, "f"), "user.phx.info", buf); err != unix.ENODATA {
		t.Fatalf("user.phx.info is on the backing file: %v", err)
	}
	list := runCmd(t, "getfattr", "--absolute-names", "-d", "-m", "-", f)
	if strings.Contains(list, "user.phx") || !strings.Contains(list, "user.color") || !strings.Contains(list, "user.size") {
		t.Fatalf("getfattr -d lists:\n%s", list)
	}
	// Setting a user.phx.* name never writes the backing file.
	if err := unix.Setxattr(f, "user.phx.load", []byte("token=1"), 0); err == nil {
		t.Fatalf("setting user.phx.load with a bogus token succeeded")
	}
	if _, err := unix.Getxattr(filepath.Join(backing, "f"), "user.phx.load", buf); err != unix.ENODATA {
		t.Fatalf("user.phx.load reached the backing file: %v", err)
	}
	runCmd(t, "setfattr", "-x", "user.color", f)
	if _, err := unix.Getxattr(filepath.Join(backing, "f"), "user.color", buf); err != unix.ENODATA {
		t.Fatalf("removed user.color still on backing: %v", err)
	}
}

// TestXattrInfo: getfattr -n user.phx.info on a file and on the mount root
// reports the transport, device, engine and counters; other user.phx.*
// names are ENODATA, and listxattr hides them.
func TestXattrInfo(t *testing.T) {
	d, _, _ := startEmuFile(t, 123457)
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
	d, data, mf := startEmuFile(t, 3<<20+5, "-o", "allow_other")
	secret := filepath.Join(d.Backing, "secret")
	writePattern(t, secret, 1<<20, 0622) // nobody may write (so set xattrs) but not read
	f, m, b := openRegistered(t, mf, 4<<20)
	tok := b.Token.String()

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

// TestXattrInfoDefaultMount: every phxmount daemon has a control, so
// user.phx.info on a default mount (no options: --vendor auto,
// --passthrough auto) must succeed, on a file and on the root, and say
// which transport, vendor and passthrough state a GPU-direct read gets.
func TestXattrInfoDefaultMount(t *testing.T) {
	backing, mnt := mountOverlay(t)
	if err := os.WriteFile(filepath.Join(backing, "f"), []byte("x"), 0644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(mnt, "f"), mnt} {
		info := phxInfo(t, p) // fails the test when there is no report
		for k, allowed := range map[string][]string{
			"transport":   {"kmod", "host", "staged"},
			"vendor":      {"emu", "nvidia", "pcibar"},
			"passthrough": {"active", "inactive"},
		} {
			if !slices.Contains(allowed, info[k]) {
				t.Errorf("%s: user.phx.info %s=%q, want one of %v:\n%v", p, k, info[k], allowed, info)
			}
		}
		for _, k := range []string{"transport_why", "passthrough_why", "engine", "workers", "buffers_live"} {
			if info[k] == "" {
				t.Errorf("%s: user.phx.info lacks %s:\n%v", p, k, info)
			}
		}
	}
	if _, err := unix.Getxattr(filepath.Join(backing, "f"), "user.phx.info", make([]byte, 64)); err != unix.ENODATA {
		t.Errorf("user.phx.info is on the backing file: %v", err)
	}
}

// kernelAtLeast says whether the running kernel is at least major.minor.
func kernelAtLeast(t *testing.T, major, minor int) bool {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	var ma, mi int
	if _, err := fmt.Sscanf(rel, "%d.%d", &ma, &mi); err != nil {
		t.Fatalf("kernel release %q: %v", rel, err)
	}
	return ma > major || ma == major && mi >= minor
}

// fuseRequests counts the FUSE requests of one kind in a daemon log written
// with -d --log-level debug (go-fuse logs "rx UNIQUE: OPCODE n...").
func fuseRequests(log, op string) int {
	return len(regexp.MustCompile(`rx \d+: `+op+` n`).FindAllStringIndex(log, -1))
}

// TestPassthroughActive: with the default --passthrough auto, a root
// daemon on Linux >= 6.9 uses kernel FUSE passthrough and says so: the
// INFO ioctl's passthrough flag, user.phx.info's passthrough=active and
// the "mounted;" log line; and reading a file's data through the mount
// sends no READ to the daemon (go-fuse's request log, -d). On older
// kernels it must say inactive, with the reason. --passthrough off is the
// control: its reads reach the daemon, so the log check does see READs.
func TestPassthroughActive(t *testing.T) {
	supported := kernelAtLeast(t, 6, 9) && os.Geteuid() == 0
	t.Logf("kernel passthrough supported here: %v", supported)
	for _, mode := range []string{"auto", "off"} {
		t.Run(mode, func(t *testing.T) {
			args := []string{"-d", "--log-level", "debug"}
			if mode == "off" {
				args = append(args, "--passthrough", "off")
			} // else the default, --passthrough auto
			d, data, p := startEmuFile(t, 3<<20+77, args...)
			want := mode == "auto" && supported
			wantWord := map[bool]string{true: "active", false: "inactive"}[want]
			state := func(when string) {
				t.Helper()
				in, err := openClient(t, p, unix.O_RDONLY).Info()
				if err != nil {
					t.Fatalf("%s: INFO: %v", when, err)
				}
				info := phxInfo(t, p)
				if in.Passthrough() != want || info["passthrough"] != wantWord {
					t.Errorf("%s: INFO passthrough flag %v (%q), user.phx.info passthrough=%q (%q); want %s",
						when, in.Passthrough(), in.PassthroughWhy, info["passthrough"], info["passthrough_why"], wantWord)
				}
				if in.PassthroughWhy == "" || info["passthrough_why"] == "" || strings.HasPrefix(in.PassthroughWhy, "unknown") {
					t.Errorf("%s: no reason given: INFO %q, user.phx.info %q", when, in.PassthroughWhy, info["passthrough_why"])
				}
				if mode == "off" && !strings.Contains(in.PassthroughWhy, "--passthrough off") {
					t.Errorf("%s: --passthrough off, INFO says %q", when, in.PassthroughWhy)
				}
				if mode == "auto" && !supported && !strings.Contains(in.PassthroughWhy, "6.9") {
					t.Errorf("%s: a kernel older than 6.9, INFO says %q", when, in.PassthroughWhy)
				}
			}
			if !strings.Contains(d.Stderr(), "mounted; passthrough "+wantWord) {
				t.Errorf("the daemon's \"mounted;\" line does not say passthrough %s:\n%s", wantWord, d.Stderr())
			}
			state("after mounting")

			reads := fuseRequests(d.Stderr(), "READ")
			got, err := os.ReadFile(p)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("reading through the mount: %d bytes, %v", len(got), err)
			}
			if out := runCmd(t, "cat", p); out != string(data) {
				t.Fatalf("cat through the mount differs")
			}
			// The INFO and GETXATTR requests that follow the reads are
			// logged after them: wait for those, then count the READs.
			xattrs := fuseRequests(d.Stderr(), "GETXATTR")
			state("after reading")
			if !waitFor(5*time.Second, func() bool { return fuseRequests(d.Stderr(), "GETXATTR") > xattrs }) {
				t.Fatalf("no GETXATTR in the daemon's request log: was it started with -d --log-level debug?\n%s", d.Stderr())
			}
			reads = fuseRequests(d.Stderr(), "READ") - reads
			switch {
			case want && reads != 0:
				t.Errorf("passthrough active, yet %d READ requests reached the daemon", reads)
			case !want && reads == 0:
				t.Errorf("passthrough inactive, yet no READ request in the daemon's log: the check cannot see reads")
			}
			if strings.Contains(d.Stderr(), "passthrough: lost") {
				t.Errorf("the daemon lost passthrough:\n%s", d.Stderr())
			}
			t.Logf("passthrough %s: %d READ requests reached the daemon for %d bytes read twice", mode, reads, len(data))
		})
	}
}

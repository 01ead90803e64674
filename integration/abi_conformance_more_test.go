package integration

// The second half of the docs/abi.md conformance test (abi_conformance_test.go
// has the first and the fixture): ownership, writes as the caller's, the
// xattrs, the emu handle's rules, release, the read-only mount, the
// registration limits and shutdown.

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// "Ownership and lifetime": another process, of the same uid or not, gets
// EPERM naming the buffer; its own buffers work; the owner's uid counts.
func (x *abiFixture) ownership(t *testing.T) {
	odata, opath := x.file(t, "own", 100000, 0666)
	ofile := filepath.Join(x.d.Backing, "own")
	fd := openFD(t, opath, unix.O_RDWR)
	m := newEmu(t, "phxemu-own", 2*emuPage, 0)
	r := x.reg(t, fd, m)
	for _, who := range []struct {
		name string
		cred *syscall.Credential
	}{{"same uid", nil}, {"uid 65534", asUser(nobody)}} {
		t.Run(who.name, func(t *testing.T) {
			c := startABIChild(t, who.cred)
			cfd := c.do(t, "open %s %d", opath, unix.O_RDWR)
			if _, err := strconv.Atoi(cfd); err != nil {
				t.Fatalf("the child's open: %s", cfd)
			}
			ep := fmt.Sprint(-int64(unix.EPERM))
			for cmd, want := range map[string]string{
				"io read %s %d 0 4096 0":                "EPERM",
				"io write %s %d 0 4096 0":               "EPERM",
				"io read %s %d 131072 4096 0":           "EPERM", // before EFAULT
				"batch read %s %d 0 4096 0":             "OK 1 " + ep,
				"batch write %s %d 0 4096 0":            "OK 1 " + ep,
				"strided read %s %d 0 100 0 3 200 100":  "OK 1 " + ep,
				"strided write %s %d 0 100 0 3 200 100": "OK 1 " + ep,
				"dereg %s %d":                           "EPERM",
			} {
				if got := c.do(t, cmd, cfd, r.id); got != want {
					t.Errorf("the child's %q on our buffer: %s, want %s", strings.Fields(cmd)[0]+" "+strings.Fields(cmd)[1], got, want)
				}
			}
			// Its own buffer works; ours gets EPERM for it the other way round.
			reply := strings.Fields(c.do(t, "reg %s %d", cfd, emuPage))
			if len(reply) != 2 {
				t.Fatalf("the child's REGISTER: %v", reply)
			}
			cid, _ := strconv.ParseUint(reply[0], 10, 64)
			x.fresh(t, regReply{id: cid, token: unhex(t, reply[1])})
			if got := c.do(t, "io read %s %d 0 4096 100", cfd, cid); got != "4096" {
				t.Errorf("the child's READ into its own buffer: %s", got)
			}
			_, e := abiIO(t, fd, false, cid, 0, 4096, 0)
			wantErrno(t, "READ into the child's buffer", e, unix.EPERM)
			_, res, e := abiBatch(t, fd, false, 1, []ext{{cid, 0, 4096, 0}})
			if e != 0 || res[0] != -int64(unix.EPERM) {
				t.Errorf("a batch extent into the child's buffer: %s, %v", errName(e), res)
			}
			wantErrno(t, "DEREGISTER of the child's buffer", abiDeregister(t, fd, cid), unix.EPERM)
			if got := c.do(t, "dereg %s %d", cfd, cid); got != "OK" {
				t.Errorf("the child's DEREGISTER of its own buffer: %s", got)
			}
			c.exit(t)
		})
	}
	if !allBytes(m.mem, 0xA5) {
		t.Errorf("the other processes moved bytes into our buffer")
	}
	mustEqualFile(t, ofile, odata)
	if n, e := abiIO(t, fd, false, r.id, 0, 4096, 0); e != 0 || n != 4096 || !bytes.Equal(m.mem[:4096], odata[:4096]) {
		t.Errorf("our READ afterwards: %d, %s", n, errName(e))
	}
	// The owner's uid: a buffer registered as root stops working for its
	// process once that process is uid 65534.
	c := startABIChild(t, nil)
	cfd := c.do(t, "open %s %d", opath, unix.O_RDWR)
	reply := strings.Fields(c.do(t, "reg %s %d", cfd, emuPage))
	if len(reply) != 2 {
		t.Fatalf("the child's REGISTER: %v", reply)
	}
	if got := c.do(t, "io read %s %s 0 4096 0", cfd, reply[0]); got != "4096" {
		t.Fatalf("the child's READ before setuid: %s", got)
	}
	if got := c.do(t, "setuid %d", nobody); got != "OK" {
		t.Fatalf("setuid: %s", got)
	}
	if got := c.do(t, "io read %s %s 0 4096 0", cfd, reply[0]); got != "EPERM" {
		t.Errorf("READ by the registering process after it became uid 65534: %s, want EPERM", got)
	}
}

// unhex decodes a child's hex token.
func unhex(t testing.TB, s string) [16]byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 16 {
		t.Fatalf("a token %q: %v", s, err)
	}
	return [16]byte(b)
}

// "A write is what the caller's own write(2) through the mount would be":
// set-user-ID and set-group-ID (with group execute) cleared for a caller
// without CAP_FSETID, exactly as the kernel's write(2) clears them.
func (x *abiFixture) writeAsCaller(t *testing.T) {
	c := startABIChild(t, asUser(nobody))
	fd := openFD(t, x.f, unix.O_RDONLY)
	mm := newEmu(t, "phxemu-suid", emuPage, 0)
	r := x.reg(t, fd, mm)
	var cid string // the child's buffer
	for _, mode := range []uint32{0o6775, 0o2765, 0o4755, 0o2775, 0o6777} {
		var modes [3]uint32
		for i, how := range []string{"ioctl", "write(2)", "root ioctl"} {
			name := fmt.Sprintf("suid-%o-%d", mode, i)
			bpath := filepath.Join(x.d.Backing, name)
			writePattern(t, bpath, 10000, 0644)
			os.Chown(bpath, nobody, nobody)
			if err := unix.Chmod(bpath, mode); err != nil {
				t.Fatal(err)
			}
			mpath := filepath.Join(x.d.Mnt, name)
			if how == "root ioctl" {
				if n, e := abiIO(t, openFD(t, mpath, unix.O_RDWR), true, r.id, 0, 100, 0); e != 0 || n != 100 {
					t.Fatalf("root's WRITE: %d, %s", n, errName(e))
				}
			} else {
				cfd := c.do(t, "open %s %d", mpath, unix.O_RDWR)
				if cid == "" {
					cid = strings.Fields(c.do(t, "reg %s %d", cfd, emuPage))[0]
				}
				if how == "ioctl" {
					if got := c.do(t, "io write %s %s 0 100 0", cfd, cid); got != "100" {
						t.Fatalf("nobody's WRITE: %s", got)
					}
				} else if got := c.do(t, "pwrite %s 0 100", cfd); got != "100" {
					t.Fatalf("nobody's pwrite: %s", got)
				}
			}
			var st unix.Stat_t
			if err := unix.Stat(bpath, &st); err != nil {
				t.Fatal(err)
			}
			modes[i] = st.Mode & 0o7777
		}
		want := mode &^ 0o4000 // the kernel's should_remove_suid
		if mode&0o2010 == 0o2010 {
			want &^= 0o2000
		}
		if modes[0] != modes[1] || modes[0] != want {
			t.Errorf("mode %o written by uid 65534: %o after WRITE, %o after write(2); want %o", mode, modes[0], modes[1], want)
		}
		if modes[2] != mode {
			t.Errorf("mode %o written by root (CAP_FSETID): %o after WRITE, want it kept", mode, modes[2])
		}
	}
}

// RLIMIT_FSIZE: "an extent starting at or past it fails with EFBIG and the
// calling thread gets SIGXFSZ; one crossing it is cut short"; batches
// get -EFBIG per extent, strided writes per piece.
func (x *abiFixture) fileSizeLimit(t *testing.T) {
	bpath := filepath.Join(x.d.Backing, "fsize")
	if err := os.WriteFile(bpath, nil, 0644); err != nil {
		t.Fatal(err)
	}
	c := startABIChild(t, nil)
	cfd := c.do(t, "open %s %d", filepath.Join(x.d.Mnt, "fsize"), unix.O_RDWR)
	id := strings.Fields(c.do(t, "reg %s %d", cfd, emuPage))[0]
	if got := c.do(t, "fsize 8192"); got != "OK" {
		t.Fatalf("setrlimit: %s", got)
	}
	efbig := fmt.Sprint(-int64(unix.EFBIG))
	for _, s := range []struct{ cmd, want, sig string }{
		{"io write %s %s 0 100 0", "100", "no"},
		{"io write %s %s 0 100 8192", "EFBIG", "yes"}, // at the limit
		{"io write %s %s 0 100 9000", "EFBIG", "yes"}, // past it
		{"io write %s %s 0 8192 4096", "4096", "no"},  // crossing it: cut short
		{"batch write %s %s 0 100 8192", "OK 1 " + efbig, ""},
		{"batch write %s %s 0 50 8000", "OK 0 50", "no"},
		{"strided write %s %s 0 10 8192 2 100 10", "OK 1 " + efbig, ""},
		{"strided write %s %s 0 10 8100 2 10 10", "OK 0 20", "no"},
		// Pieces after the first: their bytes up to the first that did
		// not move all of its own.
		{"strided write %s %s 0 100 8000 2 200 100", "OK 1 100", "yes"}, // piece 1 at 8200: EFBIG
		{"strided write %s %s 0 100 8100 3 100 100", "OK 1 92", "yes"},  // piece 0 cut at 8192
	} {
		if got := c.do(t, s.cmd, cfd, id); got != s.want {
			t.Errorf("%q under RLIMIT_FSIZE 8192: %s, want %s", s.cmd, got, s.want)
		}
		if got := c.do(t, "sigxfsz"); s.sig != "" && got != s.sig {
			t.Errorf("%q under RLIMIT_FSIZE 8192: SIGXFSZ to the calling thread: %s, want %s", s.cmd, got, s.sig)
		}
	}
	c.exit(t)
	want := make([]byte, 8192)
	fill(want[:100], 0xA5)
	fill(want[4096:], 0xA5)
	// (every write above came from the child's buffer, all 0xA5, and
	// landed below 8192)
	mustEqualFile(t, bpath, want)
}

// "user.phx.info": key=value lines for files, directories and the root.
func (x *abiFixture) xattrInfo(t *testing.T) {
	for _, c := range []struct {
		path, rel string
		file      bool
	}{{x.f, "f", true}, {x.dir, "dir", false}, {x.d.Mnt, "", false}} {
		n, err := unix.Getxattr(c.path, "user.phx.info", nil)
		if err != nil || n <= 0 {
			t.Errorf("getxattr size of user.phx.info on %s: %d, %v", c.path, n, err)
		}
		buf := make([]byte, 1<<16)
		n, err = unix.Getxattr(c.path, "user.phx.info", buf)
		if err != nil {
			t.Fatalf("user.phx.info on %s: %v", c.path, err)
		}
		kv := map[string]string{}
		for _, line := range strings.Split(strings.TrimSuffix(string(buf[:n]), "\n"), "\n") {
			k, v, ok := strings.Cut(line, "=")
			if !ok || k == "" {
				t.Errorf("user.phx.info on %s: line %q is no key=value", c.path, line)
			}
			kv[k] = v
		}
		if p, ok := kv["path"]; !ok || (c.rel != "" && p != c.rel) {
			t.Errorf("user.phx.info on %s: path=%q (present %v), want %q", c.path, p, ok, c.rel)
		}
		_, hasSize := kv["size"]
		_, hasDIO := kv["dio_mem_align"]
		_, hasDIO2 := kv["dio_offset_align"]
		if hasSize != c.file || hasDIO != c.file || hasDIO2 != c.file {
			t.Errorf("user.phx.info on %s: size %v, dio_mem_align %v, dio_offset_align %v; want each %v", c.path, hasSize, hasDIO, hasDIO2, c.file)
		}
		if c.file && kv["size"] != fmt.Sprint(abiFileSize) {
			t.Errorf("user.phx.info size=%s, want %d", kv["size"], abiFileSize)
		}
		for _, k := range append([]string{"transport", "transport_why", "vendor", "device", "device_name", "pci", "page_size",
			"engine", "workers", "bounce_size", "passthrough", "passthrough_why", "read_only", "cache", "cache_mode",
			"cache_fs", "cache_network", "cache_why", "entry_timeout", "attr_timeout", "negative_timeout", "watch"}, infoCounterKeys...) {
			if _, ok := kv[k]; !ok {
				t.Errorf("user.phx.info on %s has no %s", c.path, k)
			}
		}
	}
}

// "Virtual xattrs": never listed, never removed, never passed on; the
// other user.phx.* names.
func (x *abiFixture) xattrNames(t *testing.T) {
	bpath := filepath.Join(x.d.Backing, "f")
	for _, p := range []string{x.f, x.dir} {
		if err := unix.Setxattr(p, "user.abi.mine", []byte("v"), 0); err != nil {
			t.Fatalf("a real user xattr on %s: %v", p, err)
		}
		buf := make([]byte, 4096)
		n, err := unix.Listxattr(p, buf)
		if err != nil {
			t.Fatal(err)
		}
		if size, err := unix.Listxattr(p, nil); err != nil || size != n {
			t.Errorf("listxattr %s: the size asked first is %d (%v), the list %d bytes", p, size, err, n)
		}
		names := strings.Split(strings.TrimSuffix(string(buf[:n]), "\x00"), "\x00")
		if !strings.Contains(string(buf[:n]), "user.abi.mine") {
			t.Errorf("listxattr %s: %q has not the real xattr", p, names)
		}
		if strings.Contains(string(buf[:n]), "user.phx.") {
			t.Errorf("listxattr %s shows a user.phx.* name: %q", p, names)
		}
		for _, name := range []string{"user.phx.info", "user.phx.load", "user.phx.other", "user.phx."} {
			wantErrno(t, "removexattr "+name+" on "+p, errnoOf(unix.Removexattr(p, name)), unix.EPERM)
		}
		for _, name := range []string{"user.phx.other", "user.phx.", "user.phx.infox", "user.phx.INFO", "user.phx.load"} {
			_, err := unix.Getxattr(p, name, make([]byte, 256))
			wantErrno(t, "getxattr "+name+" on "+p, errnoOf(err), unix.ENODATA)
		}
		for _, name := range []string{"user.phx.info", "user.phx.other", "user.phx.", "user.phx.loadx"} {
			wantErrno(t, "setxattr "+name+" on "+p, errnoOf(unix.Setxattr(p, name, []byte("x"), 0)), unix.ENOTSUP)
		}
	}
	// None reached the backing file.
	buf := make([]byte, 4096)
	n, _ := unix.Listxattr(bpath, buf)
	if strings.Contains(string(buf[:n]), "user.phx.") {
		t.Errorf("the backing file got a user.phx.* xattr: %q", buf[:n])
	}
	if !strings.Contains(string(buf[:n]), "user.abi.mine") {
		t.Errorf("the real xattr did not reach the backing file: %q", buf[:n])
	}
}

// "user.phx.load": defaults, hex and decimal numbers, the token as a
// capability of whoever holds it.
func (x *abiFixture) xattrLoad(t *testing.T) {
	fd := openFD(t, x.f, unix.O_RDONLY)
	m := newEmu(t, "phxemu-load", 32*emuPage, 0)
	r := x.reg(t, fd, m)
	tok := "token=" + r.tokenHex()
	for _, c := range []struct {
		value   string
		bo, n   uint64
		fo      uint64
		comment string
	}{
		{tok + ",offset=0", 0, abiFileSize, 0, "the whole file"},
		{tok + ",offset=0x100,file_offset=0x10,length=4096", 0x100, 4096, 0x10, "hex"},
		{"offset=5," + tok + ",file_offset=1000", 5, abiFileSize - 1000, 1000, "the rest of the file, keys in any order"},
		{tok + ",offset=010,length=8", 10, 8, 0, "decimal with a leading zero"},
		{tok + ",offset=7,file_offset=" + fmt.Sprint(abiFileSize), 7, 0, 0, "file_offset at the end: nothing"},
		{tok + ",offset=0,file_offset=100,length=" + fmt.Sprint(abiFileSize-100), 0, abiFileSize - 100, 100, "length up to the end of file"},
		{tok + ",offset=" + fmt.Sprint(m.size-4096), uint64(m.size) - 4096, 4096, 0, "cut at the end of the buffer"},
		{tok + ",offset=0x" + strings.Repeat("0", maxLoadValue-len(tok)-len(",offset=0x")-1) + "9", 9, abiFileSize, 0, "a value of 512 bytes"},
		{tok[:6] + strings.ToUpper(tok[6:]) + ",offset=3,length=5", 3, 5, 0, "upper-case hex token"},
	} {
		fill(m.mem, 0xA5)
		before := x.counters(t)
		if err := xattrLoad(x.f, c.value); err != nil {
			t.Errorf("user.phx.load %q (%s): %v", c.value, c.comment, err)
			continue
		}
		landed(t, c.comment, m.mem, c.bo, x.data[c.fo:c.fo+c.n])
		after := x.counters(t)
		if d := after["xattr_loads"] - before["xattr_loads"]; d != 1 {
			t.Errorf("user.phx.load (%s): xattr_loads grew by %d", c.comment, d)
		}
		if d := after["ioctl_bytes_read"] - before["ioctl_bytes_read"]; d != int64(c.n) {
			t.Errorf("user.phx.load (%s): ioctl_bytes_read grew by %d, want %d", c.comment, d, c.n)
		}
	}
	// An empty file into the end of the buffer: nothing to load, no error.
	_, epath := x.file(t, "empty", 0, 0644)
	if err := xattrLoad(epath, fmt.Sprintf("%s,offset=%d", tok, m.size)); err != nil {
		t.Errorf("loading an empty file at the buffer's end: %v", err)
	}
	// Whoever holds the token may load, whatever process or uid it is.
	pdata, ppath := x.file(t, "pub", 5000, 0666)
	fill(m.mem, 0xA5)
	c := startABIChild(t, asUser(nobody))
	if got := c.do(t, "load %s %s,offset=64", ppath, tok); got != "OK" {
		t.Errorf("uid 65534's user.phx.load with our token: %s", got)
	}
	landed(t, "uid 65534's load", m.mem, 64, pdata)
}

// The user.phx.load error table; nothing moves.
func (x *abiFixture) xattrLoadErrors(t *testing.T) {
	fd := openFD(t, x.f, unix.O_RDONLY)
	m := newEmu(t, "phxemu-loaderr", 32*emuPage, 0)
	r := x.reg(t, fd, m)
	tok := "token=" + r.tokenHex()
	size := m.size
	for _, c := range []struct {
		path, value string
		want        unix.Errno
	}{
		{x.f, "", unix.EINVAL},
		{x.f, tok, unix.EINVAL},                       // no offset
		{x.f, "offset=0", unix.EINVAL},                // no token
		{x.f, tok + ",offset=0,bogus=1", unix.EINVAL}, // unknown key
		{x.f, tok + ",offset=0,Length=1", unix.EINVAL},
		{x.f, tok + ",offset=abc", unix.EINVAL},
		{x.f, tok + ",offset=-1", unix.EINVAL},
		{x.f, tok + ",offset=+1", unix.EINVAL},
		{x.f, tok + ",offset=0x", unix.EINVAL},
		{x.f, tok + ",offset=0b1", unix.EINVAL}, // neither decimal nor 0x hex
		{x.f, tok + ",offset=0o7", unix.EINVAL},
		{x.f, tok + ",offset=1_0", unix.EINVAL},
		{x.f, tok + ",offset= 1", unix.EINVAL},
		{x.f, tok + ",offset=1.5", unix.EINVAL},
		{x.f, tok + ",offset=18446744073709551616", unix.EINVAL},
		{x.f, tok + ",offset=", unix.EINVAL},
		{x.f, tok + ",offset", unix.EINVAL},
		{x.f, tok[:len(tok)-1] + ",offset=0", unix.EINVAL}, // 31 hex digits
		{x.f, tok + "0,offset=0", unix.EINVAL},             // 33
		{x.f, "token=" + strings.Repeat("g", 32) + ",offset=0", unix.EINVAL},
		{x.f, tok + ",offset=0,length=" + fmt.Sprint(abiFileSize+1), unix.EINVAL}, // past the end of file
		{x.f, tok + ",offset=0,file_offset=" + fmt.Sprint(abiFileSize-10) + ",length=11", unix.EINVAL},
		{x.f, tok + ",offset=0,file_offset=" + fmt.Sprint(abiFileSize+1) + ",length=1", unix.EINVAL},
		{x.f, tok + ",offset=0x" + strings.Repeat("0", maxLoadValue-len(tok)-len(",offset=0x")) + "9", unix.EINVAL},     // 513 bytes
		{x.f, tok + ",offset=0x" + strings.Repeat("0", maxLoadValue-len(tok)-len(",offset=0x")-1) + "9\n", unix.EINVAL}, // 513 bytes too
		{x.f, tok + ",offset=0,offset=1", unix.EINVAL},
		{x.f, "token=" + strings.Repeat("0", 32) + ",offset=0", unix.EKEYREJECTED},
		{x.f, "token=" + strings.Repeat("f", 32) + ",offset=0", unix.EKEYREJECTED},
		{x.f, fmt.Sprintf("%s,offset=%d", tok, size), unix.EFAULT}, // at the end, the file has bytes
		{x.f, fmt.Sprintf("%s,offset=%d,length=11", tok, size-10), unix.EFAULT},
		{x.f, fmt.Sprintf("%s,offset=%d", tok, size+1), unix.EFAULT},
		{x.f, fmt.Sprintf("%s,offset=%d", tok, two63-1), unix.EFAULT},
		{x.f, fmt.Sprintf("%s,offset=0,length=1,file_offset=%d", tok, two63-1), unix.EINVAL}, // past the end of file
		// max_offset: "every offset and length" below 2^63 ("Limits").
		{x.f, fmt.Sprintf("%s,offset=%d", tok, two63), unix.EINVAL},
		{x.f, fmt.Sprintf("%s,offset=%#x", tok, ^uint64(0)), unix.EINVAL},
		{x.f, fmt.Sprintf("%s,offset=0,length=%d", tok, two63), unix.EINVAL},
		{x.f, fmt.Sprintf("%s,offset=0,file_offset=%d", tok, two63), unix.EINVAL},
		{x.dir, tok + ",offset=0", unix.EISDIR},
	} {
		wantErrno(t, fmt.Sprintf("user.phx.load %q on %s", c.value, filepath.Base(c.path)), errnoOf(xattrLoad(c.path, c.value)), c.want)
	}
	// A file the caller may write but not read: EACCES, as its own open.
	_, wpath := x.file(t, "writeonly", 5000, 0622)
	c := startABIChild(t, asUser(nobody))
	if got := c.do(t, "load %s %s,offset=0", wpath, tok); got != "EACCES" {
		t.Errorf("uid 65534's user.phx.load of a file it may not read: %s, want EACCES", got)
	}
	if got := c.do(t, "open %s %d", wpath, unix.O_RDONLY); got != "EACCES" {
		t.Errorf("uid 65534's own open of that file: %s, want EACCES", got)
	}
	// "The kernel checks write permission on the file before any user.*
	// xattr is set": f is 0644, root's.
	if got := c.do(t, "load %s %s,offset=0", x.f, tok); got != "EACCES" {
		t.Errorf("uid 65534's user.phx.load of a file it may not write: %s, want EACCES", got)
	}
	if !allBytes(m.mem, 0xA5) {
		t.Errorf("a refused user.phx.load moved bytes")
	}
}

// "The emu handle": a read-only share registers read-only, a write-only
// one not at all.
func (x *abiFixture) emuReadOnly(t *testing.T) {
	fd := openFD(t, x.f, unix.O_RDONLY)
	wpath := filepath.Join(x.d.Mnt, "fromro")
	wfd := openFD(t, wpath, unix.O_RDWR|unix.O_CREAT)
	content := pattern(2*emuPage, 0x3C)
	for _, how := range []string{"O_RDONLY descriptor", "F_SEAL_WRITE", "F_SEAL_FUTURE_WRITE"} {
		t.Run(how, func(t *testing.T) {
			mfd, err := unix.MemfdCreate("phxemu-ro", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(mfd)
			if _, err := unix.Pwrite(mfd, content, 0); err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			unix.Fstat(mfd, &st)
			hfd := mfd
			switch how {
			case "O_RDONLY descriptor":
				if hfd, err = unix.Open(fmt.Sprintf("/proc/self/fd/%d", mfd), unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
					t.Fatal(err)
				}
				defer unix.Close(hfd)
			case "F_SEAL_WRITE":
				_, err = unix.FcntlInt(uintptr(mfd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE)
			case "F_SEAL_FUTURE_WRITE":
				_, err = unix.FcntlInt(uintptr(mfd), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE)
			}
			if err != nil {
				t.Fatal(err)
			}
			r, e := abiRegister(t, fd, vendorEmu, 0, 2*emuPage, emuHandle(uint32(os.Getpid()), uint32(hfd), 2*emuPage, st.Ino, 0))
			if e != 0 {
				t.Fatalf("REGISTER: %s", errName(e))
			}
			x.fresh(t, r)
			_, e = abiIO(t, fd, false, r.id, 0, 4096, 0)
			wantErrno(t, "READ", e, unix.EACCES)
			_, e = abiIO(t, fd, false, r.id, 2*emuPage, 4096, 0)
			wantErrno(t, "READ past the buffer", e, unix.EACCES) // EACCES before EFAULT
			_, res, e := abiBatch(t, fd, false, 1, []ext{{r.id, 0, 4096, 0}})
			if e != 0 || res[0] != -int64(unix.EACCES) {
				t.Errorf("batch read: %s, %v", errName(e), res)
			}
			_, res, e = abiStrided(t, fd, false, 1, []sext{{r.id, 0, 10, 0, 2, 10, 10}})
			if e != 0 || res[0] != -int64(unix.EACCES) {
				t.Errorf("strided read: %s, %v", errName(e), res)
			}
			wantErrno(t, "user.phx.load", errnoOf(xattrLoad(x.f, "token="+r.tokenHex()+",offset=0")), unix.EACCES)
			// It is a source as any other.
			if n, e := abiIO(t, wfd, true, r.id, 1000, 3000, 0); e != 0 || n != 3000 {
				t.Errorf("WRITE from the read-only buffer: %d, %s", n, errName(e))
			}
			if _, res, e := abiBatch(t, wfd, true, 1, []ext{{r.id, 5000, 100, 3000}}); e != 0 || res[0] != 100 {
				t.Errorf("batch write from the read-only buffer: %s, %v", errName(e), res)
			}
			if _, res, e := abiStrided(t, wfd, true, 1, []sext{{r.id, 6000, 10, 3100, 2, 10, 20}}); e != 0 || res[0] != 20 {
				t.Errorf("strided write from the read-only buffer: %s, %v", errName(e), res)
			}
			want := append(bytes.Clone(content[1000:4000]), content[5000:5100]...)
			want = append(append(want, content[6000:6010]...), content[6020:6030]...)
			mustEqualFile(t, wpath, want)
			got := make([]byte, len(content))
			unix.Pread(mfd, got, 0)
			if !bytes.Equal(got, content) {
				t.Errorf("the read-only memory changed")
			}
			wantErrno(t, "DEREGISTER", abiDeregister(t, fd, r.id), 0)
		})
	}
}

// "Keep the memfd at least as large as the registration": shrunk, the
// pages gone fail with EFAULT, the rest works; a punched hole fails with
// EFAULT too (the daemon never allocates the exporter's pages again)
// until the exporter fallocates it, and then loads.
func (x *abiFixture) emuShrunk(t *testing.T) {
	fd := openFD(t, x.f, unix.O_RDONLY)
	m := newEmu(t, "phxemu-shrink", 4*emuPage, 0)
	r := x.reg(t, fd, m)
	if err := unix.Ftruncate(m.fd, 2*emuPage); err != nil {
		t.Fatal(err)
	}
	mem := m.mem[:2*emuPage] // the rest would SIGBUS here
	_, e := abiIO(t, fd, false, r.id, 3*emuPage, 4096, 0)
	wantErrno(t, "READ into pages that are gone", e, unix.EFAULT)
	if _, res, e := abiBatch(t, fd, false, 2, []ext{{r.id, 3 * emuPage, 4096, 0}, {r.id, 0, 4096, 0}}); e != 0 || res[0] != -int64(unix.EFAULT) || res[1] != 4096 {
		t.Errorf("a batch into pages that are gone and pages that are not: %s, %v", errName(e), res)
	}
	if !bytes.Equal(mem[:4096], x.data[:4096]) {
		t.Errorf("the READ into the remaining pages landed other bytes")
	}
	if n, e := abiIO(t, fd, false, r.id, 2*emuPage-4096, 8192, 0); e != unix.EFAULT && (e != 0 || n != 4096) {
		t.Errorf("READ across the new end: %d, %s; want EFAULT or 4096 bytes", n, errName(e))
	}
	if err := unix.Fallocate(m.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, emuPage); err != nil {
		t.Fatal(err)
	}
	if n, e := abiIO(t, fd, false, r.id, 0, emuPage, 100); e != unix.EFAULT {
		t.Errorf("READ into a punched hole: %d, %s; want EFAULT", n, errName(e))
	}
	if err := unix.Fallocate(m.fd, unix.FALLOC_FL_KEEP_SIZE, 0, emuPage); err != nil {
		t.Fatal(err)
	}
	if n, e := abiIO(t, fd, false, r.id, 0, emuPage, 100); e != 0 || n != emuPage || !bytes.Equal(mem[:emuPage], x.data[100:100+emuPage]) {
		t.Errorf("READ into the hole fallocated again: %d, %s", n, errName(e))
	}
	x.d.alive(t, "after the shrunk memfd")
}

// liveAndReleased is the release counters of user.phx.info.
func liveAndReleased(t testing.TB, mnt string) [4]int64 {
	t.Helper()
	i := phxInfo(t, mnt)
	var c [4]int64
	for j, k := range []string{"buffers_live", "released_deregister", "released_close", "released_death"} {
		c[j], _ = strconv.ParseInt(i[k], 10, 64)
	}
	return c
}

// TestABILifetime: "A buffer is released, and its id and token stop
// working, on the first of" DEREGISTER, the last close of the open file
// it was registered on (dup'ed and inherited descriptors keep it open),
// the death of the registering process; each counted under its own
// counter; ids never come back. The close and the death reach the daemon
// after close(2) and exit return, so those two are waited for.
func TestABILifetime(t *testing.T) {
	d, data, path := startEmuFile(t, 1<<20)
	cfd := openFD(t, path, unix.O_RDONLY) // the descriptor the checks use
	m := newEmu(t, "phxemu-life", emuPage, 0)
	seen := map[uint64]bool{}
	reg := func(fd int) regReply {
		t.Helper()
		r := mustRegister(t, fd, m)
		if seen[r.id] {
			t.Errorf("id %d given out again", r.id)
		}
		seen[r.id] = true
		return r
	}
	works := func(r regReply) bool {
		t.Helper()
		fill(m.mem, 0xA5)
		n, e := abiIO(t, cfd, false, r.id, 0, 4096, 4096)
		if e == 0 && (n != 4096 || !bytes.Equal(m.mem[:4096], data[4096:8192])) {
			t.Errorf("READ into buffer %d: %d bytes, or other bytes", r.id, n)
		}
		return e == 0
	}
	gone := func(r regReply) bool {
		_, e := abiIO(t, cfd, false, r.id, 0, 4096, 0)
		return e == unix.ENOENT
	}
	waitGone := func(what string, r regReply) {
		t.Helper()
		if !waitFor(10e9, func() bool { return gone(r) }) {
			t.Fatalf("%s: buffer %d still not released 10 s later", what, r.id)
		}
		wantErrno(t, what+": the token", errnoOf(xattrLoad(path, "token="+r.tokenHex()+",offset=0")), unix.EKEYREJECTED)
	}
	want := func(what string, got, want [4]int64) {
		t.Helper()
		if got != want {
			t.Errorf("%s: live, released by deregister, close, death = %v, want %v", what, got, want)
		}
	}
	// A release counts once the registration is closed, after its id
	// stopped working: the asynchronous ones are waited for.
	settled := func(what string, w [4]int64) {
		t.Helper()
		var got [4]int64
		waitFor(10e9, func() bool { got = liveAndReleased(t, d.Mnt); return got == w })
		want(what, got, w)
	}
	c0 := liveAndReleased(t, d.Mnt)
	if c0 != [4]int64{} {
		t.Fatalf("a fresh mount's counters: %v", c0)
	}
	// DEREGISTER.
	r := reg(cfd)
	want("registered", liveAndReleased(t, d.Mnt), [4]int64{1, 0, 0, 0})
	wantErrno(t, "DEREGISTER", abiDeregister(t, cfd, r.id), 0)
	if !gone(r) {
		t.Errorf("READ right after DEREGISTER is not ENOENT")
	}
	want("after DEREGISTER", liveAndReleased(t, d.Mnt), [4]int64{0, 1, 0, 0})

	// The last close of a dup'ed descriptor.
	a, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	r = reg(a)
	b, err := unix.Dup(a)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(a)
	if !works(r) {
		t.Errorf("the buffer died with the first of two descriptors of its open file")
	}
	unix.Close(b)
	waitGone("the last close of a dup'ed descriptor", r)
	settled("after the last close", [4]int64{0, 1, 1, 0})

	// The last close in a child that inherited the descriptor.
	a, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	r = reg(a)
	inherit := os.NewFile(uintptr(a), "inherited")
	c := startABIChild(t, nil, inherit)
	if got := c.do(t, "io read 3 %d 0 1 0", r.id); got != "EPERM" { // a child is another process
		t.Errorf("the child's READ into our buffer: %s, want EPERM", got)
	}
	inherit.Close()
	if !works(r) {
		t.Errorf("the buffer died while a child still held its open file")
	}
	want("while the child holds the file", liveAndReleased(t, d.Mnt), [4]int64{1, 1, 1, 0})
	c.exit(t)
	waitGone("the child's exit, the last close", r)
	settled("after the child's exit", [4]int64{0, 1, 2, 0})

	// The owner's death, its open file kept open by this process.
	keep, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	c = startABIChild(t, nil, keep)
	reply := strings.Fields(c.do(t, "reg 3 %d", emuPage))
	if len(reply) != 2 {
		t.Fatalf("the child's REGISTER: %v", reply)
	}
	var cr regReply
	cr.id, _ = strconv.ParseUint(reply[0], 10, 64)
	cr.token = unhex(t, reply[1])
	if seen[cr.id] {
		t.Errorf("id %d given out again", cr.id)
	}
	seen[cr.id] = true
	if _, e := abiIO(t, cfd, false, cr.id, 0, 1, 0); e != unix.EPERM {
		t.Errorf("READ into the child's live buffer: %s, want EPERM", errName(e))
	}
	c.cmd.Process.Kill()
	c.cmd.Wait()
	waitGone("the owner's death", cr)
	settled("after the owner's death", [4]int64{0, 1, 2, 1})
	// Ids after all that are still new; every REGISTER was counted.
	for i := 0; i < 3; i++ {
		reg(cfd)
	}
	if got := infoCounter(t, d.Mnt, "buffers_registered"); got != int64(len(seen)) {
		t.Errorf("buffers_registered = %d, want %d", got, len(seen))
	}
}

// TestABIReadOnlyMount: on -o ro, WRITE and the batch writes get EROFS,
// after EISDIR and malformed, before the buffer; E2BIG before EROFS;
// REGISTER and READ work; INFO sets bit 1; user.phx.load gets EROFS.
func TestABIReadOnlyMount(t *testing.T) {
	d, data, path := startEmuFile(t, 1<<20, "-o", "ro")
	fd := openFD(t, path, unix.O_RDONLY)
	dfd := openFD(t, d.Mnt, unix.O_RDONLY|unix.O_DIRECTORY)
	if _, err := unix.Open(path, unix.O_RDWR, 0); err != unix.EROFS {
		t.Errorf("open O_RDWR on the read-only mount: %v, want EROFS", err)
	}
	m := newEmu(t, "phxemu-ro", emuPage, 0)
	r := mustRegister(t, fd, m)
	for _, c := range []struct {
		what string
		fd   int
		msg  []byte
		want unix.Errno
	}{
		{"WRITE", fd, ioMsg(r.id, 0, 4096, 0), unix.EROFS},
		{"WRITE naming no buffer", fd, ioMsg(1<<40, 0, 4096, 0), unix.EROFS},
		{"WRITE past the buffer", fd, ioMsg(r.id, emuPage, 4096, 0), unix.EROFS},
		{"WRITE on a directory", dfd, ioMsg(r.id, 0, 4096, 0), unix.EISDIR},
		{"WRITE at 2^63", fd, ioMsg(r.id, 0, 4096, two63), unix.EINVAL},
	} {
		_, e := abiIOMsg(t, c.fd, true, c.msg)
		wantErrno(t, c.what, e, c.want)
	}
	_, _, e := abiBatch(t, fd, true, 1, []ext{{r.id, 0, 4096, 0}})
	wantErrno(t, "BATCH_WRITE", e, unix.EROFS)
	_, _, e = abiStrided(t, fd, true, 1, []sext{{r.id, 0, 10, 0, 2, 10, 10}})
	wantErrno(t, "BATCH_WRITE_STRIDED", e, unix.EROFS)
	_, _, e = abiStrided(t, fd, true, 1, []sext{{r.id, 0, 1, 0, maxPieces + 1, 1, 1}})
	wantErrno(t, "BATCH_WRITE_STRIDED of too many pieces", e, unix.E2BIG)
	mustEqualFile(t, filepath.Join(d.Backing, "f"), data)
	if n, e := abiIO(t, fd, false, r.id, 0, 4096, 100); e != 0 || n != 4096 || !bytes.Equal(m.mem[:4096], data[100:4196]) {
		t.Errorf("READ on the read-only mount: %d, %s", n, errName(e))
	}
	in, e := abiInfo(t, fd, 0)
	if e != 0 || in.flags&(1<<1) == 0 {
		t.Errorf("INFO on the read-only mount: %s, flags %#x (want bit 1)", errName(e), in.flags)
	}
	if ro := phxInfo(t, path)["read_only"]; ro != "true" {
		t.Errorf("user.phx.info read_only=%s", ro)
	}
	wantErrno(t, "user.phx.load", errnoOf(xattrLoad(path, "token="+r.tokenHex()+",offset=0")), unix.EROFS)
}

// TestABILimits: max_buffers_per_process (EMFILE), max_buffers (ENFILE)
// and max_registered_bytes (ENOMEM), each at its bound and one past it.
func TestABILimits(t *testing.T) {
	d, _, path := startEmuFile(t, 1<<20, "-o", "max_buffers_per_process=2,max_buffers=3,max_registered_bytes=262144")
	fd := openFD(t, path, unix.O_RDONLY)
	reg := func(size int64) (regReply, unix.Errno) {
		t.Helper()
		m := newEmu(t, "phxemu-lim", size, 0)
		return abiRegister(t, fd, vendorEmu, 0, uint64(size), m.handle(0))
	}
	a, e1 := reg(emuPage)
	_, e2 := reg(emuPage)
	if e1 != 0 || e2 != 0 {
		t.Fatalf("two buffers of one process (its bound): %s, %s", errName(e1), errName(e2))
	}
	_, e := reg(emuPage)
	wantErrno(t, "a third buffer of one process", e, unix.EMFILE)
	c := startABIChild(t, nil)
	cfd := c.do(t, "open %s %d", path, unix.O_RDONLY)
	if got := strings.Fields(c.do(t, "reg %s %d", cfd, emuPage)); len(got) != 2 {
		t.Fatalf("another process's buffer, the mount's third (its bound): %v", got)
	}
	if got := c.do(t, "reg %s %d", cfd, emuPage); got != "ENFILE" {
		t.Errorf("the mount's fourth buffer: %s, want ENFILE", got)
	}
	wantErrno(t, "DEREGISTER", abiDeregister(t, fd, a.id), 0)
	// 128 KiB live: 192 KiB more is past 256 KiB, 128 KiB more is the bound.
	_, e = reg(3 * emuPage)
	wantErrno(t, "registering past max_registered_bytes", e, unix.ENOMEM)
	if _, e = reg(2 * emuPage); e != 0 {
		t.Errorf("registering up to max_registered_bytes: %s", errName(e))
	}
	if live := liveAndReleased(t, d.Mnt)[0]; live != 3 {
		t.Errorf("buffers_live = %d, want 3: a refused REGISTER left a buffer", live)
	}
}

// TestABIUserLimits: max_buffers_per_user and max_registered_bytes_per_user
// (EDQUOT) bound one uid in all its processes together, so that no user
// takes the whole mount's room; root's buffers are not counted against
// them, another user's room is its own, and a release gives the room back.
func TestABIUserLimits(t *testing.T) {
	_, _, path := startEmuFile(t, 1<<20, "-o", fmt.Sprintf("allow_other,max_buffers_per_user=2,max_registered_bytes_per_user=%d", 3*emuPage))
	var procs [2]*abiChildProc
	var fds [2]string
	for i := range procs {
		procs[i] = startABIChild(t, asUser(nobody))
		fds[i] = procs[i].do(t, "open %s %d", path, unix.O_RDONLY)
	}
	first := strings.Fields(procs[0].do(t, "reg %s %d", fds[0], emuPage))
	if len(first) != 2 {
		t.Fatalf("uid 65534's first buffer: %v", first)
	}
	if got := strings.Fields(procs[1].do(t, "reg %s %d", fds[1], emuPage)); len(got) != 2 {
		t.Fatalf("uid 65534's second buffer, in another process (the user's bound): %v", got)
	}
	if got := procs[1].do(t, "reg %s %d", fds[1], emuPage); got != "EDQUOT" {
		t.Errorf("uid 65534's third buffer: %s, want EDQUOT", got)
	}
	// Root's buffers count towards the mount's limits only.
	fd := openFD(t, path, unix.O_RDONLY)
	for i := range 3 {
		m := newEmu(t, "phxemu-root", 2*emuPage, 0)
		if _, e := abiRegister(t, fd, vendorEmu, 0, uint64(m.size), m.handle(0)); e != 0 {
			t.Errorf("root's buffer %d beside uid 65534's full room: %s", i+1, errName(e))
		}
	}
	// The user's bytes: one buffer of 64 KiB live, 192 KiB more is past
	// its 192 KiB; after a release, 128 KiB is within.
	if got := procs[0].do(t, "dereg %s %s", fds[0], first[0]); got != "OK" {
		t.Fatalf("DEREGISTER of uid 65534's first buffer: %s", got)
	}
	if got := procs[0].do(t, "reg %s %d", fds[0], 3*emuPage); got != "EDQUOT" {
		t.Errorf("uid 65534 registering past its bytes: %s, want EDQUOT", got)
	}
	if got := strings.Fields(procs[0].do(t, "reg %s %d", fds[0], 2*emuPage)); len(got) != 2 {
		t.Errorf("uid 65534 registering up to its bytes after a release: %v", got)
	}
	// A process's exit gives its user's room back too.
	procs[1].in.Close()
	procs[1].cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := strings.Fields(procs[0].do(t, "reg %s %d", fds[0], emuPage))
		if len(got) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("uid 65534's room after its other process exited: %v", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestABIShutdown: once the daemon logs "shutting down", REGISTER gets
// ESHUTDOWN while a buffer registered before still serves its owner and
// DEREGISTER still works.
func TestABIShutdown(t *testing.T) {
	d, data, path := startEmuFile(t, 1<<20)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	m := newEmu(t, "phxemu-shut", emuPage, 0)
	r := mustRegister(t, fd, m)
	n := newEmu(t, "phxemu-shut2", emuPage, 0)
	d.Signal(syscall.SIGTERM)
	if !d.WaitLog("shutting down", 10e9) {
		t.Fatalf("the daemon never logged shutting down:\n%s", d.Stderr())
	}
	_, e := abiRegister(t, fd, vendorEmu, 0, emuPage, n.handle(0))
	wantErrno(t, "REGISTER after shutting down", e, unix.ESHUTDOWN)
	if n, e := abiIO(t, fd, false, r.id, 0, 4096, 4096); e != 0 || n != 4096 || !bytes.Equal(m.mem[:4096], data[4096:8192]) {
		t.Errorf("READ into the buffer registered before: %d, %s", n, errName(e))
	}
	wantErrno(t, "DEREGISTER after shutting down", abiDeregister(t, fd, r.id), 0)
	_, e = abiIO(t, fd, false, r.id, 0, 4096, 0)
	wantErrno(t, "READ after that DEREGISTER", e, unix.ENOENT)
	unix.Close(fd)
	if _, ok := d.WaitExit(15e9); !ok {
		t.Fatalf("the daemon did not exit after SIGTERM")
	}
}

package fusefs

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"phxmount/client"
)

// TestCheckOrder pins the order of the checks docs/abi.md states: a
// malformed struct first, then the descriptor (EISDIR, EROFS, EBADF,
// EINVAL for O_APPEND), then the buffer (ENOENT, EPERM, EFAULT).
func TestCheckOrder(t *testing.T) {
	ro := newCtlEnv(t, false, true)
	rw := newCtlEnv(t, false, false)
	dirFd, err := unix.Open(t.TempDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirFd)
	dir := &OpenFile{ID: 9001, Fd: dirFd, Flags: unix.O_RDONLY | unix.O_DIRECTORY, Name: "d"}
	rdonly, _ := patternFile(t, 1<<16, unix.O_RDONLY)
	wronly, _ := patternFile(t, 1<<16, unix.O_WRONLY)
	appendf, _ := patternFile(t, 1<<16, unix.O_WRONLY|unix.O_APPEND)
	for _, e := range []*ctlEnv{ro, rw} {
		if _, errno := e.register(t, e.me, rdonly, e.alloc(t, 1<<16)); errno != 0 {
			t.Fatal(errno)
		}
	}
	huge := uint64(math.MaxInt64) + 1
	for _, c := range []struct {
		name string
		e    *ctlEnv
		f    *OpenFile
		cmd  uint32
		req  client.IOReq
		want unix.Errno
	}{
		{"malformed before the directory", rw, dir, client.CmdRead, client.IOReq{ID: 1, Length: 1, FileOffset: huge}, unix.EINVAL},
		{"directory before the read-only mount", ro, dir, client.CmdWrite, client.IOReq{ID: 1, Length: 1}, unix.EISDIR},
		{"read-only mount before the descriptor's mode", ro, rdonly, client.CmdWrite, client.IOReq{ID: 1, Length: 1}, unix.EROFS},
		{"descriptor's mode", rw, rdonly, client.CmdWrite, client.IOReq{ID: 1, Length: 1}, unix.EBADF},
		{"write-only for a read", rw, wronly, client.CmdRead, client.IOReq{ID: 1, Length: 1}, unix.EBADF},
		{"O_APPEND before the buffer", rw, appendf, client.CmdWrite, client.IOReq{ID: 99, Length: 1}, unix.EINVAL},
		{"no such buffer before its range", rw, rdonly, client.CmdRead, client.IOReq{ID: 99, Length: 1 << 30}, unix.ENOENT},
		{"range", rw, rdonly, client.CmdRead, client.IOReq{ID: 1, BufOffset: 1 << 16, Length: 1}, unix.EFAULT},
		{"an offset past 2^63 that also overruns is malformed", rw, rdonly, client.CmdRead, client.IOReq{ID: 1, BufOffset: huge, Length: 1}, unix.EINVAL},
	} {
		in := client.EncodeIO(c.req)
		out := make([]byte, len(in))
		if _, errno := c.e.s.Ioctl(t.Context(), c.e.me, c.f, c.cmd, in, out); errno != c.want {
			t.Errorf("%s: %v, want %v", c.name, errno, c.want)
		}
	}
}

// TestInfoXattrPathOnEveryTarget: user.phx.info has path= for directories
// and the root too, size= and dio_* only for regular files (docs/abi.md).
func TestInfoXattrPathOnEveryTarget(t *testing.T) {
	e := newCtlEnv(t, false, false)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("abc"), 0644)
	open := func(p string) func(int) (int, unix.Errno) {
		return func(flags int) (int, unix.Errno) {
			fd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0)
			return fd, toErrno(err)
		}
	}
	for _, c := range []struct {
		target XattrTarget
		path   string
		file   bool
	}{
		{XattrTarget{Name: "sub", IsDir: true, Open: open(dir)}, "path=sub\n", false},
		{XattrTarget{IsRoot: true, IsDir: true, Open: open(dir)}, "path=.\n", false},
		{XattrTarget{Name: "sub/f", Open: open(filepath.Join(dir, "f"))}, "path=sub/f\n", true},
	} {
		v, errno := e.s.GetXattr(e.me, c.target, XattrInfo)
		if errno != 0 {
			t.Fatal(errno)
		}
		s := string(v)
		if !strings.Contains(s, c.path) || strings.Contains(s, "\nsize=") != c.file || strings.Contains(s, "dio_mem_align=") != c.file {
			t.Errorf("%+v:\n%s", c.target, s)
		}
	}
}

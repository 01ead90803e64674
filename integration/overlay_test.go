package integration

// The overlay as ordinary programs see it: a file written through the
// mount is on the backing directory, coreutils, tar and find work, locks,
// renames under open files, long paths, sparse files and copy ranges,
// statfs and FIFOs behave as on the backing directory, foreign ioctls and
// user.phx.* names never reach it, and permissions (allow_other, ro) are
// the backing files' own.

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/fusefs"
)

// TestMountSmoke checks the helper itself: a file written through the
// mount is on the backing directory, byte for byte.
func TestMountSmoke(t *testing.T) {
	backing, mnt := mountOverlay(t)
	want := []byte("hello through the overlay\n")
	if err := os.WriteFile(filepath.Join(mnt, "f"), want, 0644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(backing, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("backing has %q, want %q", got, want)
	}
}

// TestUnmodifiedTools drives the mount with coreutils, tar and find, with
// passthrough and on the classic path, and compares the whole tree with the
// backing directory after every step.
func TestUnmodifiedTools(t *testing.T) {
	eachPassthrough(t, func(t *testing.T, mode string, d *daemon) {
		backing, mnt := d.Backing, d.Mnt
		if mode == "auto" && !strings.Contains(d.Stderr(), "passthrough active") {
			t.Logf("note: passthrough not active here: %s", d.Stderr())
		}
		if mode == "off" && !strings.Contains(d.Stderr(), "passthrough inactive") {
			t.Errorf("--passthrough off: the mount log does not say passthrough inactive:\n%s", d.Stderr())
		}
		src := t.TempDir()
		data := pattern(3<<20+123, 1)
		if err := os.WriteFile(filepath.Join(src, "data.bin"), data, 0644); err != nil {
			t.Fatal(err)
		}
		sh := func(script string) string {
			t.Helper()
			cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
			cmd.Env = append(os.Environ(), "M="+mnt, "B="+backing, "S="+src, "LC_ALL=C")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s\n%v\n%s", script, err, out)
			}
			return string(out)
		}
		sh(`cp "$S/data.bin" "$M/copy.bin"`)
		mustEqualFile(t, filepath.Join(backing, "copy.bin"), data)
		if got := sh(`cat "$M/copy.bin" | sha256sum`); got != sh(`sha256sum < "$S/data.bin"`) {
			t.Fatalf("cat through the mount: sha256 %s", got)
		}
		sh(`dd if="$S/data.bin" of="$M/dd.bin" bs=64k status=none`)
		sh(`dd if="$M/dd.bin" of="$S/dd-direct.bin" bs=1M iflag=direct status=none`)
		mustEqualFile(t, filepath.Join(src, "dd-direct.bin"), data)
		sh(`dd if="$S/data.bin" of="$M/dd-odirect.bin" bs=1M oflag=direct status=none 2>/dev/null || dd if="$S/data.bin" of="$M/dd-odirect.bin" bs=1M count=3 oflag=direct status=none`)
		if got, want := sh(`sha256sum < "$M/copy.bin"`), sh(`sha256sum < "$B/copy.bin"`); got != want {
			t.Fatalf("sha256sum: mount %s backing %s", got, want)
		}
		sh(`mkdir -p "$M/tree/a/b" && for i in 1 2 3; do echo "file $i" > "$M/tree/a/f$i"; done && echo deep > "$M/tree/a/b/deep"`)
		sh(`ln -s a/f1 "$M/tree/link" && ln "$M/tree/a/f2" "$M/tree/hard"`)
		sh(`chmod 0640 "$M/tree/a/f3" && chmod 0711 "$M/tree/a/b"`)
		sh(`touch -d "2001-02-03 04:05:06.789" "$M/tree/a/f1" && touch -h -d "2002-01-01 00:00:00" "$M/tree/link"`)
		sh(`truncate -s 1000000 "$M/tree/a/sparse" && truncate -s 7 "$M/dd.bin"`)
		sh(`mv "$M/tree/a/f1" "$M/tree/moved" && mv "$M/tree/a/b" "$M/tree/b2"`)
		sh(`cd "$M" && tar -cf "$S/t.tar" tree && mkdir "$M/x" && tar -C "$M/x" -xpf "$S/t.tar"`)
		sh(`cd "$S" && mkdir -p ref && tar -C ref -xpf t.tar && diff -r --no-dereference ref/tree "$M/x/tree"`)
		if got, want := sh(`cd "$M" && find . | sort`), sh(`cd "$B" && find . | sort`); got != want {
			t.Fatalf("find differs:\n%s\n---\n%s", got, want)
		}
		if got, want := sh(`cd "$M" && stat -c '%n %i %s %a %h %u %g %Y %F' $(find . | sort)`),
			sh(`cd "$B" && stat -c '%n %i %s %a %h %u %g %Y %F' $(find . | sort)`); got != want {
			t.Fatalf("stat differs:\n%s\n---\n%s", got, want)
		}
		if n := compareTrees(t, backing, mnt); n < 20 {
			t.Fatalf("compared only %d entries", n)
		}
	})
}

// TestLocks: flock and POSIX locks taken through the mount are the backing
// file's locks.
func TestLocks(t *testing.T) {
	backing, mnt := mountOverlay(t)
	f := filepath.Join(mnt, "lock")
	if err := os.WriteFile(f, []byte("data"), 0644); err != nil {
		t.Fatal(err)
	}
	// flock held through the mount blocks flock -n on the backing file.
	holder := exec.Command("flock", "-o", f, "sleep", "3")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Wait()
	time.Sleep(300 * time.Millisecond)
	if err := exec.Command("flock", "-n", filepath.Join(backing, "lock"), "true").Run(); err == nil {
		t.Fatalf("flock -n on the backing file succeeded while the mount holds it")
	}
	if err := exec.Command("flock", "-n", f, "true").Run(); err == nil {
		t.Fatalf("flock -n through the mount succeeded while another holder has it")
	}
	holder.Process.Kill()
	holder.Wait()
	time.Sleep(100 * time.Millisecond)
	if err := exec.Command("flock", "-n", f, "true").Run(); err != nil {
		t.Fatalf("flock -n after the holder died: %v", err)
	}

	// POSIX: a child locks bytes 0-9 through the mount; the test sees it
	// with F_GETLK on the backing file and through the mount.
	needTool(t, "python3")
	child := exec.Command("python3", "-c", `
import fcntl, sys, time
f = open(sys.argv[1], "r+")
fcntl.lockf(f, fcntl.LOCK_EX, 10, 0)
print("locked", flush=True)
time.sleep(30)
`, f)
	stdout, _ := child.StdoutPipe()
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { child.Process.Kill(); child.Wait() }()
	b := make([]byte, 6)
	if _, err := stdout.Read(b); err != nil || string(b) != "locked" {
		t.Fatalf("child: %q %v", b, err)
	}
	for _, p := range []string{filepath.Join(backing, "lock"), f} {
		fd, err := unix.Open(p, unix.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 10}
		err = unix.FcntlFlock(uintptr(fd), unix.F_GETLK, &lk)
		unix.Close(fd)
		if err != nil || lk.Type != unix.F_WRLCK {
			t.Fatalf("F_GETLK on %s: type %d (%v), want the child's F_WRLCK", p, lk.Type, err)
		}
		fd, _ = unix.Open(p, unix.O_RDWR, 0)
		lk = unix.Flock_t{Type: unix.F_WRLCK, Start: 20, Len: 10}
		err = unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &lk)
		unix.Close(fd)
		if err != nil {
			t.Fatalf("lock of free bytes 20-29 on %s: %v", p, err)
		}
	}
	child.Process.Kill()
	child.Wait()
	time.Sleep(200 * time.Millisecond)
	fd, _ := unix.Open(filepath.Join(backing, "lock"), unix.O_RDWR, 0)
	defer unix.Close(fd)
	lk := unix.Flock_t{Type: unix.F_WRLCK, Len: 10}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_GETLK, &lk); err != nil || lk.Type != unix.F_UNLCK {
		t.Fatalf("the dead child's lock survived: type %d %v", lk.Type, err)
	}
}

// TestConcurrentWriterReader: one writer appends records through the
// mount while a reader follows it through another descriptor; every byte
// the reader sees is what the writer wrote.
func TestConcurrentWriterReader(t *testing.T) {
	backing, mnt := mountOverlay(t)
	p := filepath.Join(mnt, "stream")
	const chunk, chunks = 64 << 10, 128
	data := pattern(chunk*chunks, 7)
	w, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0644)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	var werr error
	go func() {
		defer wg.Done()
		for i := 0; i < chunks; i++ {
			if _, err := w.Write(data[i*chunk : (i+1)*chunk]); err != nil {
				werr = err
				return
			}
		}
	}()
	r, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make([]byte, 0, len(data))
	buf := make([]byte, 100000)
	deadline := time.Now().Add(60 * time.Second)
	for len(got) < len(data) && time.Now().Before(deadline) {
		n, err := r.Read(buf)
		got = append(got, buf[:n]...)
		if n == 0 || err != nil {
			time.Sleep(time.Millisecond)
		}
	}
	wg.Wait()
	w.Close()
	if werr != nil {
		t.Fatal(werr)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("reader saw %d bytes that differ from what was written", len(got))
	}
	mustEqualFile(t, filepath.Join(backing, "stream"), data)
}

// TestForeignIoctlRefused: an ioctl that is not the project's never reaches
// the backing file.
func TestForeignIoctlRefused(t *testing.T) {
	_, mnt := mountOverlay(t)
	p := filepath.Join(mnt, "f")
	if err := os.WriteFile(p, []byte("x"), 0644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var flags int32
	_, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.FS_IOC_GETFLAGS, uintptr(unsafe.Pointer(&flags)))
	if e != unix.ENOTTY {
		t.Fatalf("FS_IOC_GETFLAGS through the mount: %v, want ENOTTY", e)
	}
	// Another made-up restricted ioctl of a type byte nobody uses.
	in := make([]byte, 64)
	cmd := uintptr(3<<30 | 64<<16 | 0xEE<<8 | 0x7F) // _IOWR(0xEE, 0x7F, [64]byte)
	_, _, e = unix.Syscall(unix.SYS_IOCTL, f.Fd(), cmd, uintptr(unsafe.Pointer(&in[0])))
	if e != unix.ENOTTY {
		t.Fatalf("foreign ioctl: %v, want ENOTTY", e)
	}
}

// TestRenameUnderOpenFile: a descriptor keeps writing to its file while the
// file and its directory are renamed, through the mount and on the backing
// directory.
func TestRenameUnderOpenFile(t *testing.T) {
	backing, mnt := mountOverlay(t)
	if err := os.MkdirAll(filepath.Join(mnt, "d1"), 0755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(mnt, "d1", "f"), os.O_CREATE|os.O_RDWR, 0644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write([]byte("one."))
	if err := os.Rename(filepath.Join(mnt, "d1"), filepath.Join(mnt, "d2")); err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("two."))
	if err := os.Rename(filepath.Join(mnt, "d2", "f"), filepath.Join(mnt, "g")); err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("three."))
	// Behind the mount's back.
	if err := os.Rename(filepath.Join(backing, "g"), filepath.Join(backing, "d2", "h")); err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("four."))
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	mustEqualFile(t, filepath.Join(mnt, "d2", "h"), []byte("one.two.three.four."))
	mustEqualFile(t, filepath.Join(backing, "d2", "h"), []byte("one.two.three.four."))
	// fstat of the open file still reports the backing inode.
	var st unix.Stat_t
	unix.Fstat(int(f.Fd()), &st)
	if bst := statOf(t, filepath.Join(backing, "d2", "h")); bst.Ino != st.Ino {
		t.Fatalf("open file ino %d, backing %d", st.Ino, bst.Ino)
	}
	// A directory renamed on the backing side, then its old node used.
	if err := os.Mkdir(filepath.Join(mnt, "x"), 0755); err != nil {
		t.Fatal(err)
	}
	dfd, err := unix.Open(filepath.Join(mnt, "x"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dfd)
	os.Rename(filepath.Join(backing, "x"), filepath.Join(backing, "y"))
	fd, err := unix.Openat(dfd, "inside", unix.O_CREAT|unix.O_WRONLY, 0644)
	if err != nil {
		t.Fatalf("create in a directory renamed on the backing side: %v", err)
	}
	unix.Close(fd)
	if _, err := os.Stat(filepath.Join(backing, "y", "inside")); err != nil {
		t.Fatalf("the file was not created in the renamed directory: %v", err)
	}
}

// TestRenameFlags: RENAME_NOREPLACE and RENAME_EXCHANGE behave as on the
// backing directory.
func TestRenameFlags(t *testing.T) {
	backing, mnt := mountOverlay(t)
	os.WriteFile(filepath.Join(mnt, "a"), []byte("A"), 0644)
	os.WriteFile(filepath.Join(mnt, "b"), []byte("B"), 0644)
	err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(mnt, "a"), unix.AT_FDCWD, filepath.Join(mnt, "b"), unix.RENAME_NOREPLACE)
	if err != unix.EEXIST {
		t.Fatalf("RENAME_NOREPLACE onto an existing name: %v, want EEXIST", err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(mnt, "a"), unix.AT_FDCWD, filepath.Join(mnt, "b"), unix.RENAME_EXCHANGE); err != nil {
		t.Fatalf("RENAME_EXCHANGE: %v", err)
	}
	mustEqualFile(t, filepath.Join(mnt, "a"), []byte("B"))
	mustEqualFile(t, filepath.Join(backing, "b"), []byte("A"))
	compareTrees(t, backing, mnt)
}

// TestLongPaths: a file more than 4096 bytes of path deep, reached with
// relative opens, through the mount and on the backing directory.
func TestLongPaths(t *testing.T) {
	backing, mnt := mountOverlay(t)
	name := strings.Repeat("n", 250)
	walk := func(root string, create bool) int {
		fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 20; i++ {
			if create {
				if err := unix.Mkdirat(fd, name, 0755); err != nil {
					t.Fatalf("mkdir at depth %d: %v", i, err)
				}
			}
			nfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if err != nil {
				t.Fatalf("open at depth %d: %v", i, err)
			}
			unix.Close(fd)
			fd = nfd
		}
		return fd
	}
	data := pattern(10000, 3)
	dfd := walk(mnt, true) // 20 * 251 bytes: more than PATH_MAX
	fd, err := unix.Openat(dfd, "leaf", unix.O_CREAT|unix.O_RDWR, 0640)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(fd, data); err != nil {
		t.Fatal(err)
	}
	var mst unix.Stat_t
	unix.Fstat(fd, &mst)
	unix.Close(fd)
	unix.Close(dfd)
	bfd := walk(backing, false)
	defer unix.Close(bfd)
	var bst unix.Stat_t
	if err := unix.Fstatat(bfd, "leaf", &bst, 0); err != nil {
		t.Fatal(err)
	}
	sameStat(t, "leaf", bst, mst)
	lfd, _ := unix.Openat(bfd, "leaf", unix.O_RDONLY, 0)
	got := make([]byte, 20000)
	n, _ := unix.Read(lfd, got)
	unix.Close(lfd)
	if !bytes.Equal(got[:n], data) {
		t.Fatalf("backing leaf differs")
	}
}

// TestSparseCopyRange: fallocate, SEEK_DATA/SEEK_HOLE and copy_file_range
// through the mount agree with the backing file.
func TestSparseCopyRange(t *testing.T) {
	backing, mnt := mountOverlay(t)
	f, err := os.OpenFile(filepath.Join(mnt, "sparse"), os.O_CREATE|os.O_RDWR, 0644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a, b := pattern(8192, 1), pattern(8192, 2)
	f.WriteAt(a, 0)
	f.WriteAt(b, 16<<20)
	if err := unix.Fallocate(int(f.Fd()), 0, 32<<20, 1<<20); err != nil {
		t.Fatalf("fallocate: %v", err)
	}
	f.Sync()
	bf, _ := os.Open(filepath.Join(backing, "sparse"))
	defer bf.Close()
	for _, c := range []struct {
		off    int64
		whence int
	}{{4096 * 4, unix.SEEK_DATA}, {0, unix.SEEK_HOLE}, {1 << 20, unix.SEEK_DATA}, {16 << 20, unix.SEEK_HOLE}} {
		mo, merr := unix.Seek(int(f.Fd()), c.off, c.whence)
		bo, berr := unix.Seek(int(bf.Fd()), c.off, c.whence)
		if mo != bo || !errors.Is(merr, berr) && merr != berr {
			t.Errorf("lseek(%d, %d): mount %d %v, backing %d %v", c.off, c.whence, mo, merr, bo, berr)
		}
	}
	out, err := os.OpenFile(filepath.Join(mnt, "copy"), os.O_CREATE|os.O_RDWR, 0644)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	offIn, offOut := int64(16<<20), int64(0)
	n, err := unix.CopyFileRange(int(f.Fd()), &offIn, int(out.Fd()), &offOut, 8192, 0)
	if err != nil || n != 8192 {
		t.Fatalf("copy_file_range: %d %v", n, err)
	}
	out.Sync()
	mustEqualFile(t, filepath.Join(backing, "copy"), b)
	sameStat(t, "sparse", statOf(t, filepath.Join(backing, "sparse")), statOf(t, filepath.Join(mnt, "sparse")))
}

// TestStatfsAndMknod: statfs reports the backing file system; a FIFO made
// through the mount is a FIFO on the backing directory.
func TestStatfsAndMknod(t *testing.T) {
	backing, mnt := mountOverlay(t)
	var bs, ms unix.Statfs_t
	unix.Statfs(backing, &bs)
	if err := unix.Statfs(mnt, &ms); err != nil {
		t.Fatal(err)
	}
	if bs.Blocks != ms.Blocks || bs.Bsize != ms.Bsize || bs.Files != ms.Files {
		t.Fatalf("statfs: mount blocks=%d bsize=%d files=%d, backing %d %d %d", ms.Blocks, ms.Bsize, ms.Files, bs.Blocks, bs.Bsize, bs.Files)
	}
	if err := unix.Mkfifo(filepath.Join(mnt, "fifo"), 0600); err != nil {
		t.Fatal(err)
	}
	if st := statOf(t, filepath.Join(backing, "fifo")); st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Fatalf("backing fifo mode %o", st.Mode)
	}
	compareTrees(t, backing, mnt)
}

// TestNilControl: an overlay built without a Control refuses every ioctl
// (ENOTTY) and every user.phx.* name (ENODATA on get, ENOTSUP on set).
func TestNilControl(t *testing.T) {
	backing, mnt, fsys := mountInProcess(t, fusefs.Options{})
	if ok, why := fsys.PassthroughActive(); why == "" {
		t.Errorf("PassthroughActive gives no reason (active %v)", ok)
	}
	p := filepath.Join(mnt, "f")
	if err := os.WriteFile(p, []byte("x"), 0644); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if _, err := unix.Getxattr(p, "user.phx.info", buf); err != unix.ENODATA {
		t.Fatalf("user.phx.info without a control: %v, want ENODATA", err)
	}
	if err := unix.Setxattr(p, "user.phx.load", []byte("token=1"), 0); err != unix.ENOTSUP {
		t.Fatalf("set user.phx.load without a control: %v, want ENOTSUP", err)
	}
	if _, err := unix.Getxattr(filepath.Join(backing, "f"), "user.phx.load", buf); err != unix.ENODATA {
		t.Fatalf("user.phx.load reached the backing file: %v", err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in := make([]byte, 64)
	cmd := uintptr(3<<30 | 64<<16 | 'P'<<8 | 1)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), cmd, uintptr(unsafe.Pointer(&in[0]))); e != unix.ENOTTY {
		t.Fatalf("ioctl without a control: %v, want ENOTTY", e)
	}
	mustEqualFile(t, filepath.Join(backing, "f"), []byte("x"))
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

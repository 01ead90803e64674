package integration

// Locks that wait, taken through the mount by many owners at once: the
// daemon must neither spend a thread on each (the Go runtime dies past
// 10,000) nor keep waiting for a caller the kernel has interrupted.

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// procCount is the daemon's threads (/proc/pid/status) and its open
// descriptors.
func procCount(t testing.TB, pid int) (threads, fds int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("the daemon's status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			fmt.Sscan(v, &threads)
		}
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("the daemon's descriptors: %v", err)
	}
	return threads, len(ents)
}

// lockWhole takes (typ F_WRLCK) or drops (F_UNLCK) an OFD lock of the
// whole file, waiting when cmd is F_OFD_SETLKW.
func lockWhole(fd int, cmd int, typ int16) error {
	lk := unix.Flock_t{Type: typ}
	return unix.FcntlFlock(uintptr(fd), cmd, &lk)
}

// lockedFile makes a file of the mount and returns its path and a
// descriptor that holds an OFD write lock of the whole file (closed at the
// test's end).
func lockedFile(t *testing.T, d *daemon) (string, int) {
	t.Helper()
	path := filepath.Join(d.Mnt, "lock")
	if err := os.WriteFile(path, []byte("locked"), 0644); err != nil {
		t.Fatal(err)
	}
	holder, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(holder) })
	if err := lockWhole(holder, unix.F_OFD_SETLK, unix.F_WRLCK); err != nil {
		t.Fatal(err)
	}
	return path, holder
}

// TestLockWaitersLeaveTheDaemonItsThreads: 400 owners wait for a lock held
// through the mount, half with F_OFD_SETLKW, half with flock(LOCK_EX).
// Each waiting request used to hold one of the daemon's threads in a
// blocking fcntl or flock (313 threads for 300 waiters; 10,050 waiters
// made the runtime exit with "program exceeds 10000-thread limit").
// Now the daemon keeps its threads while they wait, none is granted the
// held lock, and once it is released every waiter gets it in turn.
func TestLockWaitersLeaveTheDaemonItsThreads(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu"))
	pid := d.Cmd.Process.Pid
	path, holder := lockedFile(t, d)
	if err := unix.Flock(holder, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	const waiters = 400
	fds := make([]int, waiters)
	for i := range fds {
		var err error
		if fds[i], err = unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fds[i])
	}
	baseThreads, baseFds := procCount(t, pid)
	var granted atomic.Int32
	done := make(chan error, waiters)
	for i, fd := range fds {
		go func() {
			var err error
			if i%2 == 0 {
				if err = lockWhole(fd, unix.F_OFD_SETLKW, unix.F_WRLCK); err == nil {
					granted.Add(1)
					err = lockWhole(fd, unix.F_OFD_SETLK, unix.F_UNLCK)
				}
			} else if err = unix.Flock(fd, unix.LOCK_EX); err == nil {
				granted.Add(1)
				err = unix.Flock(fd, unix.LOCK_UN)
			}
			done <- err
		}()
	}
	// Every OFD waiter's request has reached the daemon when it holds a
	// lock descriptor for each.
	want := baseFds + waiters/2
	deadline := time.Now().Add(30 * time.Second)
	_, held := procCount(t, pid)
	for held < want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		_, held = procCount(t, pid)
	}
	if held < want {
		t.Fatalf("the daemon holds %d descriptors, want %d (a lock owner's for each of %d waiters)", held, want, waiters/2)
	}
	time.Sleep(200 * time.Millisecond) // the flock waiters' requests, which hold no new descriptor
	threads, _ := procCount(t, pid)
	if n := granted.Load(); n != 0 {
		t.Errorf("%d waiters were granted a lock that is held", n)
	}
	if threads > baseThreads+64 {
		t.Errorf("the daemon runs %d threads with %d lock waiters, %d before: a thread a waiter", threads, waiters, baseThreads)
	}
	d.alive(t, "with the waiters")

	if err := lockWhole(holder, unix.F_OFD_SETLK, unix.F_UNLCK); err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(holder, unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(60 * time.Second)
	for i := range waiters {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("a waiter: %v", err)
			}
		case <-timeout:
			t.Fatalf("%d of %d waiters got the lock within 60 s of its release", i, waiters)
		}
	}
	if n := granted.Load(); n != waiters {
		t.Errorf("%d of %d waiters got the lock", n, waiters)
	}
	d.alive(t, "at the end")
}

// TestInterruptedLockWaitEnds: a process waiting in F_OFD_SETLKW through
// the mount gets a signal. Natively the call ends with EINTR; through the
// mount the kernel sends the daemon an INTERRUPT and waits for its reply.
// The daemon used to stay blocked in its own fcntl, so the caller hung
// until the lock was released, and then the lock went to an owner that
// had stopped asking. Now the wait ends with EINTR, and once the holder
// lets go, the lock is free for the next caller.
func TestInterruptedLockWaitEnds(t *testing.T) {
	needTool(t, "python3")
	d := startDaemon(t, withArgs("--vendor", "emu"))
	path, holder := lockedFile(t, d)
	child := exec.Command("python3", "-c", `
import fcntl, os, signal, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
class Alarm(Exception):
    pass
def ring(*_):
    raise Alarm()
signal.signal(signal.SIGALRM, ring)
signal.alarm(1)
try:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
    print("granted", flush=True)
except Alarm:
    print("interrupted", flush=True)
sys.stdin.read()  # keeps its descriptor, and so its lock owner, open
`, path)
	stdin, _ := child.StdinPipe()
	stdout, _ := child.StdoutPipe()
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); child.Process.Kill(); child.Wait() }()
	said := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		said <- strings.TrimSpace(line)
	}()
	select {
	case got := <-said:
		if got != "interrupted" {
			t.Fatalf("the waiting child said %q, want interrupted", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a lock wait through the mount was not interrupted by SIGALRM within 10 s")
	}
	if err := lockWhole(holder, unix.F_OFD_SETLK, unix.F_UNLCK); err != nil {
		t.Fatal(err)
	}
	// Were the interrupted wait still trying, it would hold the lock within
	// one pause of the release (10 ms at most).
	time.Sleep(200 * time.Millisecond)
	next, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(next)
	if err := lockWhole(next, unix.F_OFD_SETLK, unix.F_WRLCK); err != nil {
		t.Errorf("the lock after its holder let go, with the interrupted waiter still open: %v (the interrupted wait took it)", err)
	}
	d.alive(t, "at the end")
}

// TestLeasedFileLeavesTheDaemonItsThreads: a process holds a lease on a
// file of the backing directory (F_SETLEASE, which a user may take on its
// own files), and 200 opens for writing and a truncate reach it through
// the mount. The kernel makes each wait while the lease is broken (up to
// /proc/sys/fs/lease-break-time, 45 s by default), and each used to hold
// one of the daemon's threads for that long (213 threads for 200 opens).
// Now the daemon keeps its threads, an open with O_NONBLOCK gets
// EWOULDBLOCK at once as natively, and once the holder lets go every open
// and the truncate are done.
func TestLeasedFileLeavesTheDaemonItsThreads(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu"))
	pid := d.Cmd.Process.Pid
	name := "leased"
	if err := os.WriteFile(filepath.Join(d.Backing, name), []byte("leased bytes"), 0644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(d.Mnt, name)
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	lease, err := unix.Open(filepath.Join(d.Backing, name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(lease)
	// The break notice (SIGIO) is ignored by a Go program that does not
	// ask for it.
	if _, err := unix.FcntlInt(uintptr(lease), unix.F_SETLEASE, unix.F_RDLCK); err != nil {
		t.Skipf("skipped: no lease on the backing file system here (%v)", err)
	}
	baseThreads, _ := procCount(t, pid)
	const opens = 200
	var finished atomic.Int32
	done := make(chan error, opens+1)
	for range opens {
		go func() {
			fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
			if err == nil {
				unix.Close(fd)
			}
			finished.Add(1)
			done <- err
		}()
	}
	go func() {
		err := os.Truncate(path, 6)
		finished.Add(1)
		done <- err
	}()
	time.Sleep(time.Second)
	if fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err != unix.EWOULDBLOCK {
		if err == nil {
			unix.Close(fd)
		}
		t.Errorf("an open with O_NONBLOCK of the leased file: %v, want EWOULDBLOCK", err)
	}
	threads, _ := procCount(t, pid)
	if n := finished.Load(); n != 0 {
		t.Errorf("%d opens or truncates of the leased file were done while the lease was held", n)
	}
	if threads > baseThreads+64 {
		t.Errorf("the daemon runs %d threads with %d opens waiting for a lease, %d before: a thread an open", threads, opens+1, baseThreads)
	}
	d.alive(t, "with the opens waiting")
	if _, err := unix.FcntlInt(uintptr(lease), unix.F_SETLEASE, unix.F_UNLCK); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(30 * time.Second)
	for i := range opens + 1 {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("an open or the truncate after the lease was let go: %v", err)
			}
		case <-timeout:
			t.Fatalf("%d of %d opens and truncates done within 30 s of the lease's end", i, opens+1)
		}
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != "leased" {
		t.Errorf("the file after the truncate to 6 bytes: %q, %v", got, err)
	}
	d.alive(t, "at the end")
}

// TestOFDLockEndsWithItsFile: an OFD lock (F_OFD_SETLK) taken through the
// mount ends when its open file is closed, as natively: a process locking
// the backing file directly, and one locking through the mount, then get
// it. The kernel sends no unlock at that close (FLUSH names the closing
// process, not the open file), and the daemon used to keep the lock on
// the owner's backing descriptor until the inode was forgotten.
func TestOFDLockEndsWithItsFile(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu"))
	path := filepath.Join(d.Mnt, "ofd")
	if err := os.WriteFile(path, []byte("ofd lock"), 0644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := lockWhole(fd, unix.F_OFD_SETLK, unix.F_WRLCK); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	for _, p := range []string{filepath.Join(d.Backing, "ofd"), path} {
		var err error
		deadline := time.Now().Add(5 * time.Second) // the RELEASE is sent after close(2) returns
		for {
			next, oerr := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
			if oerr != nil {
				t.Fatal(oerr)
			}
			err = lockWhole(next, unix.F_OFD_SETLK, unix.F_WRLCK)
			unix.Close(next)
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("a lock of %s after the holder's open file was closed: %v", p, err)
		}
	}
}

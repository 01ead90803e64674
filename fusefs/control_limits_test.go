package fusefs

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/emu"
	"github.com/phxmount/phxmount/phxfs"
)

// gatedConnector holds every Import until the gate opens, so that
// REGISTERs overlap for certain.
type gatedConnector struct {
	connector.Connector
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedConnector) Import(dev int, h connector.Handle, size int64, pid int) (connector.Memory, error) {
	g.entered <- struct{}{}
	<-g.gate
	return g.Connector.Import(dev, h, size, pid)
}

func newLimitedCtl(t *testing.T, cfg ControlConfig, gated bool) (*ctlEnv, *gatedConnector) {
	t.Helper()
	conn, err := emu.New(emu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var lc connector.Connector = conn
	var g *gatedConnector
	if gated {
		g = &gatedConnector{Connector: conn, entered: make(chan struct{}, 64), gate: make(chan struct{})}
		lc = g
	}
	lib, err := phxfs.New(phxfs.Config{Connector: lc, Engine: "sync", Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel)
	cfg.Lib, cfg.Log = lib, logrus.NewEntry(log)
	s, err := NewControl(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); lib.Close() })
	return &ctlEnv{s: s, conn: conn, lib: lib, me: Caller{Tgid: os.Getpid(), Tid: unix.Gettid(), UID: uint32(os.Getuid())}}, g
}

// TestConcurrentRegistersKeepTheProcessLimit: REGISTERs in flight at once
// cannot pass MaxBuffersPerProcess together (the check used to be made,
// then the lock dropped for the import).
func TestConcurrentRegistersKeepTheProcessLimit(t *testing.T) {
	const limit, tries = 3, 8
	e, g := newLimitedCtl(t, ControlConfig{MaxBuffersPerProcess: limit}, true)
	f, _ := patternFile(t, 4096, unix.O_RDONLY)
	mems := make([]*emu.Memory, tries)
	for i := range mems {
		mems[i] = e.alloc(t, 64<<10)
	}
	errnos := make([]syscall.Errno, tries)
	var wg sync.WaitGroup
	for i := range mems {
		wg.Add(1)
		go func() { defer wg.Done(); _, errnos[i] = e.register(t, e.me, f, mems[i]) }()
	}
	// Every REGISTER that passed the limit is now inside Import; the others
	// were refused without waiting.
	for i := 0; i < limit; i++ {
		select {
		case <-g.entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d REGISTERs reached the import", i)
		}
	}
	close(g.gate)
	wg.Wait()
	ok, emfile := 0, 0
	for _, e := range errnos {
		switch e {
		case 0:
			ok++
		case unix.EMFILE:
			emfile++
		default:
			t.Errorf("REGISTER: %v", e)
		}
	}
	if ok != limit || emfile != tries-limit {
		t.Errorf("%d concurrent REGISTERs with a limit of %d: %d registered, %d EMFILE", tries, limit, ok, emfile)
	}
}

// TestMountLimits: the mount's buffer count (ENFILE) and registered bytes
// (ENOMEM) are bounded too, and a release gives the room back.
func TestMountLimits(t *testing.T) {
	e, _ := newLimitedCtl(t, ControlConfig{MaxBuffers: 2, MaxRegisteredBytes: 192 << 10}, false)
	f, _ := patternFile(t, 4096, unix.O_RDONLY)
	a, errno := e.register(t, e.me, f, e.alloc(t, 128<<10))
	if errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := e.register(t, e.me, f, e.alloc(t, 128<<10)); errno != unix.ENOMEM {
		t.Errorf("past the mount's bytes: %v, want ENOMEM", errno)
	}
	if _, errno := e.register(t, e.me, f, e.alloc(t, 64<<10)); errno != 0 {
		t.Errorf("within the bytes: %v", errno)
	}
	if _, errno := e.register(t, e.me, f, e.alloc(t, 64<<10)); errno != unix.ENFILE {
		t.Errorf("past the mount's buffers: %v, want ENFILE", errno)
	}
	if errno := e.s.deregister(e.me, a.ID); errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := e.register(t, e.me, f, e.alloc(t, 128<<10)); errno != 0 {
		t.Errorf("after a release: %v", errno)
	}
}

// TestUserLimits: a uid other than root holds at most MaxBuffersPerUser
// buffers and MaxRegisteredBytesPerUser bytes (EDQUOT), whatever its
// processes; root's and another user's buffers are not counted against
// it; a refused REGISTER and a release give the room back.
func TestUserLimits(t *testing.T) {
	e, _ := newLimitedCtl(t, ControlConfig{MaxBuffersPerUser: 2, MaxRegisteredBytesPerUser: 256 << 10}, false)
	f, _ := patternFile(t, 4096, unix.O_RDONLY)
	user := e.me
	user.UID = 4242
	other, root := user, user
	other.UID, root.UID = 4243, 0
	a, errno := e.register(t, user, f, e.alloc(t, 64<<10))
	if errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := e.register(t, user, f, e.alloc(t, 256<<10)); errno != unix.EDQUOT {
		t.Errorf("past the user's bytes: %v, want EDQUOT", errno)
	}
	if _, errno := e.register(t, user, f, e.alloc(t, 128<<10)); errno != 0 {
		t.Errorf("a second buffer within the user's bytes: %v", errno)
	}
	// 192 KiB of 256 live: 64 KiB more is within the bytes, not the count.
	if _, errno := e.register(t, user, f, e.alloc(t, 64<<10)); errno != unix.EDQUOT {
		t.Errorf("past the user's buffers: %v, want EDQUOT", errno)
	}
	for i := range 3 {
		if _, errno := e.register(t, root, f, e.alloc(t, 256<<10)); errno != 0 {
			t.Errorf("root's buffer %d beside a full user: %v", i+1, errno)
		}
	}
	if _, errno := e.register(t, other, f, e.alloc(t, 256<<10)); errno != 0 {
		t.Errorf("another user's buffer beside a full user: %v", errno)
	}
	if errno := e.s.deregister(user, a.ID); errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := e.register(t, user, f, e.alloc(t, 64<<10)); errno != 0 {
		t.Errorf("after a release: %v", errno)
	}
	e.s.mu.Lock()
	got := e.s.users
	e.s.mu.Unlock()
	if len(got) != 2 || got[4242] != (userUse{2, 192 << 10}) || got[4243] != (userUse{1, 256 << 10}) {
		t.Errorf("per-user use %+v, want 4242: 2 buffers of 192 KiB, 4243: 1 of 256 KiB, root uncounted", got)
	}
}

// TestMountLimitsFitTheDaemon: whatever max_buffers says, the mount's
// buffers stop (ENFILE) where the daemon's room does: a quarter of its
// descriptors and of vm.max_map_count (every registration maps memory;
// at 65,536 registrations, the default max_buffers, the daemon would pass
// the kernel's default of 65,530 mappings and die at its next heap growth).
func TestMountLimitsFitTheDaemon(t *testing.T) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	room := daemonRoom()
	if uint64(room) > rl.Cur/4 {
		t.Errorf("room for %d buffers with RLIMIT_NOFILE %d", room, rl.Cur)
	}
	if b, err := os.ReadFile("/proc/sys/vm/max_map_count"); err == nil {
		var maps int
		if _, err := fmt.Sscan(string(b), &maps); err == nil && room > maps/4 {
			t.Errorf("room for %d buffers with vm.max_map_count %d", room, maps)
		}
	}

	defer func(f func() int) { daemonRoom = f }(daemonRoom)
	daemonRoom = func() int { return 2 }
	e, _ := newLimitedCtl(t, ControlConfig{}, false)
	f, _ := patternFile(t, 4096, unix.O_RDONLY)
	a, errno := e.register(t, e.me, f, e.alloc(t, 64<<10))
	if errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := e.register(t, e.me, f, e.alloc(t, 64<<10)); errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := e.register(t, e.me, f, e.alloc(t, 64<<10)); errno != unix.ENFILE {
		t.Errorf("past the daemon's room: %v, want ENFILE", errno)
	}
	if errno := e.s.deregister(e.me, a.ID); errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := e.register(t, e.me, f, e.alloc(t, 64<<10)); errno != 0 {
		t.Errorf("after a release: %v", errno)
	}
}

// TestReusedPidKeepsItsBuffers: a process registering under the number of
// one that died before the reaper took its event gets a room of its own,
// and the dead one's event, when it comes, releases only the dead one's
// buffers (it used to release the new process's too).
func TestReusedPidKeepsItsBuffers(t *testing.T) {
	e, _ := newLimitedCtl(t, ControlConfig{MaxBuffersPerProcess: 1}, false)
	f, _ := patternFile(t, 4096, unix.O_RDONLY)
	old, errno := e.register(t, e.me, f, e.alloc(t, 64<<10))
	if errno != 0 {
		t.Fatal(errno)
	}
	// The process that registered old is gone: its pidfd (a dead child's
	// here) says it exited, and its number is this process's now.
	child := exec.Command("true")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	dead, err := unix.PidfdOpen(child.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dead)
	child.Wait()
	e.s.mu.Lock()
	e.s.procs[e.me.Tgid].pidfd = dead
	e.s.mu.Unlock()

	mine, errno := e.register(t, e.me, f, e.alloc(t, 64<<10))
	if errno != 0 {
		t.Fatalf("a REGISTER under a dead process's number (its limit 1, the dead one's buffer counted): %v", errno)
	}
	e.s.ownerExited(e.me.Tgid, dead) // the dead one's event, late
	if _, errno := e.read(e.me, f, client.IOReq{ID: mine.ID, Length: 4096}); errno != 0 {
		t.Errorf("READ into the new process's buffer after the dead one's event: %v", errno)
	}
	if _, errno := e.read(e.me, f, client.IOReq{ID: old.ID, Length: 4096}); errno != unix.ENOENT {
		t.Errorf("READ into the dead process's buffer: %v, want ENOENT", errno)
	}
}

// TestReaperIgnoresStaleEvents: an event for a pidfd that was removed,
// whose number now follows a live process, must not report that process
// dead; the live one's own death is reported.
func TestReaperIgnoresStaleEvents(t *testing.T) {
	died := make(chan int, 4)
	r, err := newReaper(func(tgid, pidfd int) { died <- tgid })
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	start := func() (*exec.Cmd, int) {
		cmd := exec.Command("sleep", "30")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		return cmd, pidfd
	}
	_, fd1 := start()
	if err := r.add(fd1, 1); err != nil {
		t.Fatal(err)
	}
	stale := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd1), Pad: int32(r.gen)}
	r.remove(fd1)
	live, fd2 := start()
	if fd2 != fd1 {
		t.Logf("the pidfd number was not reused (%d, %d): the generation still decides", fd1, fd2)
	}
	if err := r.add(fd2, live.Process.Pid); err != nil {
		t.Fatal(err)
	}
	stale.Fd = int32(fd2)
	if _, ok := r.take(stale); ok {
		t.Fatalf("an event of the removed pidfd was taken for the live process on the same number")
	}
	current := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd2), Pad: int32(r.gen)}
	if _, ok := r.take(current); ok {
		t.Fatalf("a live process was taken for dead")
	}
	live.Process.Kill()
	select {
	case tgid := <-died:
		if tgid != live.Process.Pid {
			t.Fatalf("reported %d dead, want %d", tgid, live.Process.Pid)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the death of %d was not reported", live.Process.Pid)
	}
}

package fusefs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/fscred"
	"github.com/phxmount/phxmount/internal/procfs"
)

// onCredThread runs on a credThread with cr and reports that thread's id
// and credentials as the kernel saw them inside the job.
func onCredThread(t *testing.T, cr callerCreds, also func() unix.Errno) (int, fscred.State) {
	t.Helper()
	return inJob(t, func(fn func() unix.Errno) unix.Errno { return runOnCredThread(&cr, -1, fn) }, cr, also)
}

// inJob runs a job with run (runAs or runOnCredThread) and reports the
// thread's id and credentials as the kernel saw them inside it.
func inJob(t *testing.T, run func(func() unix.Errno) unix.Errno, cr callerCreds, also func() unix.Errno) (int, fscred.State) {
	t.Helper()
	var tid int
	var st fscred.State
	e := run(func() unix.Errno {
		tid = unix.Gettid()
		var e unix.Errno
		if st, e = fscred.Current(); e != 0 {
			return e
		}
		if also != nil {
			return also()
		}
		return 0
	})
	if e != 0 {
		t.Fatalf("job as %d: %v", cr.FSUID, e)
	}
	return tid, st
}

// TestCredThreadsTakeAndGiveBack: a credThread has exactly the caller's
// credentials during a job, and the daemon's again after it: the next job,
// on the same thread, starts from the daemon's.
func TestCredThreadsTakeAndGiveBack(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fusefs: skipped: taking a caller's credentials needs root")
	}
	daemon, e := fscred.Current()
	if e != 0 {
		t.Fatal(e)
	}
	setAsideIdleCredThreads(t)
	user := callerCreds{FSUID: 1000, FSGID: 1001, Groups: []int{7, 1001}}
	tid1, in := onCredThread(t, user, nil)
	if in.FSUID != 1000 || in.FSGID != 1001 || !slices.Equal(in.Groups, []int{7, 1001}) {
		t.Errorf("inside the job: fsuid %d fsgid %d groups %v, want 1000 1001 [7 1001]", in.FSUID, in.FSGID, in.Groups)
	}
	if in.Caps[0].Effective != 0 || in.Caps[1].Effective != 0 {
		t.Errorf("inside the job of a caller with no capabilities: effective %#x %#x", in.Caps[0].Effective, in.Caps[1].Effective)
	}
	waitIdleCredThread(t)
	root := callerCreds{FSUID: 0, FSGID: 0, Groups: daemon.Groups,
		CapEff: [2]uint32{daemon.Caps[0].Effective, daemon.Caps[1].Effective}}
	tid2, back := onCredThread(t, root, nil)
	if tid2 != tid1 {
		t.Errorf("the second job ran on thread %d, not on the idle thread %d", tid2, tid1)
	}
	if !back.Equal(daemon) {
		t.Errorf("a job as the daemon after a job as uid 1000 saw %+v, want %+v", back, daemon)
	}
}

// TestThreadEndsWhenItCannotGiveBack: a job that leaves its thread unable
// to take the daemon's credentials back (here it drops a capability from
// the thread's permitted set) ends that thread, whether the job ran where
// it was served (runAs) or on a credThread; the next job runs on another
// thread with the daemon's full credentials.
func TestThreadEndsWhenItCannotGiveBack(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fusefs: skipped: taking a caller's credentials needs root")
	}
	daemon, e := fscred.Current()
	if e != 0 {
		t.Fatal(e)
	}
	const capMknod = 27
	if daemon.Caps[0].Permitted&(1<<capMknod) == 0 {
		t.Fatalf("the test process lacks CAP_MKNOD (permitted %#x)", daemon.Caps[0].Permitted)
	}
	dropMknod := func() unix.Errno {
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			return toErrno(err)
		}
		data[0].Permitted &^= 1 << capMknod
		data[0].Effective &^= 1 << capMknod
		return toErrno(unix.Capset(&hdr, &data[0]))
	}
	user := callerCreds{FSUID: 1000, FSGID: 1000}
	runners := map[string]func(callerCreds, func() unix.Errno) unix.Errno{
		"where served": runAs,
		"credThread":   func(cr callerCreds, fn func() unix.Errno) unix.Errno { return runOnCredThread(&cr, -1, fn) },
	}
	for name, run := range runners {
		t.Run(name, func(t *testing.T) {
			tid, _ := inJob(t, func(fn func() unix.Errno) unix.Errno { return run(user, fn) }, user, dropMknod)
			if tid == os.Getpid() {
				t.Fatalf("a job ran on the main thread, which the runtime cannot end")
			}
			waitThreadGone(t, tid)
			self := callerCreds{Groups: daemon.Groups, CapEff: [2]uint32{daemon.Caps[0].Effective, daemon.Caps[1].Effective}}
			tid2, st := inJob(t, func(fn func() unix.Errno) unix.Errno { return run(self, fn) }, self, nil)
			if tid2 == tid {
				t.Fatalf("a job ran on the thread that should have ended (%d)", tid)
			}
			if st.Caps[0].Permitted&(1<<capMknod) == 0 {
				t.Errorf("the next thread lacks CAP_MKNOD too: permitted %#x", st.Caps[0].Permitted)
			}
		})
	}
}

// waitThreadGone waits until thread tid of this process has ended.
func waitThreadGone(t *testing.T, tid int) {
	t.Helper()
	task := "/proc/self/task/" + strconv.Itoa(tid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(task); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d still lives after it could not take the daemon's credentials back", tid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestJobsWhereServedGiveBack: a job run where it is served has exactly
// the caller's credentials inside, and afterwards every thread of the
// process has the daemon's again, after many jobs of several callers at
// once (a thread that kept a caller's credentials would serve the next
// goroutine with them).
func TestJobsWhereServedGiveBack(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fusefs: skipped: taking a caller's credentials needs root")
	}
	daemon, e := fscred.Current()
	if e != 0 {
		t.Fatal(e)
	}
	user := callerCreds{FSUID: 1000, FSGID: 1001, Groups: []int{7, 1001}}
	_, in := inJob(t, func(fn func() unix.Errno) unix.Errno { return runAs(user, fn) }, user, nil)
	if in.FSUID != 1000 || in.FSGID != 1001 || !slices.Equal(in.Groups, []int{7, 1001}) || in.Caps[0].Effective != 0 || in.Caps[1].Effective != 0 {
		t.Errorf("inside the job: fsuid %d fsgid %d groups %v effective %#x %#x, want 1000 1001 [7 1001] 0 0",
			in.FSUID, in.FSGID, in.Groups, in.Caps[0].Effective, in.Caps[1].Effective)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				cr := callerCreds{FSUID: uint32(2000 + g), FSGID: uint32(3000 + i%3), Groups: []int{4000 + g}}
				e := runAs(cr, func() unix.Errno {
					if u, _ := unix.SetfsuidRetUid(-1); u != int(cr.FSUID) {
						return unix.EBADE
					}
					return 0
				})
				if e != 0 {
					errs <- fmt.Sprintf("job %d of goroutine %d: %v", i, g, e)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	want := statusCreds(daemon)
	tasks, _ := filepath.Glob("/proc/self/task/*/status")
	for _, p := range tasks {
		if got, err := taskCreds(p); err == nil && got != want {
			t.Errorf("%s after the jobs: %s, want the daemon's %s", p, got, want)
		}
	}
}

// statusCreds is how /proc/<tid>/status shows s: the fsuid, fsgid, groups
// and effective capabilities.
func statusCreds(s fscred.State) string {
	eff := uint64(s.Caps[1].Effective)<<32 | uint64(s.Caps[0].Effective)
	return fmt.Sprintf("fsuid %d fsgid %d groups %v CapEff %016x", s.FSUID, s.FSGID, s.Groups, eff)
}

// taskCreds reads a thread's credentials from its status file, as
// statusCreds writes them.
func taskCreds(p string) (string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	field := func(name string) []string {
		v, _ := procfs.Field(b, name)
		return strings.Fields(string(v))
	}
	uid, gid := field("Uid:"), field("Gid:")
	if len(uid) < 4 || len(gid) < 4 {
		return "", fmt.Errorf("%s: no Uid or Gid line", p)
	}
	groups := []int{}
	for _, g := range field("Groups:") {
		n, _ := strconv.Atoi(g)
		groups = append(groups, n)
	}
	return fmt.Sprintf("fsuid %s fsgid %s groups %v CapEff %s", uid[3], gid[3], groups, field("CapEff:")[0]), nil
}

// TestCredThreadUmaskIsItsOwn: a job given a umask runs on a credThread
// whose umask is that one while the process's (every other thread's)
// stays as it was, and a file it creates gets the mode the umask leaves;
// the thread's umask is its own again after the job.
func TestCredThreadUmaskIsItsOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fusefs: skipped: taking a caller's credentials needs root")
	}
	old := unix.Umask(0)
	unix.Umask(old)
	dir := t.TempDir()
	user := callerCreds{FSUID: 0, FSGID: 0}
	var inside, process int
	e := runOnCredThread(&user, 0o077, func() unix.Errno {
		inside = unix.Umask(0o077)
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(os.Getpid()) + "/status")
		v, _ := procfs.Field(b, "Umask:")
		n, _ := strconv.ParseInt(string(v), 8, 32)
		process = int(n)
		fd, err := unix.Open(filepath.Join(dir, "f"), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o666)
		if err == nil {
			unix.Close(fd)
		}
		return toErrno(err)
	})
	if e != 0 {
		t.Fatal(e)
	}
	if inside != 0o077 || process != old {
		t.Errorf("inside the job: the thread's umask %#o, the process's %#o; want 077 and %#o", inside, process, old)
	}
	if st := statOf(t, filepath.Join(dir, "f")); st.Mode&0o777 != 0o600 {
		t.Errorf("created with 0666 under umask 077: mode %#o, want 0600", st.Mode&0o777)
	}
	if now := unix.Umask(old); now != old {
		t.Errorf("the process umask is %#o after the job, want %#o", now, old)
	}
	e = runOnCredThread(&user, -1, func() unix.Errno {
		inside = unix.Umask(0)
		unix.Umask(inside)
		return 0
	})
	if e != 0 || inside != old {
		t.Errorf("the next job without a umask saw %#o (%v), want the thread's own %#o", inside, e, old)
	}
}

// statOf stats p.
func statOf(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// waitIdleCredThread waits until a credThread has given its job's
// credentials back and waits for the next.
func waitIdleCredThread(t *testing.T) {
	t.Helper()
	for i := 0; len(idleCredThreads) == 0; i++ {
		if i == 1000 {
			t.Fatalf("no credThread became idle in 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// setAsideIdleCredThreads empties the idle pool for the test (so that the
// test's jobs run on threads it knows) and puts the threads back after.
func setAsideIdleCredThreads(t *testing.T) {
	var aside []*credThread
	for len(idleCredThreads) > 0 {
		aside = append(aside, <-idleCredThreads)
	}
	t.Cleanup(func() {
		for _, th := range aside {
			select {
			case idleCredThreads <- th:
			default:
			}
		}
	})
}

// TestCallerLikeTheDaemonRunsInPlace: a caller whose credentials a
// credThread would copy exactly (this root test process) is served on the
// calling thread; another (a process of uid 1000) on a credThread.
func TestCallerLikeTheDaemonRunsInPlace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fusefs: skipped: taking a caller's credentials needs root")
	}
	for _, c := range []struct {
		who     string
		caller  Caller
		inPlace bool
	}{
		{"this process", Caller{Tid: os.Getpid(), Tgid: os.Getpid(), UID: 0, GID: 0}, true},
		{"uid 1000", processAs(t, 1000), false},
	} {
		var tid int
		runtime.LockOSThread()
		e := asCaller(c.caller, nil, func() unix.Errno { tid = unix.Gettid(); return 0 })
		here := unix.Gettid()
		runtime.UnlockOSThread()
		if e != 0 || (tid == here) != c.inPlace {
			t.Errorf("%s: %v, ran on thread %d, the caller's is %d (in place: want %v)", c.who, e, tid, here, c.inPlace)
		}
	}
}

// TestLikeTheDaemonNeedsItsCapabilitiesAndNamespace: a caller is served as
// the daemon without a look at its groups only where it has the daemon's
// effective capabilities in the daemon's user namespace: this root test
// process is; root with CAP_DAC_OVERRIDE out of its bounding set (so out
// of every set after exec) and root of a user namespace of its own (every
// capability there, uid 0 mapped to 0) are not; and on a network file
// system the groups are read even for this process.
func TestLikeTheDaemonNeedsItsCapabilitiesAndNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fusefs: skipped: taking a caller's credentials needs root")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Fatalf("setpriv (util-linux, scripts/deps.sh) is needed: %v", err)
	}
	self := Caller{Tid: unix.Gettid(), Tgid: os.Getpid(), UID: 0, GID: 0}
	noDAC := startAs(t, exec.Command("setpriv", "--bounding-set=-dac_override", "--inh-caps=-all", "sleep", "60"), nil)
	userns := startAs(t, exec.Command("sleep", "60"), &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}}})
	for _, c := range []struct {
		who    string
		caller Caller
		want   bool
	}{
		{"this process", self, true},
		{"root without CAP_DAC_OVERRIDE", noDAC, false},
		{"root of a user namespace", userns, false},
	} {
		got, e := likeTheDaemon(c.caller)
		if e != 0 || got != c.want {
			t.Errorf("%s: likeTheDaemon %v, %v; want %v", c.who, got, e, c.want)
		}
	}
	// Root with every capability and other groups: served as the daemon
	// on a local file system, judged with its groups on a network one.
	groups := startAs(t, exec.Command("sleep", "60"), &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{4242, 4243}}})
	for _, c := range []struct {
		pol  *fsPolicy
		want bool
	}{{&fsPolicy{}, true}, {&fsPolicy{network: true}, false}, {nil, false}} {
		if _, e, self := callerOrSelf(groups, c.pol); e != 0 || self != c.want {
			t.Errorf("root with groups [4242 4243], policy %+v: served as the daemon %v (%v), want %v", c.pol, self, e, c.want)
		}
	}
}

// startAs starts cmd with attr (nil: as it is), which must wait for the
// test, and returns it as a Caller.
func startAs(t *testing.T, cmd *exec.Cmd, attr *syscall.SysProcAttr) Caller {
	t.Helper()
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	// setpriv drops the capabilities, then execs sleep: wait for the exec.
	for i := 0; i < 500; i++ {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); err == nil && strings.TrimSpace(string(b)) == "sleep" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return Caller{Tid: pid, Tgid: pid, UID: 0, GID: 0}
}

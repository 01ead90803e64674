package fusefs

import (
	"os"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// onCredThread runs on a credThread with cr and reports that thread's id
// and credentials as the kernel saw them inside the job.
func onCredThread(t *testing.T, cr callerCreds, also func() unix.Errno) (int, threadState) {
	t.Helper()
	var tid int
	var st threadState
	e := runAs(cr, func() unix.Errno {
		tid = unix.Gettid()
		var e unix.Errno
		if st, e = threadCreds(); e != 0 {
			return e
		}
		if also != nil {
			return also()
		}
		return 0
	})
	if e != 0 {
		t.Fatalf("runAs %d: %v", cr.fsuid, e)
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
	daemon, e := threadCreds()
	if e != 0 {
		t.Fatal(e)
	}
	setAsideIdleCredThreads(t)
	user := callerCreds{fsuid: 1000, fsgid: 1001, groups: []int{7, 1001}}
	tid1, in := onCredThread(t, user, nil)
	if in.fsuid != 1000 || in.fsgid != 1001 || !slices.Equal(in.groups, []int{7, 1001}) {
		t.Errorf("inside the job: fsuid %d fsgid %d groups %v, want 1000 1001 [7 1001]", in.fsuid, in.fsgid, in.groups)
	}
	if in.caps[0].Effective != 0 || in.caps[1].Effective != 0 {
		t.Errorf("inside the job of a caller with no capabilities: effective %#x %#x", in.caps[0].Effective, in.caps[1].Effective)
	}
	waitIdleCredThread(t)
	root := callerCreds{fsuid: 0, fsgid: 0, groups: daemon.groups,
		capEff: [2]uint32{daemon.caps[0].Effective, daemon.caps[1].Effective}}
	tid2, back := onCredThread(t, root, nil)
	if tid2 != tid1 {
		t.Errorf("the second job ran on thread %d, not on the idle thread %d", tid2, tid1)
	}
	if !back.equal(daemon) {
		t.Errorf("a job as the daemon after a job as uid 1000 saw %+v, want %+v", back, daemon)
	}
}

// TestCredThreadEndsWhenItCannotGiveBack: a job that leaves its thread
// unable to take the daemon's credentials back (here it drops a capability
// from the thread's permitted set) ends that thread; the next job runs on
// another thread with the daemon's full credentials.
func TestCredThreadEndsWhenItCannotGiveBack(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fusefs: skipped: taking a caller's credentials needs root")
	}
	daemon, e := threadCreds()
	if e != 0 {
		t.Fatal(e)
	}
	const capMknod = 27
	if daemon.caps[0].Permitted&(1<<capMknod) == 0 {
		t.Fatalf("the test process lacks CAP_MKNOD (permitted %#x)", daemon.caps[0].Permitted)
	}
	user := callerCreds{fsuid: 1000, fsgid: 1000}
	tid, _ := onCredThread(t, user, func() unix.Errno {
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			return toErrno(err)
		}
		data[0].Permitted &^= 1 << capMknod
		data[0].Effective &^= 1 << capMknod
		return toErrno(unix.Capset(&hdr, &data[0]))
	})
	if tid == os.Getpid() {
		t.Fatalf("a credThread ran on the main thread, which the runtime cannot end")
	}
	task := "/proc/self/task/" + strconv.Itoa(tid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(task); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d still lives after it could not take the daemon's credentials back", tid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	tid2, st := onCredThread(t, callerCreds{groups: daemon.groups,
		capEff: [2]uint32{daemon.caps[0].Effective, daemon.caps[1].Effective}}, nil)
	if tid2 == tid {
		t.Fatalf("a job ran on the thread that should have ended (%d)", tid)
	}
	if st.caps[0].Permitted&(1<<capMknod) == 0 {
		t.Errorf("the next thread lacks CAP_MKNOD too: permitted %#x", st.caps[0].Permitted)
	}
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
		e := asCaller(c.caller, func() unix.Errno { tid = unix.Gettid(); return 0 })
		here := unix.Gettid()
		runtime.UnlockOSThread()
		if e != 0 || (tid == here) != c.inPlace {
			t.Errorf("%s: %v, ran on thread %d, the caller's is %d (in place: want %v)", c.who, e, tid, here, c.inPlace)
		}
	}
}

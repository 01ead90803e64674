package integration

// One request from any local user must never take the root daemon down
// or cost it more than a bounded multiple of the bytes it moves
// (docs/abi.md, "Limits"). Here an unprivileged user (uid 65534) sends
// what used to kill the daemon, and what used to make it populate the
// user's sparse memory; the daemon answers each with an errno, stays up,
// serves the mount, and its memory stays where it was.

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/connector/emu"
)

// procKB reads a "Name:   N kB" line of /proc/<pid>/status, in bytes.
func procKB(t testing.TB, pid int, name string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("the daemon's status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q", name, line)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", name, pid)
	return 0
}

// capDaemonMemory limits the daemon's address space to what it has now
// plus room bytes: a daemon that a request makes allocate without bound
// dies of it (the test then fails) instead of taking the machine down.
func capDaemonMemory(t testing.TB, d *daemon, room int64) {
	t.Helper()
	pid := d.Cmd.Process.Pid
	limit := uint64(procKB(t, pid, "VmSize") + room)
	if err := unix.Prlimit(pid, unix.RLIMIT_AS, &unix.Rlimit{Cur: limit, Max: limit}, nil); err != nil {
		t.Fatalf("prlimit the daemon: %v", err)
	}
}

// alive fails the test if the daemon has exited.
func (d *daemon) alive(t testing.TB, when string) {
	t.Helper()
	select {
	case <-d.exited:
		t.Fatalf("the daemon died %s (%v):\n%s", when, d.exitErr, d.Stderr())
	default:
	}
}

// hostileFile makes a file of the mount that uid 65534 may write, and
// returns its bytes and its path through the mount.
func hostileFile(t testing.TB, d *daemon, name string, size int64) ([]byte, string) {
	t.Helper()
	data := writePattern(t, filepath.Join(d.Backing, name), size, 0644)
	if err := os.Chown(filepath.Join(d.Backing, name), nobody, nobody); err != nil {
		t.Fatal(err)
	}
	return data, filepath.Join(d.Mnt, name)
}

// TestHostileStridedBatches: uid 65534, on a file it may write, sends the
// strided write of count 2^32 naming a made-up buffer id, and the strided
// read of 2^26 one-byte pieces into a 64 MiB buffer of its own; both used
// to end the daemon ("fatal error: out of memory"). Each gets E2BIG, the
// daemon's peak memory stays within a few MiB of where it was, and the
// mount serves both users afterwards, byte for byte.
func TestHostileStridedBatches(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu", "-o", "allow_other"))
	data, path := hostileFile(t, d, "victim", 1<<20)
	pid := d.Cmd.Process.Pid
	capDaemonMemory(t, d, 1<<30)
	hwm := procKB(t, pid, "VmHWM")

	c := startChildProc(t, "TestBoundsHelperChild", &syscall.SysProcAttr{Credential: asUser(nobody)}, "strided", path)
	for _, what := range []string{"WRITE2^32", "WRITE2^32x1", "READ2^26"} {
		if got := c.expect(t, what); got != "E2BIG" {
			t.Errorf("%s: %s, want E2BIG", what, got)
		}
	}
	if got := c.expect(t, "AFTER"); got != "OK" {
		t.Errorf("a READ by the same user afterwards: %s", got)
	}
	d.alive(t, "after the hostile batches")
	if grew := procKB(t, pid, "VmHWM") - hwm; grew > 32<<20 {
		t.Errorf("the daemon's peak resident memory grew by %d MiB", grew>>20)
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("reading the file through the mount afterwards: %d bytes, %v", len(got), err)
	}
	d.alive(t, "at the end")
	t.Logf("daemon VmHWM %d MiB, VmRSS %d MiB", procKB(t, pid, "VmHWM")>>20, procKB(t, pid, "VmRSS")>>20)
}

// TestHostileSparseRegister: uid 65534 ftruncates a 2 GiB memfd, never
// writes it, and registers it: EFAULT (no memory of its own is there,
// docs/abi.md "The emu handle"), and the daemon's resident memory does not
// grow (it used to populate all 2 GiB); the same user's allocated memory
// registers and works.
func TestHostileSparseRegister(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu", "-o", "allow_other"))
	_, path := hostileFile(t, d, "victim", 1<<20)
	pid := d.Cmd.Process.Pid
	capDaemonMemory(t, d, 3<<30)
	hwm := procKB(t, pid, "VmHWM")

	c := startChildProc(t, "TestBoundsHelperChild", &syscall.SysProcAttr{Credential: asUser(nobody)}, "sparse", path)
	if got := c.expect(t, "SPARSE"); got != "EFAULT" {
		t.Errorf("REGISTER of a sparse 2 GiB memfd: %s, want EFAULT", got)
	}
	if got := c.expect(t, "ALLOCATED"); got != "OK" {
		t.Errorf("REGISTER and READ of allocated memory afterwards: %s", got)
	}
	d.alive(t, "after the sparse REGISTER")
	if grew := procKB(t, pid, "VmHWM") - hwm; grew > 64<<20 {
		t.Errorf("the daemon's peak resident memory grew by %d MiB", grew>>20)
	}
}

// TestRegisterAfterSIGTERM: once SIGTERM began the shutdown, a REGISTER
// from a client still attached gets ESHUTDOWN (docs/abi.md), while its
// buffer registered before keeps serving it until the mount goes.
func TestRegisterAfterSIGTERM(t *testing.T) {
	d, data, path := startEmuFile(t, 1<<20)
	f := openClient(t, path, unix.O_RDONLY)
	m := emuBuffer(t, 0, 1<<20)
	b := register(t, f, m)
	d.Signal(syscall.SIGTERM)
	if !d.WaitLog("unmounting", 10*time.Second) {
		t.Fatalf("the daemon never began unmounting")
	}
	// The signal is asynchronous: a REGISTER may still pass just before the
	// shutdown begins, none after (the daemon then waits 5 s for the mount).
	h, _ := emuBuffer(t, 0, 1<<20).Export()
	var err error
	for start := time.Now(); time.Since(start) < 2*time.Second; time.Sleep(10 * time.Millisecond) {
		var nb client.Buffer
		if nb, err = f.Register(client.VendorEmu, 0, h, 1<<20); err != nil {
			break
		}
		f.Deregister(nb)
	}
	if errnoName(err) != "ESHUTDOWN" {
		t.Fatalf("REGISTER after SIGTERM: %v, want ESHUTDOWN", err)
	}
	if !strings.Contains(d.Stderr(), "shutting down") {
		t.Errorf("the daemon refused REGISTER without saying it was shutting down")
	}
	fill(m.Bytes(), 0)
	if n, err := f.Read(b, 0, 4096, 4096); err != nil || n != 4096 || !bytes.Equal(m.Bytes()[:4096], data[4096:8192]) {
		t.Errorf("READ into the buffer registered before: %d, %v", n, err)
	}
	f.Close()
	if _, exited := d.WaitExit(15 * time.Second); !exited {
		t.Fatalf("the daemon did not exit after SIGTERM")
	}
}

// TestHostileRegistrationHoard: uid 65534 registers one 64 KiB memfd
// again and again from one process, as many times as the daemon lets it.
// Each registration used to cost the root daemon a descriptor (and each
// costs it a mapping): with the daemon's RLIMIT_NOFILE a little above
// what it holds, the user took every descriptor left, and every open
// through the mount, by any user, failed with EMFILE (and past
// vm.max_map_count the Go runtime cannot grow its heap: the daemon dies).
// Now the mount's buffers stop at a quarter of the daemon's descriptors
// (ENFILE) and registrations hold none: other users' opens still work.
func TestHostileRegistrationHoard(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu", "-o", "allow_other"))
	_, path := hostileFile(t, d, "victim", 1<<20)
	other := writePattern(t, filepath.Join(d.Backing, "other"), 1<<16, 0644)
	pid := d.Cmd.Process.Pid
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	limit := uint64(len(fds) + 256)
	limitDescriptors(t, pid, limit)

	c := startChildProc(t, "TestBoundsHelperChild", &syscall.SysProcAttr{Credential: asUser(nobody)}, "hoard", path)
	var n int
	var why string
	if _, err := fmt.Sscanf(c.expect(t, "HOARD"), "%d %s", &n, &why); err != nil {
		t.Fatal(err)
	}
	t.Logf("uid 65534 registered %d buffers, then %s (the daemon's RLIMIT_NOFILE %d, %d open before)", n, why, limit, len(fds))
	d.alive(t, "after the hoard")
	got, err := os.ReadFile(filepath.Join(d.Mnt, "other"))
	if err != nil || !bytes.Equal(got, other) {
		t.Errorf("another file read through the mount while the buffers live: %d bytes, %v", len(got), err)
	}
	if why != "ENFILE" || uint64(n) > limit/4 {
		t.Errorf("one process registered %d buffers, then %s; want ENFILE at a quarter of the daemon's %d descriptors at most", n, why, limit)
	}
	c.in.Close()
	d.alive(t, "at the end")
}

// numberedFiles writes the files f0 ... f(n-1) in dir, each holding its
// number in decimal.
func numberedFiles(t testing.TB, dir string, n int) {
	t.Helper()
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), []byte(fmt.Sprint(i)), 0644); err != nil {
			t.Fatal(err)
		}
	}
}

// limitDescriptors sets process pid's RLIMIT_NOFILE to limit.
func limitDescriptors(t testing.TB, pid int, limit uint64) {
	t.Helper()
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}, nil); err != nil {
		t.Fatalf("prlimit the daemon: %v", err)
	}
}

// TestWalkPastTheDaemonsDescriptors: every name the kernel keeps costs the
// daemon a descriptor, and a walk of a dataset larger than the daemon's
// RLIMIT_NOFILE (a million files, against fs.nr_open's 1,048,576) used to
// make every later LOOKUP, by any user, fail with EMFILE. With the limit
// lowered to 1,024, a walk of 3,000 files, twice, now gets every stat;
// the daemon stays within its descriptors (the pruner has the kernel
// forget the nodes looked up longest ago), a file kept open meanwhile
// still reads, and the files read back byte for byte.
func TestWalkPastTheDaemonsDescriptors(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu"))
	const files, limit = 3000, 1024
	numberedFiles(t, d.Backing, files)
	kept, err := os.Open(filepath.Join(d.Mnt, "f0"))
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()
	pid := d.Cmd.Process.Pid
	limitDescriptors(t, pid, limit)
	time.Sleep(1500 * time.Millisecond) // the pruner reads the limit every second
	failed := 0
	var first error
	for round := range 2 {
		for i := range files {
			if _, err := os.Stat(filepath.Join(d.Mnt, fmt.Sprintf("f%d", i))); err != nil {
				failed++
				if first == nil {
					first = fmt.Errorf("round %d, f%d: %w", round, i, err)
				}
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d stats through the mount failed; the first: %v", failed, 2*files, first)
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	if len(fds) >= limit {
		t.Errorf("the daemon holds %d descriptors, its limit %d", len(fds), limit)
	}
	for _, i := range []int{0, 1, 1499, 2999} {
		got, err := os.ReadFile(filepath.Join(d.Mnt, fmt.Sprintf("f%d", i)))
		if err != nil || string(got) != fmt.Sprint(i) {
			t.Errorf("f%d after the walk: %q, %v", i, got, err)
		}
	}
	buf := make([]byte, 8)
	if n, err := kept.ReadAt(buf, 0); string(buf[:n]) != "0" {
		t.Errorf("the file kept open through the walk: %q, %v", buf[:n], err)
	}
	d.alive(t, "after the walk")
}

// TestHostileOpensLeaveTheDaemonItsDescriptors: every file open through
// the mount holds a descriptor of the daemon's, whose table all users
// share. A user who held more files open than the daemon had descriptors
// made every open, LOOKUP and REGISTER fail for everyone, and four users
// each at a quarter did the same. Now a uid but root holds at most an
// eighth of the daemon's RLIMIT_NOFILE open (EMFILE past it, as its own
// table would say) and all of them together a quarter (ENFILE past it,
// as a full system-wide table would say); root still opens files
// meanwhile, and the room comes back as the users close theirs.
func TestHostileOpensLeaveTheDaemonItsDescriptors(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu", "-o", "allow_other"))
	const files, limit = 400, 1024
	numberedFiles(t, d.Backing, files)
	limitDescriptors(t, d.Cmd.Process.Pid, limit)
	opens := func(uid uint32, want int, wantWhy string) *child {
		t.Helper()
		c := startChildProc(t, "TestBoundsHelperChild", &syscall.SysProcAttr{Credential: asUser(uid)}, "opens", d.Mnt)
		var n int
		var why string
		if _, err := fmt.Sscanf(c.expect(t, "OPENS"), "%d %s", &n, &why); err != nil {
			t.Fatal(err)
		}
		if why != wantWhy || n != want {
			t.Errorf("uid %d held %d files open, then %s; want %s at %d (the daemon has %d descriptors)", uid, n, why, wantWhy, want, limit)
		}
		return c
	}
	first := opens(nobody, limit/8, "EMFILE")
	second := opens(nobody-1, limit/8, "EMFILE")
	third := opens(nobody-2, 0, "ENFILE")
	for _, i := range []int{0, files - 1} {
		got, err := os.ReadFile(filepath.Join(d.Mnt, fmt.Sprintf("f%d", i)))
		if err != nil || string(got) != fmt.Sprint(i) {
			t.Errorf("root reads f%d while the users hold their room: %q, %v", i, got, err)
		}
	}
	d.alive(t, "while the users hold their room")
	for _, c := range []*child{first, third} {
		c.in.Close()
		c.cmd.Wait()
	}
	opens(nobody-2, limit/8, "EMFILE")
	second.in.Close()
	second.cmd.Wait()
	opens(nobody, limit/8, "EMFILE")
}

// TestHostileFreedPages: uid 65534 registers 1 MiB of its memory, then
// frees it (punches a hole in its memfd, which it keeps) and asks for
// READs into it and WRITEs out of it. The daemon's accesses used to
// allocate the pages again, charged to the daemon's memory cgroup while
// the user's memfd kept them: round after round, a user confined to 64 MiB
// held 256 MiB and more. Now they fail with EFAULT, allocate nothing,
// and once the user writes its memory again, the READ works.
func TestHostileFreedPages(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu", "-o", "allow_other"))
	_, path := hostileFile(t, d, "victim", 1<<20)
	c := startChildProc(t, "TestBoundsHelperChild", &syscall.SysProcAttr{Credential: asUser(nobody)}, "holes", path)
	for _, what := range []string{"READ", "WRITE", "BATCH"} {
		if got := c.expect(t, what); got != "EFAULT" {
			t.Errorf("%s of memory the user freed: %s, want EFAULT", what, got)
		}
	}
	if got := c.expect(t, "HELD"); got != "0" {
		t.Errorf("the user's memfd holds %s bytes after the refused requests, want 0", got)
	}
	if got := c.expect(t, "AGAIN"); got != "OK" {
		t.Errorf("a READ once the user wrote its memory again: %s", got)
	}
	d.alive(t, "at the end")
}

// TestHostileStridedFlood: a strided batch is 64 KiB of ioctl, but the
// daemon holds about 140 bytes for each of its up to 65,536 pieces while
// it serves it. uid 65534, from 200 threads, each with such a batch in
// flight, took the daemon to 3 GB (1,000 threads: 9 GB); with its
// address space capped at 1 GiB more than at the start, the daemon died.
// Now the pieces one user has served at once are bounded
// (max_pieces_in_flight_per_user): the others wait, every batch is served
// with the file's bytes, and the daemon stays up within its cap.
func TestHostileStridedFlood(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu", "-o", "allow_other"))
	_, path := hostileFile(t, d, "flooded", 2*client.MaxPieces)
	capDaemonMemory(t, d, 1<<30)
	const threads = 200
	c := startChildProc(t, "TestBoundsHelperChild", &syscall.SysProcAttr{Credential: asUser(nobody)}, "flood", path, strconv.Itoa(threads))
	var n int
	var first string
	if _, err := fmt.Sscanf(c.expect(t, "FLOOD"), "%d %s", &n, &first); err != nil {
		t.Fatal(err)
	}
	d.alive(t, "after the flood")
	if n != 2*threads || first != "none" {
		t.Errorf("%d of %d strided batches moved every piece with the file's bytes; the first failure: %s", n, 2*threads, first)
	}
}

// TestBoundsHelperChild is the body of the hostile child processes; it
// skips when run normally.
func TestBoundsHelperChild(t *testing.T) {
	mode := os.Getenv("PHX_CHILD")
	if mode != "strided" && mode != "sparse" && mode != "hoard" && mode != "holes" && mode != "opens" && mode != "flood" {
		t.Skip("helper process for the bounds tests (runs only when re-executed)")
	}
	args := strings.Split(os.Getenv("PHX_CHILD_ARGS"), "\x1f")
	say := func(format string, a ...any) { fmt.Printf(format+"\n", a...) }
	defer os.Exit(0)
	if mode == "opens" {
		hostileOpens(args[0], say)
		return
	}
	f, err := client.OpenFile(args[0], unix.O_RDWR)
	if err != nil {
		say("OPEN %v", err)
		return
	}
	switch mode {
	case "strided":
		hostileStrided(f, say)
	case "sparse":
		hostileSparse(f, say)
	case "hoard":
		hostileHoard(f, say)
	case "holes":
		hostileHoles(f, say)
	case "flood":
		threads, _ := strconv.Atoi(args[1])
		hostileFlood(f, threads, say)
	}
}

// hostileFlood registers 1 MiB of its memory and has threads goroutines
// (a thread each, in the ioctl) send two strided reads of the most pieces
// one ioctl may move, every other byte of the file's first 128 KiB, one
// byte a piece, each into its own part of the buffer; it says how many
// ioctls moved every piece with the file's bytes, and the first failure.
func hostileFlood(f *client.File, threads int, say func(string, ...any)) {
	conn, _ := emu.New(emu.Config{})
	m, err := conn.Alloc(0, 1<<20)
	if err != nil {
		say("FLOOD alloc %v", err)
		return
	}
	h, _ := m.Export()
	buf, err := f.Register(client.VendorEmu, 0, h, m.Size())
	if err != nil {
		say("FLOOD REGISTER %s", errnoName(err))
		return
	}
	const half = client.MaxPieces / 2
	file, mem := patternBytes(2*client.MaxPieces), m.(*emu.Memory).Bytes()
	var mu sync.Mutex
	ok, first := 0, "none"
	var wg sync.WaitGroup
	for g := range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			at := uint64(g%16) * client.MaxPieces // 16 parts of 64 KiB
			reqs := []client.IOReq{{ID: buf.ID, BufOffset: at, Length: 1, Count: half, FileStride: 2, BufStride: 1},
				{ID: buf.ID, BufOffset: at + half, FileOffset: 2 * half, Length: 1, Count: half, FileStride: 2, BufStride: 1}}
			for range 2 {
				b, _ := client.EncodeStridedBatch(len(reqs), reqs)
				why := ""
				if err := f.Ioctl(client.CmdStridedBatch(false, len(reqs)), b); err != nil {
					why = errnoName(err)
				} else if failed, err := client.DecodeStridedBatchResp(b, make([]int64, len(reqs))); err != nil || failed != 0 {
					why = fmt.Sprintf("failed %d (%v)", failed, err)
				}
				mu.Lock()
				if why == "" {
					ok++
				} else if first == "none" {
					first = why
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for j := range client.MaxPieces {
		if mem[j] != file[2*j] {
			first = fmt.Sprintf("byte %d is %#x, want %#x", j, mem[j], file[2*j])
			break
		}
	}
	say("FLOOD %d %s", ok, strings.ReplaceAll(first, " ", "_"))
}

// stridedIoctl sends one strided batch as it is (the Go client would
// split it) and returns the ioctl's errno name.
func stridedIoctl(f *client.File, write bool, reqs []client.IOReq) string {
	b, err := client.EncodeStridedBatch(len(reqs), reqs)
	if err != nil {
		return "ENCODE " + err.Error()
	}
	return errnoName(f.Ioctl(client.CmdStridedBatch(write, len(reqs)), b))
}

func hostileStrided(f *client.File, say func(string, ...any)) {
	const madeUp = 0xDEAD0000
	say("WRITE2^32 %s", stridedIoctl(f, true, []client.IOReq{{ID: madeUp, Count: 1 << 32}}))
	say("WRITE2^32x1 %s", stridedIoctl(f, true, []client.IOReq{{ID: madeUp, Length: 1, Count: 1 << 32, FileStride: 1, BufStride: 1}}))
	conn, _ := emu.New(emu.Config{})
	m, err := conn.Alloc(0, 64<<20)
	if err != nil {
		say("READ2^26 alloc %v", err)
		return
	}
	h, _ := m.Export()
	buf, err := f.Register(client.VendorEmu, 0, h, m.Size())
	if err != nil {
		say("READ2^26 REGISTER %s", errnoName(err))
		return
	}
	say("READ2^26 %s", stridedIoctl(f, false, []client.IOReq{{ID: buf.ID, Length: 1, Count: 1 << 26, FileStride: 1, BufStride: 1}}))
	mem := m.(*emu.Memory).Bytes()
	n, err := f.Read(buf, 0, 1<<20, 0)
	want := patternBytes(1 << 20)
	switch {
	case err != nil:
		say("AFTER %s", errnoName(err))
	case n != 1<<20 || !bytes.Equal(mem[:n], want):
		say("AFTER %d bytes, not the file's", n)
	default:
		say("AFTER OK")
	}
}

func hostileSparse(f *client.File, say func(string, ...any)) {
	fd, err := unix.MemfdCreate("phxemu-sparse", unix.MFD_CLOEXEC)
	if err == nil {
		err = unix.Ftruncate(fd, 2<<30)
	}
	if err != nil {
		say("SPARSE memfd %v", err)
		return
	}
	say("SPARSE %s", errnoName(registerFd(f, fd, 2<<30)))
	var st unix.Stat_t
	if unix.Fstat(fd, &st); st.Blocks != 0 {
		say("ALLOCATED the refused REGISTER allocated %d bytes of the memfd", st.Blocks*512)
		return
	}
	if err := unix.Fallocate(fd, 0, 0, 1<<20); err != nil {
		say("ALLOCATED fallocate %v", err)
		return
	}
	if err := registerFd(f, fd, 1<<20); err != nil {
		say("ALLOCATED REGISTER %s", errnoName(err))
		return
	}
	say("ALLOCATED OK")
}

// hostileHoard registers one 64 KiB memfd until the daemon refuses, says
// how many times and why, and keeps the buffers until stdin closes.
func hostileHoard(f *client.File, say func(string, ...any)) {
	fd, err := unix.MemfdCreate("phxemu-hoard", unix.MFD_CLOEXEC)
	if err == nil {
		err = unix.Fallocate(fd, 0, 0, 64<<10)
	}
	if err != nil {
		say("HOARD 0 memfd:%v", err)
		return
	}
	n := 0
	for ; n < client.DefaultMaxBuffersPerProcess; n++ {
		if err = registerFd(f, fd, 64<<10); err != nil {
			break
		}
	}
	say("HOARD %d %s", n, errnoName(err))
	io.Copy(io.Discard, os.Stdin)
}

// hostileOpens opens the files f0, f1, ... of dir and keeps them open,
// until an open fails or its own limit is near; it says how many it holds
// and why it stopped, then holds them until its stdin closes.
func hostileOpens(dir string, say func(string, ...any)) {
	var rl unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &rl)
	n, why := 0, "its own limit"
	for ; uint64(n) < rl.Cur-32; n++ {
		fd, err := unix.Open(filepath.Join(dir, fmt.Sprintf("f%d", n)), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			why = errnoName(err)
			break
		}
		_ = fd // held until exit
	}
	say("OPENS %d %s", n, why)
	io.Copy(io.Discard, os.Stdin)
}

// hostileHoles registers 1 MiB of its memory, frees it, and says what
// READ, WRITE and a batch READ into the freed memory get, how much of the
// memfd is allocated afterwards, and whether a READ works once it wrote
// the memory again.
func hostileHoles(f *client.File, say func(string, ...any)) {
	const size = 1 << 20
	fd, err := unix.MemfdCreate("phxemu-holes", unix.MFD_CLOEXEC)
	if err == nil {
		err = unix.Fallocate(fd, 0, 0, size)
	}
	if err != nil {
		say("READ memfd %v", err)
		return
	}
	buf, err := registerFdBuffer(f, fd, size)
	if err != nil {
		say("READ REGISTER %s", errnoName(err))
		return
	}
	if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, size); err != nil {
		say("READ punch %v", err)
		return
	}
	_, err = f.Read(buf, 0, size, 0)
	say("READ %s", errnoName(err))
	_, err = f.Write(buf, 0, 4096, 0)
	say("WRITE %s", errnoName(err))
	ext := []client.Extent{{Buffer: buf.ID, Len: 4096}, {Buffer: buf.ID, BufOffset: size / 2, Len: 4096, FileOffset: 4096}}
	f.ReadBatch(ext)
	say("BATCH %s", errnoName(ext[1].Err()))
	var st unix.Stat_t
	unix.Fstat(fd, &st)
	say("HELD %d", st.Blocks*512)
	if err := unix.Fallocate(fd, 0, 0, size); err != nil {
		say("AGAIN fallocate %v", err)
		return
	}
	n, err := f.Read(buf, 0, size, 0)
	if err == nil && n != size {
		say("AGAIN %d bytes", n)
		return
	}
	say("AGAIN %s", errnoName(err))
}

// registerFd registers size bytes of the emu memfd fd through f.
func registerFd(f *client.File, fd int, size int64) error {
	_, err := registerFdBuffer(f, fd, size)
	return err
}

// registerFdBuffer is registerFd, with the buffer.
func registerFdBuffer(f *client.File, fd int, size int64) (client.Buffer, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return client.Buffer{}, err
	}
	var h [client.HandleSize]byte
	copy(h[:], "PHXEMU01")
	le := func(b []byte, v uint64, n int) {
		for i := 0; i < n; i++ {
			b[i] = byte(v >> (8 * i))
		}
	}
	le(h[8:], uint64(os.Getpid()), 4)
	le(h[12:], uint64(fd), 4)
	le(h[16:], uint64(st.Size), 8)
	le(h[24:], st.Ino, 8)
	return f.Register(client.VendorEmu, 0, h, size)
}

// TestStridedClientSplitsPieces: an extent of more pieces than one ioctl
// may carry, and a batch of many, go through the Go client as several
// ioctls; every piece lands, and each extent's result is its own.
func TestStridedClientSplitsPieces(t *testing.T) {
	const rows = client.MaxPieces + 1000
	_, data, path := startEmuFile(t, rows*8)
	f := openClient(t, path, unix.O_RDONLY)
	m := emuBuffer(t, 0, 2<<20)
	b := register(t, f, m)
	ext := []client.Extent{
		{Buffer: b.ID, Len: 4, FileOffset: 2, Count: rows, FileStride: 8, BufStride: 4},
		{Buffer: b.ID, BufOffset: 1 << 20, Len: 4, Count: client.MaxPieces - 10, FileStride: 8, BufStride: 4},
		{Buffer: b.ID + 100, Len: 4, Count: 3, FileStride: 8, BufStride: 4},
	}
	failed, err := f.ReadStrided(ext)
	if err != nil || failed != 1 {
		t.Fatalf("ReadStrided: %d failed, %v", failed, err)
	}
	if ext[0].Result != 4*rows || ext[1].Result != 4*(client.MaxPieces-10) || ext[2].Result != -int64(unix.ENOENT) {
		t.Fatalf("results %d %d %d", ext[0].Result, ext[1].Result, ext[2].Result)
	}
	mem := m.Bytes()
	for j := 0; j < rows; j++ {
		if !bytes.Equal(mem[4*j:4*j+4], data[8*j+2:8*j+6]) {
			t.Fatalf("piece %d of the first extent differs", j)
		}
	}
	for j := 0; j < client.MaxPieces-10; j++ {
		if !bytes.Equal(mem[1<<20+4*j:1<<20+4*j+4], data[8*j:8*j+4]) {
			t.Fatalf("piece %d of the second extent differs", j)
		}
	}
	if in, err := f.Info(); err != nil || in.Counters.IoctlRejected != 0 {
		t.Errorf("ioctls refused: %v, %v", in.Counters.IoctlRejected, err)
	}
}

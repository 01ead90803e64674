package integration

// The namespace stress test: names are replaced, unlinked and recreated,
// on the backing directory and through the mount, while processes of
// several uids look them up, open them and read them through the mount;
// in every mode a mutator changes other names directly in the backing
// directory and nobody creates over stale negative entries
// (namespace_stress_backing_test.go), and afterwards the mount converges
// to what the backing directory says.
// Every file says in its first line which name it was written for, its
// generation and whether it is secret (mode 0600, root's), and its body
// follows from that line; so every byte a reader gets is checked against
// what the name it opened can hold. A reader must never see another
// name's bytes, never a secret file's bytes through a public name, never
// EBADF, ESTALE or EIO, and never be refused a public file.
//
// PHX_STRESS_SECONDS sets the seconds per mount mode (default 4; `make
// stress`, which CI runs, sets more).

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var (
	stressPublic = []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "sub/p8", "sub/p9"}
	stressSecret = []string{"s0", "s1", "sub/s2", "sub/s3"}
)

func stressNames() []string { return append(append([]string{}, stressPublic...), stressSecret...) }

func isSecretName(name string) bool { return strings.HasPrefix(filepath.Base(name), "s") }

// stressContent is the file a generation of name holds.
func stressContent(name string, gen uint64) []byte {
	secret := 0
	if isSecretName(name) {
		secret = 1
	}
	size := 512 + int(gen*7919%60000)
	b := make([]byte, 0, size)
	b = fmt.Appendf(b, "PHXSTRESS name=%s gen=%d secret=%d size=%d\n", name, gen, secret, size)
	x := gen*0x9E3779B97F4A7C15 ^ uint64(len(name))<<32 ^ uint64(name[len(name)-1])
	for len(b) < size {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b = append(b, byte(x))
	}
	return b
}

// checkStressContent says what is wrong with data read from name ("" if
// nothing): it must be a whole generation written for name.
func checkStressContent(name string, data []byte) string {
	line, _, ok := bytes.Cut(data, []byte("\n"))
	if !ok {
		return fmt.Sprintf("%s: %d bytes with no header line", name, len(data))
	}
	var got string
	var gen uint64
	var secret, size int
	if _, err := fmt.Sscanf(string(line), "PHXSTRESS name=%s gen=%d secret=%d size=%d", &got, &gen, &secret, &size); err != nil {
		return fmt.Sprintf("%s: header %q: %v", name, line, err)
	}
	if got != name {
		return fmt.Sprintf("opened %s, read the bytes of %s (gen %d, secret %d)", name, got, gen, secret)
	}
	if !bytes.Equal(data, stressContent(name, gen)) {
		return fmt.Sprintf("%s gen %d: %d bytes, not the %d bytes written", name, gen, len(data), size)
	}
	return ""
}

// stressTally counts what readers saw.
type stressTally struct {
	opens, bytes, enoent, eacces atomic.Int64
	mu                           sync.Mutex
	bad                          []string
	badCount                     int
}

func (s *stressTally) fail(format string, a ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.badCount++
	if len(s.bad) < 20 {
		s.bad = append(s.bad, fmt.Sprintf(format, a...))
	}
}

func (s *stressTally) String() string {
	return fmt.Sprintf("opens=%d bytes=%d enoent=%d eacces=%d bad=%d", s.opens.Load(), s.bytes.Load(), s.enoent.Load(), s.eacces.Load(), s.badCount)
}

// stressReadOnce opens, reads and checks one name under root as uid.
func stressReadOnce(root, name string, uid int, t *stressTally) {
	f, err := os.Open(filepath.Join(root, name))
	if err != nil {
		switch {
		case errors.Is(err, unix.ENOENT):
			t.enoent.Add(1) // between an unlink and the re-create
		case errors.Is(err, unix.EACCES) && isSecretName(name) && uid != 0:
			t.eacces.Add(1)
		default:
			t.fail("uid %d: open %s: %v", uid, name, err)
		}
		return
	}
	defer f.Close()
	t.opens.Add(1)
	if isSecretName(name) && uid != 0 {
		t.fail("uid %d opened root's 0600 file %s", uid, name)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.fail("uid %d: fstat %s: %v", uid, name, err)
		return
	}
	data, err := io.ReadAll(f)
	if err != nil {
		t.fail("uid %d: read %s: %v", uid, name, err)
		return
	}
	t.bytes.Add(int64(len(data)))
	if msg := checkStressContent(name, data); msg != "" {
		t.fail("uid %d: %s", uid, msg)
	}
	if int64(len(data)) != st.Size {
		t.fail("uid %d: %s: read %d bytes, fstat says %d", uid, name, len(data), st.Size)
	}
	if want := stressMode(name); st.Mode&0777 != want {
		t.fail("uid %d: %s: mode %o, the file was written %o", uid, name, st.Mode&0777, want)
	}
}

func stressMode(name string) uint32 {
	if isSecretName(name) {
		return 0600
	}
	return 0644
}

// stressLook stats a name and lists its directory.
func stressLook(root, name string, uid int, t *stressTally) {
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, name), &st); err != nil && !errors.Is(err, unix.ENOENT) {
		t.fail("uid %d: stat %s: %v", uid, name, err)
	}
	ents, err := os.ReadDir(filepath.Join(root, filepath.Dir(name)))
	if err != nil {
		t.fail("uid %d: readdir %s: %v", uid, filepath.Dir(name), err)
		return
	}
	for _, e := range ents {
		n := e.Name()
		if !strings.HasPrefix(n, "p") && !strings.HasPrefix(n, "s") && !strings.HasPrefix(n, "tmp-") &&
			!strings.HasPrefix(n, "q") && n != filepath.Base(stressMutatedDir) {
			t.fail("uid %d: readdir %s: unexpected name %q", uid, filepath.Dir(name), n)
		}
	}
}

// stressReader reads random names under root until the deadline.
func stressReader(root string, uid int, until time.Time, seed uint64, t *stressTally) {
	rng := rand.New(rand.NewPCG(seed, 7))
	names := append(stressNames(), stressMutated...)
	for i := 0; time.Now().Before(until); i++ {
		name := names[rng.IntN(len(names))]
		switch {
		case i%8 == 7:
			stressLook(root, name, uid, t)
		case isMutatedName(name):
			stressReadMutated(root, name, uid, t)
		default:
			stressReadOnce(root, name, uid, t)
		}
	}
}

// stressWriter changes the names under root (the backing directory or the
// mount) until stop: replace by rename (the common case), or unlink and
// re-create.
type stressWriter struct {
	root string
	tag  string
	gen  *atomic.Uint64
	rng  *rand.Rand
	ops  atomic.Int64
	err  error
}

func (w *stressWriter) write(name string, excl bool) error {
	gen := w.gen.Add(1)
	path := filepath.Join(w.root, name)
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf("tmp-%s-%d", w.tag, gen))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, os.FileMode(stressMode(name)))
	if err != nil {
		return err
	}
	_, err = f.Write(stressContent(name, gen))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if !excl {
		return os.Rename(tmp, path)
	}
	// A name appears whole: link the finished file in (EEXIST when the
	// other writer re-created it first), then drop the temporary name.
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return os.Remove(tmp)
}

func (w *stressWriter) step(names []string) error {
	name := names[w.rng.IntN(len(names))]
	w.ops.Add(1)
	if w.rng.IntN(5) > 0 {
		return w.write(name, false)
	}
	if err := os.Remove(filepath.Join(w.root, name)); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return w.write(name, true)
}

func (w *stressWriter) run(stop <-chan struct{}) {
	names := stressNames()
	for {
		select {
		case <-stop:
			return
		default:
		}
		if err := w.step(names); err != nil {
			w.err = fmt.Errorf("%s writer: %w", w.tag, err)
			return
		}
	}
}

// stressPopulate writes generation 0 of every name, and makes the
// mutator's directories and the 1777 directory of the stale creator.
func stressPopulate(t *testing.T, root string) {
	t.Helper()
	for _, dir := range []string{"sub", "q/sub"} {
		must(t, os.MkdirAll(filepath.Join(root, dir), 0755))
	}
	must(t, os.Mkdir(filepath.Join(root, "stale"), 0777))
	must(t, os.Chmod(filepath.Join(root, "stale"), 01777))
	for _, n := range append(stressNames(), stressMutated...) {
		if err := os.WriteFile(filepath.Join(root, n), stressContent(n, 0), os.FileMode(stressMode(n))); err != nil {
			t.Fatal(err)
		}
	}
}

func stressSeconds(t *testing.T) time.Duration {
	s := os.Getenv("PHX_STRESS_SECONDS")
	if s == "" {
		return 4 * time.Second
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("PHX_STRESS_SECONDS=%q: want a positive number of seconds", s)
	}
	return time.Duration(n) * time.Second
}

// stressRoots are where a stress run works: the roots of its two writers
// (the backing directory or the mount), where it reads, the backing
// directory itself (the mutator's and the stale creator's), and the
// hostile client's file through the mount ("" for none:
// namespace_stress_hostile_test.go).
type stressRoots struct{ write0, write1, read, backing, hostile string }

// runStress runs one writer on each of r's two write roots, the mutator on
// the backing directory, the stale creator, and readers on r.read (root
// in-process, two other uids as child processes) for d; then stops the
// writers and waits for the mount to show what the backing directory
// says.
func runStress(t *testing.T, r stressRoots, d time.Duration) {
	var gen atomic.Uint64
	gen.Store(1 << 20)
	stop := make(chan struct{})
	var writers []*stressWriter
	var wg sync.WaitGroup
	for i, root := range []string{r.write0, r.write1} {
		w := &stressWriter{root: root, tag: fmt.Sprintf("w%d", i), gen: &gen, rng: rand.New(rand.NewPCG(uint64(i), 1))}
		writers = append(writers, w)
		wg.Add(1)
		go func() { defer wg.Done(); w.run(stop) }()
	}
	mut := &stressMutator{root: r.backing, rng: rand.New(rand.NewPCG(9, 1))}
	mut.gen.Store(1 << 40)
	wg.Add(1)
	go func() { defer wg.Done(); mut.run(stop) }()
	until := time.Now().Add(d)
	var kids []*child
	for _, uid := range []uint32{nobody, 1000} {
		cred := asUser(uid)
		kids = append(kids, startChildTest(t, "TestStressHelperChild", cred, "stress-reader", r.read, strconv.Itoa(int(d/time.Millisecond))))
	}
	var hostile *child
	if r.hostile != "" {
		hostile = startChildTest(t, "TestStressHelperChild", asUser(nobody), "stress-hostile", r.hostile, strconv.Itoa(int(d/time.Millisecond)))
	}
	var tally stressTally
	var rg sync.WaitGroup
	for i := 0; i < 2; i++ {
		rg.Add(1)
		go func() { defer rg.Done(); stressReader(r.read, 0, until, uint64(100+i), &tally) }()
	}
	stale := staleCreates(t, r.backing, r.read, until)
	rg.Wait()
	for _, k := range kids {
		line := k.expect(t, "STRESS")
		t.Logf("reader %d: %s", k.cmd.Process.Pid, line)
		if !strings.HasSuffix(line, "bad=0") {
			for l := range k.lines {
				t.Errorf("child: %s", l)
			}
			t.Errorf("a reader of another uid saw wrong results: %s", line)
		}
	}
	if hostile != nil {
		line := hostile.expect(t, "HOSTILE")
		t.Logf("hostile client (uid %d): %s", nobody, line)
		if !strings.HasSuffix(line, "bad=0") {
			t.Errorf("the hostile client got answers docs/abi.md does not promise: %s", line)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("root readers: %s", &tally)
	t.Logf("stale creator: %d O_CREAT opens over names root made behind the mount's back", stale)
	for _, w := range writers {
		t.Logf("%s: %d changes", w.tag, w.ops.Load())
		if w.err != nil {
			t.Errorf("%v", w.err)
		}
	}
	t.Logf("backing-side mutator: %d changes", mut.ops.Load())
	if mut.err != nil {
		t.Errorf("%v", mut.err)
	}
	for _, b := range tally.bad {
		t.Errorf("%s", b)
	}
	if tally.opens.Load() == 0 {
		t.Errorf("the root readers opened nothing")
	}
	if stale == 0 {
		t.Errorf("the stale creator tried nothing")
	}
	eventually(t, "the stress tree after the writers stopped", func() string { return stressDiff(r.backing, r.read) })
}

// TestNamespaceStress replaces names under readers of several uids, and,
// in every mode through the mount, a hostile client of uid 65534 sends
// oversized strided batches and REGISTERs of huge sparse memfds
// (namespace_stress_hostile_test.go), which the daemon must answer as
// docs/abi.md says and live through: on the
// backing directory natively (to check the harness); through the mount
// under both passthrough modes with entry_timeout=0 and attr_timeout=0,
// with one writer on the backing directory and one through the mount; and
// with the default caching (cache=auto: hour-long timeouts, kept pages
// and listings), where writers through the mount keep the kernel's caches
// exact. (A change made on the backing directory shows within the
// invalidation's bound, not at once, so a reader there may meanwhile see
// a size from before it: there, the backing side changes only the
// mutator's names, whose readers accept any state a native reader or the
// invalidation's bound allows, and the mount must converge afterwards;
// TestBackingChangesUnderConcurrentReaders checks the bound, README
// "Caching".) Every mode runs the mutator and the stale creator.
func TestNamespaceStress(t *testing.T) {
	requireMountEnv(t)
	d := stressSeconds(t)
	t.Run("native", func(t *testing.T) {
		dir := t.TempDir()
		os.Chmod(filepath.Dir(dir), 0755)
		os.Chmod(dir, 0755)
		stressPopulate(t, dir)
		runStress(t, stressRoots{dir, dir, dir, dir, ""}, min(d, 2*time.Second))
	})
	const zero = "allow_other,entry_timeout=0,attr_timeout=0"
	for _, m := range []struct {
		name        string
		args        []string
		backingSide bool
	}{
		{"passthrough-timeouts0", []string{"--passthrough", "auto", "-o", zero}, true},
		{"classic-timeouts0", []string{"--passthrough", "off", "-o", zero}, true},
		{"passthrough-cached", []string{"--passthrough", "auto", "-o", "allow_other"}, false},
		{"classic-cached", []string{"--passthrough", "off", "-o", "allow_other"}, false},
	} {
		t.Run(m.name, func(t *testing.T) {
			// The emulated device on any machine: the hostile client's
			// buffers are emu memfds.
			dm := startDaemon(t, withArgs(append([]string{"--vendor", "emu"}, m.args...)...))
			// A daemon the hostile client makes allocate without bound dies
			// of it, and the test fails, before the machine runs out.
			capDaemonMemory(t, dm, 2<<30)
			stressPopulate(t, dm.Backing)
			stressPopulateHostile(t, dm.Backing)
			first := dm.Mnt
			if m.backingSide {
				first = dm.Backing
			}
			runStress(t, stressRoots{first, dm.Mnt, dm.Mnt, dm.Backing, filepath.Join(dm.Mnt, stressHostileName)}, d)
			dm.alive(t, "under the stress")
			if !dm.Mounted() {
				t.Fatalf("the daemon died:\n%s", dm.Stderr())
			}
			checkNoDescriptorLeak(t, dm.Cmd.Process.Pid)
		})
	}
}

// checkNoDescriptorLeak: once the kernel has forgotten the inodes the
// stress made (dropping dentries and inodes sends FORGETs), the daemon
// holds few descriptors: nodes are closed, not leaked.
func checkNoDescriptorLeak(t *testing.T, pid int) {
	t.Helper()
	count := func() int {
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		return len(ents)
	}
	limit := 64 + 2*(len(stressNames())+len(stressMutated))
	for i := 0; i < 50 && count() > limit; i++ {
		unix.Sync()
		os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0)
		time.Sleep(100 * time.Millisecond)
	}
	if n := count(); n > limit {
		t.Errorf("the daemon holds %d descriptors after the kernel forgot the stress's inodes (at most %d expected): nodes leak", n, limit)
	}
}

// TestStressHelperChild is the body of the reader processes of other uids;
// it skips when run normally.
func TestStressHelperChild(t *testing.T) {
	switch os.Getenv("PHX_CHILD") {
	case "stress-reader":
	case "stale-creator":
		staleCreatorChild()
		os.Exit(0)
	case "stress-hostile":
		stressHostileChild(strings.Split(os.Getenv("PHX_CHILD_ARGS"), "\x1f"))
		os.Exit(0)
	default:
		t.Skip("helper process for TestNamespaceStress (runs only when re-executed)")
	}
	args := strings.Split(os.Getenv("PHX_CHILD_ARGS"), "\x1f")
	ms, _ := strconv.Atoi(args[1])
	var tally stressTally
	var wg sync.WaitGroup
	until := time.Now().Add(time.Duration(ms) * time.Millisecond)
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); stressReader(args[0], os.Getuid(), until, uint64(os.Getpid()*10+i), &tally) }()
	}
	wg.Wait()
	fmt.Printf("STRESS %s\n", &tally)
	for _, b := range tally.bad {
		fmt.Printf("BAD %s\n", b)
	}
	os.Exit(0)
}

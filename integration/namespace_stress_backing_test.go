package integration

// What the namespace stress test does on the backing side in every mode:
//
//   - the mutator creates, rewrites in place, renames, unlinks and chmods
//     public files under q/ (and makes and removes a directory there)
//     directly in the backing directory. Readers through the mount read
//     those names too; they may see any state a native reader could (an
//     emptied or half-rewritten file, a name gone), or one from before a
//     change for as long as the invalidation takes, but never an error
//     other than ENOENT and never bytes that are not a q/ file's. Once
//     every writer stops, the mount converges to what the backing says:
//     the same names, stats and bytes, within watchBound.
//   - the stale creator is nobody's process looking up a missing name in
//     the 1777 directory stale/ through the mount (a negative entry the
//     kernel may keep), after which root creates that name 0600 on the
//     backing side and nobody opens it with O_CREAT through the mount:
//     EACCES each time, as native open(2) says, and root's file stays
//     root's, with its bytes.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// stressMutated are the mutator's names; stressMutatedDir the directory it
// makes and removes.
var stressMutated = []string{"q/q0", "q/q1", "q/q2", "q/q3", "q/sub/q4", "q/sub/q5"}

const stressMutatedDir = "q/d"

func isMutatedName(name string) bool { return strings.HasPrefix(name, "q/") }

// stressMutator changes the q/ names directly in the backing directory.
type stressMutator struct {
	root string
	gen  atomic.Uint64
	rng  *rand.Rand
	ops  atomic.Int64
	err  error
}

// ignore drops the errors a change may meet because of the previous one
// (the name is gone, is there already, the directory is not empty).
func ignore(err error) error {
	for _, e := range []error{unix.ENOENT, unix.EEXIST, unix.ENOTEMPTY} {
		if errors.Is(err, e) {
			return nil
		}
	}
	return err
}

// writeGen writes a generation of name into f, which is open for writing.
func (m *stressMutator) writeGen(f *os.File, name string) error {
	_, err := f.Write(stressContent(name, m.gen.Add(1)))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (m *stressMutator) step() error {
	name := stressMutated[m.rng.IntN(len(stressMutated))]
	p := filepath.Join(m.root, name)
	m.ops.Add(1)
	switch m.rng.IntN(6) {
	case 0: // create where nothing is
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0644)
		if err != nil {
			return ignore(err)
		}
		return m.writeGen(f, name)
	case 1: // rewrite in place
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			return ignore(err)
		}
		return m.writeGen(f, name)
	case 2: // rename onto another name
		other := stressMutated[m.rng.IntN(len(stressMutated))]
		return ignore(os.Rename(p, filepath.Join(m.root, other)))
	case 3:
		return ignore(os.Remove(p))
	case 4: // widen or narrow group write (never read: readers keep access)
		return ignore(os.Chmod(p, os.FileMode(0644|m.rng.IntN(2)*0020)))
	default:
		d := filepath.Join(m.root, stressMutatedDir)
		if err := ignore(os.Mkdir(d, 0755)); err != nil {
			return err
		}
		return ignore(os.Remove(d))
	}
}

func (m *stressMutator) run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		if err := m.step(); err != nil {
			m.err = fmt.Errorf("backing-side mutator: %w", err)
			return
		}
	}
}

// stressReadMutated opens and reads a q/ name under root: ENOENT is
// fine, other errors are not. What it reads is a q/ file's: empty, or
// starting with a q/ file's header, or, on the classic path while the
// invalidation of a truncation is under way, with zeros (the kernel still
// has the size from before it and fills what the short read did not
// return: README, Caching); and every header in it names a public q/
// file. A rewrite in place may be seen half done.
func stressReadMutated(root, name string, uid int, t *stressTally) {
	f, err := os.Open(filepath.Join(root, name))
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			t.enoent.Add(1)
		} else {
			t.fail("uid %d: open %s (changed on the backing side): %v", uid, name, err)
		}
		return
	}
	defer f.Close()
	t.opens.Add(1)
	data, err := io.ReadAll(f)
	if err != nil {
		t.fail("uid %d: read %s (changed on the backing side): %v", uid, name, err)
		return
	}
	t.bytes.Add(int64(len(data)))
	if msg := notMutatedBytes(data); msg != "" {
		t.fail("uid %d: %s (changed on the backing side): %s", uid, name, msg)
	}
}

// notMutatedBytes says why data cannot be what a q/ file held ("" when it
// can).
func notMutatedBytes(data []byte) string {
	const magic = "PHXSTRESS name="
	if len(data) > 0 && data[0] != 0 && !bytes.HasPrefix(data, []byte(magic)[:min(len(magic), len(data))]) {
		return fmt.Sprintf("starts with %q, not a header", data[:min(len(data), 40)])
	}
	for rest := data; ; {
		i := bytes.Index(rest, []byte(magic))
		if i < 0 {
			return ""
		}
		line, _, whole := bytes.Cut(rest[i:], []byte("\n"))
		rest = rest[i+len(magic):]
		var got string
		var gen uint64
		var secret, size int
		if _, err := fmt.Sscanf(string(line), magic+"%s gen=%d secret=%d size=%d", &got, &gen, &secret, &size); err != nil {
			if !whole {
				continue // cut off by the end of what was read
			}
			return fmt.Sprintf("a header %q: %v", line, err)
		}
		if !isMutatedName(got) || secret != 0 {
			return fmt.Sprintf("holds the header of %s (secret %d), not a q/ file's", got, secret)
		}
	}
}

// stressDiff says where the mount's view of the stress tree differs from
// the backing directory's ("" where it does not): the listings, and of each
// name its inode, size, mode, links, owner, modification time and bytes.
func stressDiff(backing, mnt string) string {
	for _, dir := range []string{".", "sub", "q", "q/sub", "stale"} {
		b, errB := os.ReadDir(filepath.Join(backing, dir))
		m, errM := os.ReadDir(filepath.Join(mnt, dir))
		if bn, mn := entryNames(b), entryNames(m); errB != nil || errM != nil || bn != mn {
			return fmt.Sprintf("listing %s: backing %s (%v), mount %s (%v)", dir, bn, errB, mn, errM)
		}
	}
	names := append(append(stressNames(), stressMutated...), stressMutatedDir)
	for _, n := range names {
		if msg := nameDiff(filepath.Join(backing, n), filepath.Join(mnt, n)); msg != "" {
			return n + ": " + msg
		}
	}
	return ""
}

func entryNames(ents []os.DirEntry) string {
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}

// nameDiff compares one name on both sides.
func nameDiff(b, m string) string {
	var sb, sm unix.Stat_t
	eb, em := unix.Lstat(b, &sb), unix.Lstat(m, &sm)
	switch {
	case eb != nil || em != nil:
		if errors.Is(eb, unix.ENOENT) && errors.Is(em, unix.ENOENT) {
			return ""
		}
		return fmt.Sprintf("lstat: backing %v, mount %v", eb, em)
	case sb.Ino != sm.Ino || sb.Size != sm.Size || sb.Mode != sm.Mode || sb.Nlink != sm.Nlink ||
		sb.Uid != sm.Uid || sb.Gid != sm.Gid || sb.Mtim != sm.Mtim:
		return fmt.Sprintf("backing ino=%d size=%d mode=%o nlink=%d mtime=%v, mount ino=%d size=%d mode=%o nlink=%d mtime=%v",
			sb.Ino, sb.Size, sb.Mode, sb.Nlink, sb.Mtim, sm.Ino, sm.Size, sm.Mode, sm.Nlink, sm.Mtim)
	case sb.Mode&unix.S_IFMT != unix.S_IFREG:
		return ""
	}
	db, errB := os.ReadFile(b)
	dm, errM := os.ReadFile(m)
	if errB != nil || errM != nil || !bytes.Equal(db, dm) {
		return fmt.Sprintf("bytes differ: backing %d (%v), mount %d (%v)", len(db), errB, len(dm), errM)
	}
	return ""
}

// staleCreates runs the stale creator until the deadline: nobody's child
// looks up stale/nK through readRoot, root creates it 0600 under
// backingRoot, the child opens it with O_CREAT through readRoot. It
// returns how many it tried; what went wrong goes to t.
func staleCreates(t *testing.T, backingRoot, readRoot string, until time.Time) int {
	c := startChildTest(t, "TestStressHelperChild", asUser(nobody), "stale-creator")
	defer c.in.Close()
	flavours := []int{unix.O_CREAT | unix.O_RDWR, unix.O_CREAT | unix.O_WRONLY | unix.O_TRUNC, unix.O_CREAT | unix.O_RDONLY}
	n := 0
	for ; time.Now().Before(until); n++ {
		name := fmt.Sprintf("stale/n%d", n)
		fmt.Fprintf(c.in, "LOOK %s\n", filepath.Join(readRoot, name))
		if got := c.expect(t, "LOOK "); got != "ENOENT" {
			t.Errorf("nobody's lookup of the missing %s: %s", name, got)
			return n
		}
		planted := filepath.Join(backingRoot, name)
		secret := []byte("root's " + name + "\n")
		must(t, os.WriteFile(planted, secret, 0600))
		fmt.Fprintf(c.in, "CREATE %s %d\n", filepath.Join(readRoot, name), flavours[n%len(flavours)])
		if got := c.expect(t, "CREATE "); got != "EACCES" {
			t.Errorf("nobody's O_CREAT open (%#o) of root's 0600 %s, made behind the mount's back: %s, want EACCES", flavours[n%len(flavours)], name, got)
		}
		st := statOf(t, planted)
		if b, err := os.ReadFile(planted); err != nil || !bytes.Equal(b, secret) || st.Uid != 0 || st.Mode&07777 != 0600 {
			t.Errorf("root's %s afterwards: uid %d mode %o, %q (%v)", name, st.Uid, st.Mode&07777, b, err)
		}
		must(t, os.Remove(planted))
	}
	return n
}

// staleCreatorChild serves staleCreates' commands on stdin: LOOK PATH and
// CREATE PATH FLAGS, each answered with a line.
func staleCreatorChild() {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		switch cmd {
		case "LOOK":
			var st unix.Stat_t
			fmt.Printf("LOOK %s\n", errnoName(unix.Lstat(arg, &st)))
		case "CREATE":
			p, fl, _ := strings.Cut(arg, " ")
			flags, _ := strconv.Atoi(fl)
			fd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0644)
			if err == nil {
				unix.Close(fd)
			}
			fmt.Printf("CREATE %s\n", errnoName(err))
		}
	}
}

// TestNotMutatedBytes: the stress readers' check of q/ bytes.
func TestNotMutatedBytes(t *testing.T) {
	q, p := stressContent("q/q1", 7), stressContent("p3", 9)
	for _, c := range []struct {
		what string
		data []byte
		ok   bool
	}{
		{"empty", nil, true},
		{"a whole q/ file", q, true},
		{"its first bytes", q[:10], true},
		{"zeros, then a q/ file's body", append(make([]byte, 4096), q[600:]...), true},
		{"zeros, then another q/ file", append(make([]byte, 100), q...), true},
		{"a p file", p, false},
		{"zeros, then a p file", append(make([]byte, 100), p...), false},
		{"a body without its header", q[600:], false},
	} {
		if msg := notMutatedBytes(c.data); (msg == "") != c.ok {
			t.Errorf("%s: %q", c.what, msg)
		}
	}
}

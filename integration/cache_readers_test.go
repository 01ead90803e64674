package integration

// Invalidation under many readers: while goroutines read, stat and list
// through a cache=auto mount without pause, files are replaced, rewritten
// in place and removed on the backing directory; every reader must see
// each change within watchBound and never another file's bytes.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

const concFiles = 4

// concContent is generation gen of file i: a header line naming both, and
// a body whose length moves with gen.
func concContent(i, gen int) []byte {
	b := fmt.Appendf(nil, "gen=%06d file=%d\n", gen, i)
	return append(b, bytes.Repeat([]byte{byte('a' + gen%26)}, 100+gen*37%4000)...)
}

// parseConc reads the generation of data read from file i: whole is
// false for a read that raced an in-place rewrite (bytes of two
// generations, or a size from another); err is set for bytes of another
// file, which no race explains.
func parseConc(i int, data []byte, size int64) (gen int, whole bool, err error) {
	var file int
	if _, err := fmt.Sscanf(string(data), "gen=%06d file=%d\n", &gen, &file); err != nil {
		return 0, false, nil
	}
	if file != i {
		return 0, false, fmt.Errorf("opened c%d, read the bytes of c%d (gen %d)", i, file, gen)
	}
	return gen, bytes.Equal(data, concContent(i, gen)) && size == int64(len(data)), nil
}

// concReader reads the files through the mount until stop, recording the
// newest generation it saw of each (-1: the name was missing).
type concReader struct {
	seen [concFiles]atomic.Int64
	ops  atomic.Int64
	err  atomic.Pointer[error]
}

func (r *concReader) fail(err error) { r.err.CompareAndSwap(nil, &err) }

func (r *concReader) once(dir string, i int) {
	f, err := os.Open(filepath.Join(dir, fmt.Sprintf("c%d", i)))
	if errors.Is(err, unix.ENOENT) {
		r.seen[i].Store(-1)
		return
	}
	if err != nil {
		r.fail(err)
		return
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		r.fail(err)
		return
	}
	data, err := io.ReadAll(f)
	if err != nil {
		r.fail(err)
		return
	}
	gen, whole, err := parseConc(i, data, st.Size)
	if err != nil {
		r.fail(err)
		return
	}
	if whole {
		r.seen[i].Store(int64(gen))
	}
}

func (r *concReader) run(dir string, stop <-chan struct{}) {
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		r.once(dir, n%concFiles)
		if n%7 == 0 {
			for _, e := range listDir(dir) {
				if !strings.HasPrefix(e, "c") && !strings.HasPrefix(e, "tmp") {
					r.fail(fmt.Errorf("readdir: unexpected name %q", e))
				}
			}
		}
		r.ops.Add(1)
	}
}

func listDir(dir string) []string {
	ents, _ := os.ReadDir(dir)
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestBackingChangesUnderConcurrentReaders: 8 readers per passthrough
// mode; the backing side replaces files by rename, rewrites them in place,
// truncates, removes and re-creates them; after each change every reader
// reads it whole within watchBound, and no reader ever reads another
// file's bytes or gets an error other than ENOENT. (A read racing an
// in-place rewrite may mix two generations, as on any file system
// without locks; it is not counted as seen.)
func TestBackingChangesUnderConcurrentReaders(t *testing.T) {
	eachPassthrough(t, func(t *testing.T, mode string, d *daemon) {
		bdir, mdir := filepath.Join(d.Backing, "conc"), filepath.Join(d.Mnt, "conc")
		must(t, os.Mkdir(bdir, 0755))
		for i := 0; i < concFiles; i++ {
			must(t, os.WriteFile(filepath.Join(bdir, fmt.Sprintf("c%d", i)), concContent(i, 0), 0644))
		}
		readers := make([]*concReader, 8)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for k := range readers {
			readers[k] = &concReader{}
			wg.Add(1)
			go func() { defer wg.Done(); readers[k].run(mdir, stop) }()
		}
		defer func() { close(stop); wg.Wait() }()
		for gen := 1; gen <= 24; gen++ {
			i := gen % concFiles
			want := concChange(t, bdir, i, gen)
			eventually(t, fmt.Sprintf("change %d of c%d", gen, i), func() string {
				for k, r := range readers {
					if e := r.err.Load(); e != nil {
						t.Fatalf("reader %d: %v", k, *e)
					}
					if got := r.seen[i].Load(); got != want {
						return fmt.Sprintf("reader %d sees generation %d of c%d, want %d", k, got, i, want)
					}
				}
				return ""
			})
		}
		var ops int64
		for _, r := range readers {
			ops += r.ops.Load()
		}
		t.Logf("%s: 8 readers, %d reads through the mount", mode, ops)
	})
}

// concChange makes change gen to file i on the backing side and returns
// the generation readers must end up seeing (-1: removed).
func concChange(t *testing.T, dir string, i, gen int) int64 {
	p := filepath.Join(dir, fmt.Sprintf("c%d", i))
	switch gen / concFiles % 4 { // each file goes through every kind
	case 2: // remove; the next change of i re-creates it
		must(t, os.Remove(p))
		return -1
	case 0: // replace by rename, the way tools write files
		tmp := filepath.Join(dir, fmt.Sprintf("tmp%d", gen))
		must(t, os.WriteFile(tmp, concContent(i, gen), 0644))
		must(t, os.Rename(tmp, p))
	default: // rewrite in place (create, or truncate and write)
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0644)
		must(t, err)
		data := concContent(i, gen)
		_, err = f.WriteAt(data, 0)
		must(t, err)
		must(t, f.Truncate(int64(len(data))))
		must(t, f.Close())
	}
	return int64(gen)
}

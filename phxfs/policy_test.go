package phxfs

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestParseDirectIO(t *testing.T) {
	for s, want := range map[string]ODirect{"": ODirectAuto, "auto": ODirectAuto, "never": ODirectNever, "off": ODirectNever, "always": ODirectAlways, "on": ODirectAlways} {
		got, err := ParseODirect(s)
		if err != nil || got != want {
			t.Errorf("ParseODirect(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	if _, err := ParseODirect("sometimes"); err == nil {
		t.Error("ParseODirect(sometimes) succeeded")
	}
	for _, d := range []ODirect{ODirectAuto, ODirectNever, ODirectAlways} {
		if got, err := ParseODirect(d.String()); err != nil || got != d {
			t.Errorf("round trip of %v: %v, %v", d, got, err)
		}
	}
}

// withDirectIO sets l's policy for one test.
func withDirectIO(t *testing.T, l *Lib, d ODirect) {
	prev := l.SetODirect(d)
	t.Cleanup(func() { l.SetODirect(prev) })
}

// cacheState is cachestat(2) over a whole file; it skips the test where the
// kernel has no cachestat.
func cacheState(t *testing.T, name string) cachestatResult {
	t.Helper()
	fd := openFile(t, name, unix.O_RDONLY)
	r := cachestatRange{}
	var cs cachestatResult
	_, _, e := unix.Syscall6(sysCachestat, uintptr(fd), uintptr(unsafe.Pointer(&r)), uintptr(unsafe.Pointer(&cs)), 0, 0, 0)
	if e != 0 {
		t.Skipf("cachestat(2) unavailable here (%v): the auto policy reads buffered", e)
	}
	return cs
}

// dropCache writes the file back and drops its pages from the page cache.
// A library that gathered from the file keeps its pages mapped until the
// mapping has been idle for gatherIdle: the drop is tried again meanwhile.
func dropCache(t *testing.T, name string) {
	t.Helper()
	fd := openFile(t, name, unix.O_RDONLY)
	if err := unix.Fsync(fd); err != nil {
		t.Fatal(err)
	}
	var cs cachestatResult
	for end := time.Now().Add(gatherIdle + 2*time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
		if cs = cacheState(t, name); cs.nrCache == 0 || time.Now().After(end) {
			break
		}
	}
	if cs.nrCache != 0 {
		t.Skipf("the page cache kept %d pages of the file after FADV_DONTNEED", cs.nrCache)
	}
}

// needDirectIO skips where the test file's file system takes no O_DIRECT.
func needDirectIO(t *testing.T, name string) {
	t.Helper()
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, name, 0, unix.STATX_DIOALIGN, &st); err != nil || st.Mask&unix.STATX_DIOALIGN == 0 || st.Dio_offset_align == 0 {
		t.Skipf("%s: the file system reports no O_DIRECT alignment (statx: %v)", name, err)
	}
	fd, err := unix.Open(name, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("%s: O_DIRECT open: %v", name, err)
	}
	unix.Close(fd)
}

type extent struct{ bufOff, off, n int64 }

// readExtents reads the extents into m as one batch.
func readExtents(t *testing.T, l *Lib, fd int, m interface{ Addr() uint64 }, ext []extent) {
	t.Helper()
	reqs := make([]Request, len(ext))
	for i, e := range ext {
		reqs[i] = Request{Fd: fd, Device: 0, DevAddr: m.Addr(), BufOffset: e.bufOff, Len: e.n, FileOffset: e.off}
	}
	if n, err := l.ReadBatch(reqs); n != 0 || err != nil {
		t.Fatalf("batch: %d failed, %v: %s", n, err, describe(reqs))
	}
}

func TestStagedDirectIOPolicy(t *testing.T) {
	if !slices.Contains(testTransports(), Staged) {
		t.Skipf("the staged transport's O_DIRECT policy: PHX_TEST_CONNECTOR=%s runs only %v, not staged", os.Getenv("PHX_TEST_CONNECTOR"), testTransports())
	}
	for _, engine := range []string{"io_uring", "sync"} {
		t.Run(engine, func(t *testing.T) {
			s := setup{engine, Staged}
			l, c := newLib(t, s, 1) // 256 KiB bounce buffers, 3 workers
			const size = 3*mib + 1234
			name := patternFile(t, size)
			needDirectIO(t, name)
			file := make([]byte, size)
			fillPattern(file, 0)
			m := alloc(t, c, 0, 4*mib)
			register(t, l, m)
			fd := openFile(t, name, unix.O_RDONLY)
			// Unaligned offsets and lengths, a piece ending in the file's
			// last partial block, one ending exactly at the end of file.
			ext := []extent{{0, 777, mib + 5}, {mib + 64<<10, mib + 4093, 700 << 10}, {2*mib + 64<<10, 3*mib - 3, 1237}, {3 * mib, 0, 4096}}
			// load reads the extents, checks them on the device and clears
			// it again; it returns the staged counters before and after.
			load := func() (s0, s1 StagedStats) {
				t.Helper()
				s0 = l.StagedStats()
				readExtents(t, l, fd, m, ext)
				got := deviceBytes(t, c, m, 0, 4*mib)
				for _, e := range ext {
					if !bytes.Equal(got[e.bufOff:e.bufOff+e.n], file[e.off:e.off+e.n]) {
						t.Fatalf("extent %+v: device bytes differ from the file", e)
					}
				}
				fillDevice(t, c, m, 0, make([]byte, 4*mib))
				return s0, l.StagedStats()
			}

			t.Run("always", func(t *testing.T) {
				withDirectIO(t, l, ODirectAlways)
				// From a cold file, so the check below does not depend on
				// what the kernel keeps of a hot one meanwhile.
				dropCache(t, name)
				s0, s1 := load()
				if s1.DirectReads == s0.DirectReads {
					t.Fatalf("no O_DIRECT read (counters %+v -> %+v)", s0, s1)
				}
				if s1.BufferedReads == s0.BufferedReads {
					t.Fatalf("the last partial block was not read buffered (counters %+v -> %+v)", s0, s1)
				}
				if s1.Fallbacks != s0.Fallbacks {
					t.Fatalf("O_DIRECT reads fell back: %+v -> %+v", s0, s1)
				}
				// O_DIRECT reads do not fill the page cache: only the
				// buffered tail block may be there now.
				if cs := cacheState(t, name); cs.nrCache*uint64(os.Getpagesize()) > 64<<10 {
					t.Fatalf("O_DIRECT reads filled the page cache: %d pages", cs.nrCache)
				}
			})
			t.Run("never", func(t *testing.T) {
				withDirectIO(t, l, ODirectNever)
				if s0, s1 := load(); s1.DirectReads != s0.DirectReads || s1.BufferedReads == s0.BufferedReads {
					t.Fatalf("never: counters %+v -> %+v", s0, s1)
				}
			})
			t.Run("auto", func(t *testing.T) {
				withDirectIO(t, l, ODirectAuto)
				// Hot (just written): everything buffered.
				cacheState(t, name)
				if s0, s1 := load(); s1.DirectReads != s0.DirectReads {
					t.Fatalf("auto read a resident file with O_DIRECT: %+v -> %+v", s0, s1)
				}
				// Cold: O_DIRECT, and the page cache stays empty of it.
				dropCache(t, name)
				if s0, s1 := load(); s1.DirectReads == s0.DirectReads {
					t.Fatalf("auto read a cold file buffered only: %+v -> %+v", s0, s1)
				}
				cs := cacheState(t, name)
				// Only the buffered tail block may have been cached.
				if cs.nrCache*uint64(os.Getpagesize()) > 64<<10 {
					t.Fatalf("a cold O_DIRECT load filled the page cache: %d pages", cs.nrCache)
				}
			})
		})
	}
}

// TestStagedDirectIOWithDirectFd: a descriptor opened O_DIRECT by the caller
// gets no second O_DIRECT descriptor; aligned reads work as before.
func TestStagedDirectIOWithDirectFd(t *testing.T) {
	l, c := newLib(t, setup{"io_uring", Staged}, 1)
	withDirectIO(t, l, ODirectAlways)
	name := patternFile(t, 2*mib)
	needDirectIO(t, name)
	m := alloc(t, c, 0, 2*mib)
	register(t, l, m)
	fd := openFile(t, name, unix.O_RDONLY|unix.O_DIRECT)
	s0 := l.StagedStats()
	if n, err := l.Read(fd, 0, m.Addr(), 0, mib, 4096); err != nil || n != mib {
		t.Fatalf("read: %d, %v", n, err)
	}
	checkPattern(t, deviceBytes(t, c, m, 0, mib), 4096)
	if s1 := l.StagedStats(); s1.DirectReads != s0.DirectReads {
		t.Fatalf("an O_DIRECT descriptor got a second one: %+v -> %+v", s0, s1)
	}
}

// TestStagedBuffers: more bounce buffers per worker move the same bytes,
// reads and writes, on both engines.
func TestStagedBuffers(t *testing.T) {
	if !slices.Contains(testTransports(), Staged) {
		t.Skipf("PHX_TEST_CONNECTOR=%s runs no staged transport", os.Getenv("PHX_TEST_CONNECTOR"))
	}
	for _, n := range []int{3, 4, 8, 16} {
		// Groups of n/2 reads in flight, through the page cache and (at 8
		// and 16) around it.
		mode := ODirectNever
		if n >= 8 {
			mode = ODirectAlways
		}
		for _, engine := range []string{"io_uring", "sync"} {
			l, c := newLib(t, setup{engine, Staged}, 1, func(c *Config) { c.StagedBuffers, c.ODirect = n, mode })
			if l.cfg.StagedBuffers != n || l.ODirectPolicy() != mode {
				t.Fatalf("config gave %d buffers, policy %v", l.cfg.StagedBuffers, l.ODirectPolicy())
			}
			name := patternFile(t, 3*mib)
			m := alloc(t, c, 0, 4*mib)
			register(t, l, m)
			fd := openFile(t, name, unix.O_RDONLY)
			before := l.StagedStats()
			if got, err := l.Read(fd, 0, m.Addr(), 64<<10, 3*mib-8192, 8192); err != nil || got != 3*mib-8192 {
				t.Fatalf("%d buffers, %s: read %d, %v", n, engine, got, err)
			}
			if direct := l.StagedStats().DirectReads - before.DirectReads; (mode == ODirectAlways) != (direct > 0) {
				t.Fatalf("%d buffers, policy %v: %d O_DIRECT reads", n, mode, direct)
			}
			checkPattern(t, deviceBytes(t, c, m, 64<<10, 3*mib-8192), 8192)
			out := openFile(t, name+".w", unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC)
			if got, err := l.Write(out, 0, m.Addr(), 64<<10, 2*mib, 0); err != nil || got != 2*mib {
				t.Fatalf("%d buffers, %s: write %d, %v", n, engine, got, err)
			}
			got := make([]byte, 2*mib)
			if _, err := unix.Pread(out, got, 0); err != nil {
				t.Fatal(err)
			}
			checkPattern(t, got, 8192)
		}
	}
	for _, n := range []int{1, 33, -1} {
		if _, err := stagedBuffersFrom(n); !errors.Is(err, unix.EINVAL) {
			t.Fatalf("%d buffers per worker: %v, want EINVAL (not clamped)", n, err)
		}
	}
	for _, v := range []string{"lots", "1", "100"} {
		t.Setenv(EnvStagedBuffers, v)
		if _, err := New(Config{Connector: newConnector(t, setup{"sync", Staged}, 1)}); !errors.Is(err, unix.EINVAL) {
			t.Fatalf("New with %s=%s: %v, want EINVAL", EnvStagedBuffers, v, err)
		}
	}
	t.Setenv(EnvStagedBuffers, "4")
	if n, err := stagedBuffersFrom(0); n != 4 || err != nil {
		t.Fatalf("%s=4 gave %d, %v", EnvStagedBuffers, n, err)
	}
	t.Setenv(EnvODirect, "sometimes")
	if _, err := New(Config{Connector: newConnector(t, setup{"sync", Staged}, 1)}); err == nil {
		t.Fatal("New accepted PHX_DIRECT_IO=sometimes")
	}
}

// TestBatchResidency checks how a batch asks the page cache: by chunk
// where its transfers are packed (one answer for all of them), transfer
// by transfer where they are scattered, and exactly, page by page, where a
// chunk is only partly cached.
func TestBatchResidency(t *testing.T) {
	name := patternFile(t, 8<<20)
	cacheState(t, name)
	fd := openFile(t, name, unix.O_RDONLY)
	batch := func(off, stride, n, count int64) batchFiles {
		p := &plan{}
		for i := int64(0); i < count; i++ {
			p.xfers = append(p.xfers, xfer{fd: fd, off: off + i*stride, len: n, staged: true})
		}
		return newBatchFiles(p, nil)
	}
	check := func(what string, bf batchFiles, wantDense bool, want func(off int64) bool, wantChunks int) {
		t.Helper()
		f := bf[fd]
		if f.dense != wantDense {
			t.Fatalf("%s: dense %v, want %v (span [%d, %d))", what, f.dense, wantDense, f.lo, f.hi)
		}
		for i := range 64 {
			x := &xfer{fd: fd, off: f.lo + int64(i)*(f.hi-f.lo)/64, len: 1024}
			if res, ok := f.resident(x); !ok || res != want(x.off) {
				t.Fatalf("%s: resident(%d) = %v, %v; want %v", what, x.off, res, ok, want(x.off))
			}
		}
		asked := 0
		for i := range f.chunks {
			if f.chunks[i].Load() != chunkUnknown {
				asked++
			}
		}
		if asked != wantChunks {
			t.Fatalf("%s: %d chunks asked about, want %d", what, asked, wantChunks)
		}
	}
	all := func(int64) bool { return true }

	// A column slice: 1 KiB of every 8 KiB row.
	check("packed, hot", batch(0, 8<<10, 1024, 1024), true, all, 1)
	// KV blocks: 16 KiB every 2 MiB.
	check("scattered, hot", batch(0, 2<<20, 16<<10, 4), false, all, 0)

	dropCache(t, name)
	b := make([]byte, 64<<10)
	if _, err := unix.Pread(fd, b, 1<<20); err != nil { // the page cache now holds [1 MiB, 1 MiB + 64 KiB) and readahead
		t.Fatal(err)
	}
	var cs cachestatResult
	r := cachestatRange{off: 0, len: 8 << 20}
	unix.Syscall6(sysCachestat, uintptr(fd), uintptr(unsafe.Pointer(&r)), uintptr(unsafe.Pointer(&cs)), 0, 0, 0)
	if cs.nrCache >= 2048 {
		t.Skipf("readahead cached the whole file (%d pages): no partly cached file to ask about", cs.nrCache)
	}
	exact := func(off int64) bool {
		res, _ := resident(fd, off, 1024)
		return res
	}
	if !exact(1<<20) || exact(7<<20) {
		t.Fatalf("pread of 1 MiB left the page cache holding [1 MiB] %v, [7 MiB] %v", exact(1<<20), exact(7<<20))
	}
	check("packed, partly cached", batch(0, 8<<10, 1024, 1024), true, exact, 1)
	check("scattered, partly cached", batch(0, 2<<20, 16<<10, 4), false, exact, 0)
}

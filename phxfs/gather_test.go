package phxfs

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/ioengine"
)

// gatherLib is a staged library on an emulated device with the file's
// pages resident (the test wrote them).
func gatherLib(t *testing.T, tweak ...func(*Config)) (*Lib, *testMem, int, string) {
	t.Helper()
	c := emuStaged(t, 1)
	l := newLibOn(t, c, setup{"io_uring", Staged}, 1, tweak...)
	name := patternFile(t, 4*mib)
	if cs := cacheState(t, name); cs.nrCache == 0 {
		t.Fatalf("the test file's pages are not in the page cache just after it was written")
	}
	m := alloc(t, c, 0, 4*mib)
	register(t, l, m)
	return l, &testMem{m, c}, openFile(t, name, unix.O_RDONLY), name
}

// testMem is device memory and its connector.
type testMem struct {
	m connector.Memory
	c connector.Connector
}

func (tm *testMem) Addr() uint64 { return tm.m.Addr() }

// TestGatherResidentPieces: small pieces of a resident file (a column
// slice of every row, and scattered KV-style blocks) are copied from the
// file's mapping, land byte for byte, and a later batch reuses the
// mapping; off, the engine reads them.
func TestGatherResidentPieces(t *testing.T) {
	for _, on := range []bool{true, false} {
		tweak := func(c *Config) {
			if !on {
				c.GatherMax = -1
			}
		}
		l, tm, fd, _ := gatherLib(t, tweak)
		s0 := l.StagedStats()
		reqs := []Request{
			{Fd: fd, Device: 0, DevAddr: tm.Addr(), Len: 512, FileOffset: 3 * 512, Count: 1024, FileStride: 4096, BufStride: 512},
			{Fd: fd, Device: 0, DevAddr: tm.Addr(), BufOffset: 2 * mib, Len: 16 << 10, FileOffset: 3*mib + 8},
			{Fd: fd, Device: 0, DevAddr: tm.Addr(), BufOffset: 3 * mib, Len: 16 << 10, FileOffset: 40960},
		}
		if failed, err := l.ReadBatch(reqs); failed != 0 || err != nil {
			t.Fatalf("gather=%v: %d failed, %v: %s", on, failed, err, describe(reqs))
		}
		got := deviceBytes(t, tm.c, tm.m, 0, 1024*512)
		for r := int64(0); r < 1024; r++ {
			checkPattern(t, got[r*512:(r+1)*512], r*4096+3*512)
		}
		checkPattern(t, deviceBytes(t, tm.c, tm.m, 2*mib, 16<<10), 3*mib+8)
		checkPattern(t, deviceBytes(t, tm.c, tm.m, 3*mib, 16<<10), 40960)
		s1 := l.StagedStats()
		gathered := s1.GatheredReads - s0.GatheredReads
		if on && (gathered < 3 || s1.GatheredBytes-s0.GatheredBytes != 1024*512+32<<10) {
			t.Fatalf("gathers on: %d gathered reads of %d bytes, want every piece's", gathered, s1.GatheredBytes-s0.GatheredBytes)
		}
		if !on && gathered != 0 {
			t.Fatalf("gathers off: %d gathered reads", gathered)
		}
		if on {
			l.maps.mu.Lock()
			n, m := len(l.maps.m), firstMap(&l.maps)
			l.maps.mu.Unlock()
			if n != 1 || m.refs != 0 {
				t.Fatalf("%d mappings (refs %d) after the batch, want 1 unused", n, m.refs)
			}
			if _, err := l.Read(fd, 0, tm.Addr(), 0, 4096, 8192); err != nil {
				t.Fatal(err)
			}
			if firstMap(&l.maps) != m {
				t.Fatalf("a second batch mapped the file again")
			}
		}
	}
}

func firstMap(fm *fileMaps) *fileMap {
	for _, m := range fm.m {
		return m
	}
	return nil
}

// TestGatherFileChangedSize: a file that grew or shrank since it was
// mapped is mapped again at its new size; reads past the new end are short.
func TestGatherFileChangedSize(t *testing.T) {
	l, tm, fd, name := gatherLib(t)
	if _, err := l.Read(fd, 0, tm.Addr(), 0, 4096, 0); err != nil {
		t.Fatal(err)
	}
	old := firstMap(&l.maps)
	wfd := openFile(t, name, unix.O_RDWR)
	if err := unix.Ftruncate(wfd, 2*mib+100); err != nil {
		t.Fatal(err)
	}
	n, err := l.Read(fd, 0, tm.Addr(), 0, 4096, 2*mib)
	if err != nil || n != 100 {
		t.Fatalf("read across the new end: %d, %v; want 100", n, err)
	}
	checkPattern(t, deviceBytes(t, tm.c, tm.m, 0, 96), 2*mib)
	if m := firstMap(&l.maps); m == old || m.size != 2*mib+100 || !old.stale {
		t.Fatalf("the old mapping (%d bytes) was not replaced", old.size)
	}
}

// TestGatherFaultFallsBackToTheEngine: a file that shrinks under a mapping
// in use makes the gather fault (SIGBUS); the read is redone with the
// engine and comes back short at the new end, and the daemon lives.
func TestGatherFaultFallsBackToTheEngine(t *testing.T) {
	l, tm, fd, name := gatherLib(t)
	m, err := l.maps.acquire(fd)
	if err != nil || m == nil {
		t.Fatalf("acquire: %v", err)
	}
	defer l.maps.release(m)
	wfd := openFile(t, name, unix.O_RDWR)
	if err := unix.Ftruncate(wfd, 8192); err != nil {
		t.Fatal(err)
	}
	eng, err := ioengine.New("sync", 8)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	slot := make([]byte, 64<<10)
	bf := &batchFile{src: fd, fd: -1, maps: &l.maps, mapping: m}
	xs := []xfer{{fd: fd, off: 4096, len: 16 << 10}, {fd: fd, off: 1 * mib, len: 16 << 10}}
	r := stagedReader{l: l, xfers: xs, slots: [][]byte{slot}, eng: eng, gathers: 2}
	r.reads = []slotRead{{i: 0, slot: 0, bf: bf, gather: true}, {i: 1, slot: 0, at: 32 << 10, bf: bf, gather: true}}
	r.gatherGroup()
	if r.reads[0].res != 4096 || r.reads[1].res != 0 {
		t.Fatalf("gathers across and past the new end: %d and %d bytes, want 4096 and 0", r.reads[0].res, r.reads[1].res)
	}
	checkPattern(t, slot[:4096], 4096)
	_ = tm
}

func TestMergePieces(t *testing.T) {
	ps := []connector.Piece{{Off: 0, Dev: 100, Len: 10}, {Off: 10, Dev: 110, Len: 5}, {Off: 15, Dev: 200, Len: 5},
		{Off: 64, Dev: 205, Len: 5}, {Off: 69, Dev: 210, Len: 1}}
	reg := &region{}
	xs := []xfer{{reg: reg}, {reg: reg}, {reg: reg}, {reg: reg}, {reg: reg}}
	got := mergePieces(nil, ps, []int{0, 1, 2, 3, 4}, xs)
	want := []connector.Piece{{Off: 0, Dev: 100, Len: 15}, {Off: 15, Dev: 200, Len: 5}, {Off: 64, Dev: 205, Len: 6}}
	if len(got) != len(want) {
		t.Fatalf("merged %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("merged %v, want %v", got, want)
		}
	}
	if ps[0].Len != 10 {
		t.Fatalf("the pieces themselves changed")
	}
}

// BenchmarkColumnSlice reads a rank's column slice of every row of a
// resident [4096, 7168] bf16 tensor (world 8: 1,792-byte pieces) on the
// emulated staged device, gathered from the mapping or read with the
// engine: the daemon's share of a tensor-parallel load.
func BenchmarkColumnSlice(b *testing.B) {
	const rows, rowBytes, slice = 4096, 14336, 1792
	for _, on := range []bool{true, false} {
		b.Run(map[bool]string{true: "gather", false: "engine"}[on], func(b *testing.B) {
			c := emuStaged(b, 1)
			l := newLibOn(b, c, setup{"io_uring", Staged}, 1, func(cfg *Config) {
				cfg.Workers = 2
				if !on {
					cfg.GatherMax = -1
				}
			})
			name := patternFile(b, rows*rowBytes)
			fd := openFile(b, name, unix.O_RDONLY)
			m := alloc(b, c, 0, rows*slice)
			register(b, l, m)
			req := Request{Fd: fd, Device: 0, DevAddr: m.Addr(), Len: slice, FileOffset: 7 * slice, Count: rows, FileStride: rowBytes, BufStride: slice}
			b.SetBytes(rows * slice)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r := []Request{req}
				if failed, err := l.ReadBatch(r); failed != 0 || err != nil {
					b.Fatalf("%d failed, %v", failed, err)
				}
			}
		})
	}
}

// TestGatherLeavesTheCacheDroppable: once no batch has used it for the
// idle time, the library maps no page of a file it gathered from, so
// emptying the page cache (what a cold benchmark or a user does) still
// empties it.
func TestGatherLeavesTheCacheDroppable(t *testing.T) {
	l, tm, fd, name := gatherLib(t)
	l.maps.idle = 20 * time.Millisecond
	s0 := l.StagedStats()
	reqs := []Request{{Fd: fd, Device: 0, DevAddr: tm.Addr(), Len: 512, Count: 2048, FileStride: 2048, BufStride: 512}}
	if failed, err := l.ReadBatch(reqs); failed != 0 || err != nil {
		t.Fatalf("%d failed, %v", failed, err)
	}
	if l.StagedStats().GatheredReads == s0.GatheredReads {
		t.Fatalf("nothing was gathered")
	}
	if firstMap(&l.maps) == nil {
		t.Fatalf("no mapping kept")
	}
	wfd := openFile(t, name, unix.O_RDONLY)
	if err := unix.Fsync(wfd); err != nil { // dirty pages stay whatever maps them
		t.Fatal(err)
	}
	var left uint64
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if err := unix.Fadvise(wfd, 0, 0, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
		if left = cacheState(t, name).nrCache; left == 0 {
			return
		}
	}
	t.Fatalf("%d pages stayed in the page cache after FADV_DONTNEED, 5 s after the batch", left)
}

func TestGatherEnv(t *testing.T) {
	for v, want := range map[string]int64{"": DefaultGatherMax, "auto": DefaultGatherMax, "off": -1} {
		t.Setenv(EnvGather, v)
		if got, err := gatherMaxFrom(0); err != nil || got != want {
			t.Errorf("%s=%q: %d, %v; want %d", EnvGather, v, got, err, want)
		}
	}
	t.Setenv(EnvGather, "sometimes")
	if _, err := gatherMaxFrom(0); !errors.Is(err, unix.EINVAL) || CheckEnv() == nil {
		t.Errorf("a bad %s passed: %v", EnvGather, err)
	}
	if got, _ := gatherMaxFrom(4096); got != 4096 {
		t.Errorf("Config.GatherMax 4096 became %d", got)
	}
}

// TestColumnSliceRuns: a column slice read through the staged transport is
// planned as runs of its rows' pieces (a few xfers, not one per row),
// spread over the workers, and lands byte for byte whether the file is hot
// (gathered) or cold (read piece by piece); a slice that runs past the end
// of the file stops there, with the bytes up to it.
func TestColumnSliceRuns(t *testing.T) {
	l, tm, fd, name := gatherLib(t, func(c *Config) { c.Workers = 4 })
	const rows, row, piece = 1024, 4096, 700 // odd widths: the runs pack pieces at any byte
	req := func(off int64, count int64) Request {
		return Request{Fd: fd, Device: 0, DevAddr: tm.Addr(), Len: piece, FileOffset: off, Count: count,
			FileStride: row, BufStride: piece}
	}
	file := make([]byte, 4*mib)
	fillPattern(file, 0)
	check := func(what string, want int64) {
		t.Helper()
		got := deviceBytes(t, tm.c, tm.m, 0, want)
		for r := int64(0); r*piece < want; r++ {
			n := min(piece, want-r*piece)
			if off := 1000 + r*row; !bytes.Equal(got[r*piece:r*piece+n], file[off:off+n]) {
				t.Fatalf("%s: row %d's piece differs from the file's bytes at %d", what, r, off)
			}
		}
	}
	p, err := l.prepare(false, []Request{req(1000, rows)})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(p.xfers); n < 4 || n > rows/16 {
		t.Errorf("%d rows planned as %d xfers: want a few runs, at least one a worker", rows, n)
	}
	l.finish(p)

	for _, cold := range []bool{false, true} {
		if cold {
			dropCache(t, name)
		}
		s0 := l.StagedStats()
		reqs := []Request{req(1000, rows)}
		if failed, err := l.ReadBatch(reqs); failed != 0 || err != nil {
			t.Fatalf("cold=%v: %d failed, %v: %s", cold, failed, err, describe(reqs))
		}
		check(fmt.Sprintf("cold=%v", cold), rows*piece)
		s1 := l.StagedStats()
		gathered, read := s1.GatheredReads > s0.GatheredReads, s1.BufferedReads > s0.BufferedReads
		// Cold: the engine reads the runs, though the readahead of one
		// run's reads may have cached the next whole.
		if (!cold && (!gathered || read)) || (cold && !read) {
			t.Errorf("cold=%v: gathered %v, read through the page cache %v", cold, gathered, read)
		}
	}

	// 4 MiB file: rows past 1024 lie past its end; the slice stops in the
	// row that crosses it (none does here: 4 MiB is 1024 whole rows).
	reqs := []Request{req(1000, rows+8)}
	if failed, err := l.ReadBatch(reqs); failed != 1 || err != nil || reqs[0].Result != rows*piece {
		t.Fatalf("past the end: %d failed, %v, result %d, want %d", failed, err, reqs[0].Result, rows*piece)
	}
	check("past the end", rows*piece)
	reqs = []Request{req(4*mib-row+3700, 3)} // the first piece crosses the end: 396 bytes of it
	if failed, err := l.ReadBatch(reqs); failed != 1 || err != nil || reqs[0].Result != 396 {
		t.Fatalf("crossing the end: %d failed, %v, result %d, want 396", failed, err, reqs[0].Result)
	}
}

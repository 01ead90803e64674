package ioengine

import (
	"math/rand/v2"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// sentinel marks destination bytes an op must not touch.
const sentinel = 0xEE

// runChecked runs ops and checks them with checkReads.
func (r runner) runChecked(t *testing.T, ops []Op, want []int64, mem []byte, direct bool) {
	t.Helper()
	if err := r.run(ops); err != nil {
		t.Fatal(err)
	}
	checkReads(t, ops, want, mem, direct)
}

// checkReads verifies each read op against the pattern: Result is want[i],
// the bytes read are the file's, and the bytes past Result are untouched,
// or zero for O_DIRECT: ext4's direct reads zero-fill the destination past
// end of file (the kernel leaves bytes past the count unspecified).
func checkReads(t *testing.T, ops []Op, want []int64, mem []byte, direct bool) {
	t.Helper()
	base := addr(mem)
	bad := 0
	for i, op := range ops {
		if op.Result != want[i] {
			t.Errorf("op %d (off %d len %d): Result %d (%v), want %d", i, op.Off, op.Len, op.Result, errno(op.Result), want[i])
			bad++
		} else if op.Result > 0 {
			start := int(op.Addr - base)
			if !checkPattern(t, "op data", mem[start:start+int(op.Result)], op.Off) {
				bad++
			}
			for j := start + int(op.Result); j < start+int(op.Len); j++ {
				if mem[j] != sentinel && !(direct && mem[j] == 0) {
					t.Errorf("op %d wrote past its result at byte %d: %#x", i, j-start, mem[j])
					bad++
					break
				}
			}
		}
		if bad > 10 {
			t.Fatal("too many bad ops")
		}
	}
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

func TestBufferedRead(t *testing.T) {
	dir := testDir(t)
	const size = 1<<20 + 777
	path := patternFile(t, dir, size)
	forEachRunner(t, func(t *testing.T, r runner) {
		fd := openFd(t, path, unix.O_RDONLY)
		rng := rand.New(rand.NewPCG(1, 2))
		const n = 300
		mem := mmapAnon(t, n*(64<<10+8))
		fill(mem, sentinel)
		ops := make([]Op, n)
		want := make([]int64, n)
		pos := 0
		for i := range ops {
			off := rng.Int64N(size + 100) // a few start past the end
			ln := 1 + rng.Int64N(64<<10)
			ops[i] = Op{Fd: fd, Addr: addr(mem) + uintptr(pos) + uintptr(i&7), Len: ln, Off: off}
			want[i] = max(0, min(ln, size-off))
			pos += int(ln) + 8
		}
		r.runChecked(t, ops, want, mem, false)
	})
}

func TestDirectRead(t *testing.T) {
	dir := testDir(t)
	skipIfNoDirect(t, dir)
	const size = 4<<20 + 8192
	path := patternFile(t, dir, size)
	forEachRunner(t, func(t *testing.T, r runner) {
		fd := openFd(t, path, unix.O_RDONLY|unix.O_DIRECT)
		rng := rand.New(rand.NewPCG(3, 4))
		const n = 200
		mem := mmapAnon(t, n*(256<<10))
		fill(mem, sentinel)
		ops := make([]Op, n)
		want := make([]int64, n)
		pos := 0
		for i := range ops {
			off := 4096 * rng.Int64N(size/4096)
			ln := 4096 * (1 + rng.Int64N(64))
			ops[i] = Op{Fd: fd, Addr: addr(mem) + uintptr(pos), Len: ln, Off: off}
			want[i] = min(ln, size-off)
			pos += int(ln)
		}
		r.runChecked(t, ops, want, mem, true)

		// An unaligned O_DIRECT read is refused by the kernel, not by us.
		bad := []Op{{Fd: fd, Addr: addr(mem) + 1, Len: 4096, Off: 0}}
		if err := r.run(bad); err != nil {
			t.Fatal(err)
		}
		if bad[0].Result != -int64(unix.EINVAL) {
			t.Errorf("unaligned O_DIRECT read: Result %d, want -EINVAL", bad[0].Result)
		}
	})
}

func TestReadEOF(t *testing.T) {
	dir := testDir(t)
	skipIfNoDirect(t, dir)
	const size = 3*4096 + 1000
	path := patternFile(t, dir, size)
	cases := []struct {
		off, len, want int64
		direct         bool // aligned, so also valid with O_DIRECT
	}{
		{8192, 4096, 4096, true},
		{8192, 8192, size - 8192, true}, // short: continued, then EOF
		{12288, 4096, 1000, true},
		{16384, 4096, 0, true}, // past EOF
		{size, 100, 0, false},  // at EOF
		{size - 38, 100, 38, false},
		{size + 12345, 7, 0, false},
	}
	forEachRunner(t, func(t *testing.T, r runner) {
		for _, direct := range []bool{false, true} {
			flags := unix.O_RDONLY
			if direct {
				flags |= unix.O_DIRECT
			}
			fd := openFd(t, path, flags)
			mem := mmapAnon(t, len(cases)*16384)
			fill(mem, sentinel)
			var ops []Op
			var want []int64
			for i, c := range cases {
				if direct && !c.direct {
					continue
				}
				ops = append(ops, Op{Fd: fd, Addr: addr(mem) + uintptr(i*16384), Len: c.len, Off: c.off})
				want = append(want, c.want)
			}
			r.runChecked(t, ops, want, mem, direct)
		}
	})
}

func TestWriteReadBack(t *testing.T) {
	dir := testDir(t)
	skipIfNoDirect(t, dir)
	const chunk, n = 64 << 10, 64
	forEachRunner(t, func(t *testing.T, r runner) {
		for _, direct := range []bool{false, true} {
			f, err := os.CreateTemp(dir, "write-")
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			flags := unix.O_WRONLY
			if direct {
				flags |= unix.O_DIRECT
			}
			wfd := openFd(t, f.Name(), flags)
			src := mmapAnon(t, chunk*n)
			fillPattern(src, 0)
			ops := make([]Op, n)
			for i, k := range rand.New(rand.NewPCG(5, 6)).Perm(n) {
				ops[i] = Op{Fd: wfd, Write: true, Addr: addr(src) + uintptr(k*chunk), Len: chunk, Off: int64(k * chunk)}
			}
			if err := r.run(ops); err != nil {
				t.Fatal(err)
			}
			for i, op := range ops {
				if op.Result != chunk {
					t.Fatalf("write op %d: Result %d (%v), want %d", i, op.Result, errno(op.Result), chunk)
				}
			}
			got, err := os.ReadFile(f.Name())
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != chunk*n {
				t.Fatalf("file is %d bytes, want %d", len(got), chunk*n)
			}
			checkPattern(t, "file written", got, 0)

			// And back through the engine.
			rfd := openFd(t, f.Name(), unix.O_RDONLY|flags&unix.O_DIRECT)
			dst := mmapAnon(t, chunk*n)
			want := make([]int64, n)
			for i := range ops {
				ops[i] = Op{Fd: rfd, Addr: addr(dst) + uintptr(ops[i].Off), Len: chunk, Off: ops[i].Off}
				want[i] = chunk
			}
			r.runChecked(t, ops, want, dst, direct)
		}
	})
}

func TestBadOps(t *testing.T) {
	dir := testDir(t)
	const size = 1 << 20
	path := patternFile(t, dir, size)
	forEachRunner(t, func(t *testing.T, r runner) {
		fd := openFd(t, path, unix.O_RDONLY)
		dfd := openFd(t, dir, unix.O_RDONLY|unix.O_DIRECTORY)
		mem := mmapAnon(t, 16*8192)
		fill(mem, sentinel)
		a := func(i int) uintptr { return addr(mem) + uintptr(i*8192) }
		ops := []Op{
			{Fd: fd, Addr: a(0), Len: 8192, Off: 0},
			{Fd: -1, Addr: a(1), Len: 8192, Off: 0},
			{Fd: fd, Addr: a(2), Len: 8192, Off: 8192},
			{Fd: 1 << 20, Addr: a(3), Len: 8192, Off: 0}, // not open
			{Fd: fd, Write: true, Addr: a(4), Len: 8192, Off: 0},
			{Fd: dfd, Addr: a(5), Len: 8192, Off: 0},
			{Fd: fd, Addr: a(6), Len: -1, Off: 0},
			{Fd: fd, Addr: a(7), Len: 8192, Off: -8192},
			{Fd: fd, Addr: a(8), Len: 0, Off: 0},
			{Fd: fd, Addr: a(9), Len: 8192, Off: 1<<63 - 4096}, // Off+Len overflows
			{Fd: fd, Addr: a(10), Len: 8192, Off: size - 8192},
		}
		want := []int64{8192, -int64(unix.EBADF), 8192, -int64(unix.EBADF), -int64(unix.EBADF),
			-int64(unix.EISDIR), -int64(unix.EINVAL), -int64(unix.EINVAL), 0, -int64(unix.EINVAL), 8192}
		for i := range ops {
			ops[i].Result = 12345 // every op must set its result
		}
		r.runChecked(t, ops, want, mem, false)
		// Failed ops must not touch memory either.
		for i := range ops {
			if want[i] <= 0 {
				for j := i * 8192; j < (i+1)*8192; j++ {
					if mem[j] != sentinel {
						t.Fatalf("failed op %d wrote memory", i)
					}
				}
			}
		}
	})
}

// TestManyOps keeps far more ops than the queue depth in one Run.
func TestManyOps(t *testing.T) {
	dir := testDir(t)
	skipIfNoDirect(t, dir)
	const n, bs = 5000, 4096
	path := patternFile(t, dir, n*bs)
	forEachRunner(t, func(t *testing.T, r runner) {
		fd := openFd(t, path, unix.O_RDONLY|unix.O_DIRECT)
		mem := mmapAnon(t, n*bs)
		fill(mem, sentinel)
		ops := make([]Op, n)
		want := make([]int64, n)
		for i, k := range rand.New(rand.NewPCG(7, 8)).Perm(n) {
			ops[i] = Op{Fd: fd, Addr: addr(mem) + uintptr(k*bs), Len: bs, Off: int64(k * bs)}
			want[i] = bs
		}
		r.runChecked(t, ops, want, mem, true)
		checkPattern(t, "whole file", mem, 0)
	})
}

// Test100kOps runs 100,000 small ops in one Run; each lands at its own
// file offset, so the whole mapping ends up equal to the file.
func Test100kOps(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping 100k ops")
	}
	dir := testDir(t)
	const n, bs, size = 100000, 512, 1 << 20
	path := patternFile(t, dir, size)
	forEachRunner(t, func(t *testing.T, r runner) {
		fd := openFd(t, path, unix.O_RDONLY)
		mem := mmapAnon(t, size)
		ops := make([]Op, n)
		for i := range ops {
			off := int64(i*7919%(size/bs)) * bs
			ops[i] = Op{Fd: fd, Addr: addr(mem) + uintptr(off), Len: bs, Off: off}
		}
		if err := r.run(ops); err != nil {
			t.Fatal(err)
		}
		for i, op := range ops {
			if op.Result != bs {
				t.Fatalf("op %d: Result %d, want %d", i, op.Result, bs)
			}
		}
		checkPattern(t, "mapping", mem, 0)
	})
}

// TestShortTransfers lowers the per-call cap so every op is moved in
// several kernel calls, checking that each continues where the last
// stopped, for reads and writes.
func TestShortTransfers(t *testing.T) {
	old := chunkSize
	chunkSize = 4096
	t.Cleanup(func() { chunkSize = old })
	dir := testDir(t)
	const size = 1<<20 + 333
	path := patternFile(t, dir, size)
	forEachRunner(t, func(t *testing.T, r runner) {
		fd := openFd(t, path, unix.O_RDONLY)
		const n, ln = 40, 30000
		mem := mmapAnon(t, n*(ln+8))
		fill(mem, sentinel)
		ops := make([]Op, n)
		want := make([]int64, n)
		for i := range ops {
			off := int64(i) * (size / n)
			if i == n-1 {
				off = size - 12345 // short at EOF after several chunks
			}
			ops[i] = Op{Fd: fd, Addr: addr(mem) + uintptr(i*(ln+8)+i%5), Len: ln, Off: off}
			want[i] = min(ln, size-off)
		}
		r.runChecked(t, ops, want, mem, false)

		// Write the bytes just read to a new file, one op per chunk of them.
		f, err := os.CreateTemp(dir, "short-")
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		wfd := openFd(t, f.Name(), unix.O_WRONLY)
		w := make([]Op, n)
		for i, op := range ops {
			w[i] = Op{Fd: wfd, Write: true, Addr: op.Addr, Len: op.Result, Off: op.Off}
		}
		if err := r.run(w); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		for i, op := range w {
			if op.Result != op.Len {
				t.Fatalf("write %d: Result %d, want %d", i, op.Result, op.Len)
			}
			checkPattern(t, "written", got[op.Off:op.Off+op.Len], op.Off)
		}
	})
}

func TestKind(t *testing.T) {
	t.Setenv(EnvEngine, "")
	if k := KindFromEnv(); k != KindAuto {
		t.Errorf("KindFromEnv() with PHX_ENGINE empty = %q, want auto", k)
	}
	t.Setenv(EnvEngine, " Sync ")
	if k := KindFromEnv(); k != KindSync {
		t.Errorf("KindFromEnv() = %q, want sync", k)
	}
	e, err := New(KindFromEnv(), 0)
	if err != nil || e.Name() != KindSync {
		t.Fatalf("New(sync) = %v, %v", e, err)
	}
	e.Close()

	t.Setenv(EnvEngine, "spdk")
	if k := KindFromEnv(); k != "spdk" {
		t.Errorf("KindFromEnv() = %q, want the value as given", k)
	}
	if _, err := New(KindFromEnv(), 0); !isErrno(err, unix.EINVAL) {
		t.Errorf("New(spdk) error = %v, want EINVAL", err)
	}
	if _, err := NewPool(PoolConfig{Kind: KindFromEnv()}); !isErrno(err, unix.EINVAL) {
		t.Errorf("NewPool(spdk) error = %v, want EINVAL", err)
	}
	if err := CheckKind("io-uring"); !isErrno(err, unix.EINVAL) {
		t.Errorf("CheckKind(io-uring) = %v, want EINVAL", err)
	}
	if _, err := New(KindSync, MaxQueueDepth+1); !isErrno(err, unix.EINVAL) {
		t.Errorf("New with queue depth %d: %v, want EINVAL", MaxQueueDepth+1, err)
	}

	requireUring(t)
	for _, k := range []string{KindAuto, KindIOUring} {
		e, err := New(k, 0)
		if err != nil {
			t.Fatalf("New(%s): %v", k, err)
		}
		if e.Name() != KindIOUring {
			t.Errorf("New(%s).Name() = %q, want io_uring", k, e.Name())
		}
		if u := e.(*uringEngine); u.qd != DefaultQueueDepth {
			t.Errorf("default queue depth %d, want %d", u.qd, DefaultQueueDepth)
		}
		e.Close()
	}
}

// TestUringNoAlloc: the submit/reap loop allocates nothing per op.
func TestUringNoAlloc(t *testing.T) {
	requireUring(t)
	dir := testDir(t)
	path := patternFile(t, dir, 1<<20)
	fd := openFd(t, path, unix.O_RDONLY)
	e, err := New(KindIOUring, 32)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	mem := mmapAnon(t, 1<<20)
	ops := make([]Op, 256)
	for i := range ops {
		ops[i] = Op{Fd: fd, Addr: addr(mem) + uintptr(i*4096), Len: 4096, Off: int64(i * 4096)}
	}
	allocs := testing.AllocsPerRun(20, func() {
		if err := e.Run(ops); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Run of %d ops made %v allocations, want 0", len(ops), allocs)
	}
	checkPattern(t, "mapping", mem, 0)
}

func TestUringClosed(t *testing.T) {
	requireUring(t)
	e, err := New(KindIOUring, 8)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	mem := mmapAnon(t, 4096)
	if err := e.Run([]Op{{Fd: 0, Addr: addr(mem), Len: 1}}); !isErrno(err, unix.EBADF) {
		t.Errorf("Run after Close: %v, want EBADF", err)
	}
}

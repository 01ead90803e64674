package phxfs

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// kvWrites makes n requests that write shuffled slots of bs bytes of a
// buffer to n distinct random blocks of a file of fileBlocks blocks: a
// KV-cache offload.
func kvWrites(rng *rand.Rand, n, fileBlocks int, bs int64) []Request {
	slots := rng.Perm(n)
	dst := rng.Perm(fileBlocks)[:n]
	reqs := make([]Request, n)
	for i := range reqs {
		reqs[i] = Request{Device: 0, BufOffset: int64(slots[i]) * bs, Len: bs, FileOffset: int64(dst[i]) * bs}
	}
	return reqs
}

// benchFile makes a file of size bytes in dir ("" for the tests' disk).
func benchFile(b *testing.B, dir string, size int64) string {
	if dir == "" {
		return patternFile(b, size)
	}
	d, err := os.MkdirTemp(dir, "phxfs-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(d) })
	name := filepath.Join(d, "kv")
	if err := os.WriteFile(name, make([]byte, size), 0o644); err != nil {
		b.Fatal(err)
	}
	return name
}

// BenchmarkKVWrite writes one KV-cache batch (409 blocks, a BATCH_WRITE's
// worth) from shuffled slots of an emulated staged device to distinct
// random blocks of a cached file: the daemon's per-batch cost of an
// offload, gathers and writes included. Four workers, as a daemon on a
// small machine. "disk" writes to the tests' file system, "shm" to tmpfs,
// whose writes cost the least: what is left there is the daemon's.
func BenchmarkKVWrite(b *testing.B) { benchKVSizes(b, true) }

// BenchmarkKVRead is BenchmarkKVWrite's restore: the same 409 blocks, hot
// in the page cache, read back into the shuffled slots (gathers from the
// page cache, then one device copy per bounce buffer).
func BenchmarkKVRead(b *testing.B) { benchKVSizes(b, false) }

func benchKVSizes(b *testing.B, write bool) {
	const n = 409
	for _, bs := range []int64{16 << 10, 64 << 10, 256 << 10, 1 << 20} {
		for _, where := range []struct{ name, dir string }{{"disk", ""}, {"shm", "/dev/shm"}} {
			b.Run(fmt.Sprintf("%dKiB/%s", bs>>10, where.name), func(b *testing.B) {
				benchKV(b, write, n, bs, where.dir)
			})
		}
	}
}

func benchKV(b *testing.B, write bool, n int, bs int64, dir string) {
	c := emuStaged(b, 1)
	l := newLibOn(b, c, setup{"io_uring", Staged}, 1, func(cfg *Config) {
		cfg.Workers, cfg.BounceSize = 4, 4<<20
	})
	name := benchFile(b, dir, 2*int64(n)*bs)
	fd := openFile(b, name, unix.O_RDWR)
	m := alloc(b, c, 0, alignUp(int64(n)*bs, 64<<10))
	r := register(b, l, m)
	reqs := kvWrites(rand.New(rand.NewPCG(1, 2)), n, 2*n, bs)
	for i := range reqs {
		reqs[i].Fd, reqs[i].DevAddr = fd, r.Addr()
	}
	run := l.ReadBatch
	if write {
		run = l.WriteBatch
	}
	if _, err := run(append([]Request(nil), reqs...)); err != nil { // reads start hot
		b.Fatal(err)
	}
	b.SetBytes(int64(n) * bs)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		batch := append([]Request(nil), reqs...)
		if failed, err := run(batch); failed != 0 || err != nil {
			b.Fatalf("%d failed (%s), %v", failed, describe(batch), err)
		}
	}
}

package ioengine

import (
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkRandomRead4K reads 4 KiB O_DIRECT blocks at random offsets of a
// 64 MiB file, 1024 per Run, and reports IOPS. Compare the sub-benchmarks
// of one run with each other; absolute numbers on shared machines are noise.
func BenchmarkRandomRead4K(b *testing.B) {
	const size, bs, batch = 64 << 20, 4096, 1024
	dir := testDir(b)
	skipIfNoDirect(b, dir)
	path := patternFile(b, dir, size)
	fd := openFd(b, path, unix.O_RDONLY|unix.O_DIRECT)
	mem := mmapAnon(b, batch*bs)
	rng := rand.New(rand.NewPCG(9, 10))
	ops := make([]Op, batch)

	bench := func(b *testing.B, run func([]Op) error) {
		for b.Loop() {
			for i := range ops {
				ops[i] = Op{Fd: fd, Addr: addr(mem) + uintptr(i*bs), Len: bs, Off: bs * rng.Int64N(size/bs)}
			}
			if err := run(ops); err != nil {
				b.Fatal(err)
			}
			for i := range ops {
				if ops[i].Result != bs {
					b.Fatalf("op %d: Result %d", i, ops[i].Result)
				}
			}
		}
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "IOPS")
		b.SetBytes(batch * bs)
	}
	for _, kind := range []string{KindIOUring, KindSync} {
		b.Run(kind, func(b *testing.B) {
			e, err := New(kind, 64)
			if err != nil {
				b.Skipf("cannot create %s: %v", kind, err)
			}
			defer e.Close()
			bench(b, e.Run)
		})
		b.Run("pool-"+kind, func(b *testing.B) {
			p, err := NewPool(PoolConfig{Kind: kind, Workers: 2, QueueDepth: 32})
			if err != nil {
				b.Skipf("cannot create a %s pool: %v", kind, err)
			}
			defer p.Close()
			bench(b, p.Run)
		})
	}
}

package phxfs

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// stagedBlocks is a batch of n staged blocks of size bytes.
func stagedBlocks(n int, size int64) []xfer {
	xs := make([]xfer, n)
	for i := range xs {
		xs[i] = xfer{len: size, staged: true}
	}
	return xs
}

// TestKVSharesByLoad: how a batch of small blocks is split among the
// workers, by how many staged plans of its device run beside it. Split by
// load (StagedByLoad), alone it spreads (StagedShare bytes or
// minStagedOps pieces a worker); beside others it takes its fair part of
// the pool but never less than a slot's worth a worker, so each share is
// one slot, one scatter, one fence. A large load spreads over every
// worker whatever runs beside it. By default a batch spreads as if alone.
func TestKVSharesByLoad(t *testing.T) {
	l, _ := newLib(t, setup{"sync", Staged}, 1, func(c *Config) {
		c.Workers, c.BounceSize, c.StagedShare, c.StagedByLoad = 16, 4*mib, 1*mib, true
	})
	for _, c := range []struct {
		what  string
		xs    []xfer
		plans int
		want  int
	}{
		{"409 x 16 KiB alone", stagedBlocks(409, 16<<10), 1, 7},
		{"409 x 16 KiB, 4 plans", stagedBlocks(409, 16<<10), 4, 4},
		{"409 x 16 KiB, 16 plans", stagedBlocks(409, 16<<10), 16, 2},
		{"409 x 16 KiB, 64 plans", stagedBlocks(409, 16<<10), 64, 2},
		{"409 x 64 KiB alone", stagedBlocks(409, 64<<10), 1, 16},
		{"409 x 64 KiB, 4 plans", stagedBlocks(409, 64<<10), 4, 7},
		{"409 x 64 KiB, 16 plans", stagedBlocks(409, 64<<10), 16, 7},
		{"64 x 128 MiB alone", stagedBlocks(64, 128*mib), 1, 16},
		{"64 x 128 MiB, 2 plans", stagedBlocks(64, 128*mib), 2, 16},
		{"3 x 16 KiB, 16 plans", stagedBlocks(3, 16<<10), 16, 1},
		{"0 plans counts as 1", stagedBlocks(409, 16<<10), 0, 7},
	} {
		if got := l.stagedWorkers(c.xs, c.plans); got != c.want {
			t.Errorf("%s: %d workers, want %d", c.what, got, c.want)
		}
	}
	// Spread: as if alone, whatever runs beside.
	if !l.SetStagedByLoad(false) {
		t.Fatal("Config.StagedByLoad did not take")
	}
	if got := l.stagedWorkers(stagedBlocks(409, 16<<10), 16); got != 7 {
		t.Errorf("spread: 409 x 16 KiB beside 15 others get %d workers, want 7", got)
	}
	// A slot-sized share counts pieces in proportion: 256 a worker, so a
	// 16 KiB batch takes 2 workers by bytes and by pieces alike.
	slot, _ := newLib(t, setup{"sync", Staged}, 1, func(c *Config) {
		c.Workers, c.BounceSize, c.StagedShare = 16, 4*mib, 4*mib
	})
	for _, c := range []struct {
		what string
		xs   []xfer
		want int
	}{
		{"409 x 16 KiB, 4 MiB shares", stagedBlocks(409, 16<<10), 2},
		{"409 x 64 KiB, 4 MiB shares", stagedBlocks(409, 64<<10), 7},
		{"4,096 x 64 B, 4 MiB shares", stagedBlocks(4096, 64), 16},
	} {
		if got := slot.stagedWorkers(c.xs, 1); got != c.want {
			t.Errorf("%s: %d workers, want %d", c.what, got, c.want)
		}
	}
}

// TestBlockShare: by default (PHX_STAGED_SHARE auto, no StagedShare
// given) a batch of KV-sized blocks, 64 KiB to 1 MiB, gives each worker a
// bounce buffer's worth, and smaller blocks and tensors keep the 1 MiB
// share (run 55); spread keeps 1 MiB for all.
func TestBlockShare(t *testing.T) {
	for _, rule := range []string{"", "spread"} {
		t.Setenv(EnvStagedShare, rule)
		l, _ := newLib(t, setup{"sync", Staged}, 1, func(c *Config) { c.Workers, c.BounceSize = 16, 4*mib })
		for _, c := range []struct {
			what         string
			xs           []xfer
			auto, spread int
		}{
			{"409 x 16 KiB", stagedBlocks(409, 16<<10), 7, 7},
			{"409 x 64 KiB", stagedBlocks(409, 64<<10), 7, 16},
			{"409 x 256 KiB", stagedBlocks(409, 256<<10), 16, 16},
			{"64 x 512 KiB", stagedBlocks(64, 512<<10), 8, 16},
			{"8 x 2 MiB", stagedBlocks(8, 2*mib), 8, 8},
			{"4 x 128 MiB", stagedBlocks(4, 128*mib), 4, 4},
		} {
			want := map[string]int{"": c.auto, "spread": c.spread}[rule]
			if got := l.stagedWorkers(c.xs, 1); got != want {
				t.Errorf("PHX_STAGED_SHARE=%q, %s: %d workers, want %d", rule, c.what, got, want)
			}
		}
	}
}

// TestStagedShareEnv: PHX_STAGED_SHARE=load sets Config.StagedByLoad,
// slot makes a worker's least share a bounce buffer (where the config
// sets none); spread, auto and unset leave both; a bad value fails New and
// CheckEnv.
func TestStagedShareEnv(t *testing.T) {
	for _, c := range []struct {
		v      string
		share  int64 // Config.StagedShare given
		byLoad bool
		want   int64 // the share New keeps
		bad    bool
	}{
		{"", 0, false, 1 * mib, false}, {"auto", 0, false, 1 * mib, false}, {"spread", 0, false, 1 * mib, false},
		{"load", 0, true, 1 * mib, false}, {"slot", 0, false, 2 * mib, false}, {"slot", 64 << 10, false, 64 << 10, false},
		{"fair", 0, false, 0, true},
	} {
		t.Setenv(EnvStagedShare, c.v)
		if err := CheckEnv(); (err != nil) != c.bad {
			t.Errorf("%s=%q: CheckEnv %v", EnvStagedShare, c.v, err)
		}
		l, err := New(Config{Connector: emuStaged(t, 1), Engine: "sync", Workers: 2, BounceSize: 2 * mib, StagedShare: c.share})
		if c.bad {
			if err == nil {
				l.Close()
				t.Errorf("%s=%q: New did not fail", EnvStagedShare, c.v)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if l.StagedByLoad() != c.byLoad {
			t.Errorf("%s=%q: by load %v, want %v", EnvStagedShare, c.v, l.StagedByLoad(), c.byLoad)
		}
		if l.cfg.StagedShare != c.want {
			t.Errorf("%s=%q, Config.StagedShare %d: share %d, want %d", EnvStagedShare, c.v, c.share, l.cfg.StagedShare, c.want)
		}
		l.Close()
	}
}

// TestKVBatchBesideOthers reads one 409-block batch of 16 KiB blocks
// (kv_blocks.cu's batch), split by load, alone, then while fifteen other
// plans of the device count as running: alone it goes to 7 workers, 7
// scatters and fences; beside them to 2 workers, each share one slot of
// 205 or 204 blocks, 2 scatters and 2 fences. Every block lands, both
// times, on both engines; and a batch allocates a bounded number of
// objects, not one a block.
func TestKVBatchBesideOthers(t *testing.T) {
	const fileSize, bs, n = 64 * mib, 16 << 10, 409
	name := patternFile(t, fileSize)
	for _, engine := range []string{"io_uring", "sync"} {
		t.Run(engine, func(t *testing.T) {
			cc := &countingConn{Connector: emuStaged(t, 1)}
			l := newLibOn(t, cc, setup{engine, Staged}, 1, func(c *Config) {
				c.Workers, c.BounceSize, c.StagedShare, c.SplitSize, c.StagedByLoad = 16, 4*mib, 1*mib, 0, true
			})
			m := alloc(t, cc, 0, 416*bs)
			register(t, l, m)
			fd := openFile(t, name, unix.O_RDONLY)
			for _, others := range []int{0, 15} {
				t.Run(fmt.Sprintf("%d-others", others), func(t *testing.T) {
					for range others {
						l.loading.enter(0)
					}
					defer func() {
						for range others {
							l.loading.leave(0)
						}
					}()
					rng := rand.New(rand.NewPCG(uint64(others), 7))
					slots := rng.Perm(n)
					reqs := make([]Request, n)
					for i := range reqs {
						reqs[i] = Request{Fd: fd, Device: 0, DevAddr: m.Addr(), BufOffset: int64(slots[i]) * bs, Len: bs,
							FileOffset: rng.Int64N(fileSize/bs) * bs}
					}
					fillDevice(t, cc, m, 0, make([]byte, m.Size()))
					cc.calls.Store(0)
					cc.pieces.Store(0)
					cc.fences.Store(0)
					if failed, err := l.ReadBatch(reqs); failed != 0 || err != nil {
						t.Fatalf("%d failed, %v: %s", failed, err, describe(reqs))
					}
					want := map[int]int64{0: 7, 15: 2}[others]
					if got := cc.calls.Load(); got != want {
						t.Errorf("%d scatters, want %d (one a worker's share)", got, want)
					}
					if got := cc.fences.Load(); got != want {
						t.Errorf("%d fences, want %d", got, want)
					}
					// Pieces that follow on in the file and the buffer join.
					if got := cc.pieces.Load(); got > n || got < n-10 {
						t.Errorf("%d pieces scattered, want about %d", got, n)
					}
					dev := deviceBytes(t, cc, m, 0, m.Size())
					for _, rq := range reqs {
						if rq.Result != bs {
							t.Fatalf("block at %d: result %d", rq.FileOffset, rq.Result)
						}
						checkPattern(t, dev[rq.BufOffset:rq.BufOffset+bs], rq.FileOffset)
					}
					// Allocations: the plan's few arrays and a job a worker;
					// the emulated device adds a few a scatter (the GPU's
					// connector one a fence). 409 blocks must not show.
					allocs := allocsPerBatch(l, reqs, 50)
					if limit := 20 + 4*float64(want); allocs > limit {
						t.Errorf("%.0f allocations a batch, want at most %.0f", allocs, limit)
					}
					t.Logf("%d others: %d scatters, %.0f allocations a batch", others, want, allocs)
				})
			}
		})
	}
}

// allocsPerBatch is the heap objects allocated per ReadBatch of reqs, on
// average over runs, the process's other goroutines included.
func allocsPerBatch(l *Lib, reqs []Request, runs int) float64 {
	for range runs { // every worker's scratch grown: plans rotate over the pool
		l.ReadBatch(reqs)
	}
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	for range runs {
		l.ReadBatch(reqs)
	}
	runtime.ReadMemStats(&b)
	return float64(b.Mallocs-a.Mallocs) / float64(runs)
}

package phxfs

import (
	"cmp"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
)

// kvBatch is a KV-cache batch on l: 409 blocks of 16 KiB from random
// places of an 8 MiB pattern file into shuffled slots of a registered
// buffer of 416 (kvBlocks, seeded).
func kvBatch(t testing.TB, l *Lib, c connector.Connector, seed uint64) (connector.Memory, []Request) {
	m := alloc(t, c, 0, 416*16384)
	r := register(t, l, m)
	fd := openFile(t, patternFile(t, 8*mib), unix.O_RDONLY)
	reqs := kvBlocks(rand.New(rand.NewPCG(seed, seed+1)), 409, 8*mib, 16384)
	for i := range reqs {
		reqs[i].Fd, reqs[i].DevAddr, reqs[i].Len = fd, r.Addr(), 16384
	}
	return m, reqs
}

// BenchmarkPrepare409 times planning one KV-cache batch: 409 scattered
// 16 KiB blocks (prepare and the holds' release).
func BenchmarkPrepare409(b *testing.B) {
	l, c := newLib(b, setup{"sync", Staged}, 1)
	_, reqs := kvBatch(b, l, c, 1)
	b.ResetTimer()
	for range b.N {
		p, err := l.prepare(false, reqs)
		if err != nil {
			b.Fatal(err)
		}
		l.mu.Lock()
		for _, h := range p.held {
			l.release(h)
		}
		l.mu.Unlock()
		p.recycle() // as ReadBatch does when its batch is done
	}
}

// TestOrderIsByFileOffsetAndRequest: planning's order (by descriptor,
// then file offset, requests at the same place in their own order) for
// batches of random targets, against a plain sort of the targets
// themselves; an already sorted batch stays as it is.
func TestOrderIsByFileOffsetAndRequest(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	m := new(planMemory)
	for round := range 200 {
		n := 1 + rng.IntN(500)
		reqs := make([]Request, n)
		targets := make([]target, n)
		for i := range reqs {
			reqs[i] = Request{Fd: 3 + rng.IntN(3), FileOffset: int64(rng.IntN(64)) * 4096}
			targets[i] = target{i: i, devAddr: uint64(i)}
		}
		if round%10 == 0 { // sorted already
			slices.SortStableFunc(reqs, func(a, b Request) int {
				return cmp.Or(cmp.Compare(a.Fd, b.Fd), cmp.Compare(a.FileOffset, b.FileOffset))
			})
		}
		want := slices.Clone(targets)
		slices.SortStableFunc(want, func(a, b target) int {
			ra, rb := reqs[a.i], reqs[b.i]
			return cmp.Or(cmp.Compare(ra.Fd, rb.Fd), cmp.Compare(ra.FileOffset, rb.FileOffset))
		})
		order(reqs, targets, m) // one memory for every round, as a pooled plan's
		for k := range want {
			if targets[k].i != want[k].i || targets[k].devAddr != want[k].devAddr ||
				reqs[targets[k].i].FileOffset != reqs[want[k].i].FileOffset {
				t.Fatalf("round %d: place %d holds request %d, want %d", round, k, targets[k].i, want[k].i)
			}
		}
	}
}

// TestPlanArraysAreKeptBetweenBatches: a batch that is done gives its
// plan's arrays to the next (planmem.go). ReadBatch of a 409-block KV
// batch allocated 135 KB a batch here, its plan's arrays most of it;
// kept, a small part of that, and the blocks still land right.
func TestPlanArraysAreKeptBetweenBatches(t *testing.T) {
	l, c := newLib(t, setup{"sync", Staged}, 1)
	m, reqs := kvBatch(t, l, c, 1)
	read := func() {
		if n, err := l.ReadBatch(reqs); err != nil || n != 0 {
			t.Fatalf("ReadBatch: %d failed, %v", n, err)
		}
	}
	read()
	const rounds = 50
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range rounds {
		read()
	}
	runtime.ReadMemStats(&after)
	per := (after.TotalAlloc - before.TotalAlloc) / rounds // 15 KB here
	switch {
	case raceDetector:
		t.Logf("a batch allocated %d bytes; not bounded under the race detector (its sync.Pool drops kept arrays on purpose)", per)
	case per > 64<<10:
		t.Errorf("a kept batch allocated %d bytes, want under 64 KiB (its plan's arrays are kept)", per)
	}
	dev := deviceBytes(t, c, m, 0, 416*16384)
	for _, rq := range reqs {
		checkPattern(t, dev[rq.BufOffset:rq.BufOffset+rq.Len], rq.FileOffset)
	}
}

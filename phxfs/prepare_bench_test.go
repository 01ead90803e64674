package phxfs

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkPrepare409 times planning one KV-cache batch: 409 scattered
// 16 KiB blocks (prepare and the holds' release).
func BenchmarkPrepare409(b *testing.B) {
	l, c := newLib(b, setup{"sync", Staged}, 1)
	m := alloc(b, c, 0, 416*16384)
	r := register(b, l, m)
	name := patternFile(b, 8*mib)
	fd := openFile(b, name, unix.O_RDONLY)
	reqs := kvBlocks(rand.New(rand.NewPCG(1, 2)), 409, 8*mib, 16384)
	for i := range reqs {
		reqs[i].Fd, reqs[i].DevAddr, reqs[i].Len = fd, r.Addr(), 16384
	}
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
	}
}

// TestOrderIsByFileOffsetAndRequest: planning's order (by descriptor,
// then file offset, requests at the same place in their own order) for
// batches of random targets, against a plain sort of the targets
// themselves; an already sorted batch stays as it is.
func TestOrderIsByFileOffsetAndRequest(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
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
		order(reqs, targets)
		for k := range want {
			if targets[k].i != want[k].i || targets[k].devAddr != want[k].devAddr ||
				reqs[targets[k].i].FileOffset != reqs[want[k].i].FileOffset {
				t.Fatalf("round %d: place %d holds request %d, want %d", round, k, targets[k].i, want[k].i)
			}
		}
	}
}

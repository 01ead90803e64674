package phxfs

import (
	"math/rand/v2"
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

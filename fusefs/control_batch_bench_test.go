package fusefs

import (
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
)

// BenchmarkControlBatch409 times one BATCH ioctl of 409 random 16 KiB
// blocks of a hot file into shuffled slots of an emulated registration,
// through the control (decode, checks, holds, the library, the reply),
// with no FUSE round trip: a KV client's restore, as the daemon serves
// it. Run 69 (docs/gpu-notes.md) traced 85 us of such an ioctl outside
// the library's plan and execute on the H100.
//
//	go test ./fusefs -run '^$' -bench ControlBatch409 -benchtime 2000x
func BenchmarkControlBatch409(b *testing.B) {
	e := newCtlEnv(b, true, false)
	const bs, n = 16 << 10, 409
	f, _ := patternFile(b, 64<<20, unix.O_RDONLY)
	m := e.alloc(b, 7<<20)
	r := e.registered(b, f, m)
	rng := rand.New(rand.NewPCG(1, 2))
	slots := rng.Perm(n)
	reqs := make([]client.IOReq, n)
	for i := range reqs {
		reqs[i] = client.IOReq{ID: r.ID, BufOffset: uint64(slots[i] * bs), Length: bs, FileOffset: uint64(rng.IntN(64<<20/bs) * bs)}
	}
	in, _ := client.EncodeBatch(n, reqs)
	cmd := client.CmdBatch(false, n)
	b.SetBytes(n * bs)
	b.ResetTimer()
	for range b.N {
		if _, errno := e.ioctl(e.me, f, cmd, in); errno != 0 {
			b.Fatal(errno)
		}
	}
}

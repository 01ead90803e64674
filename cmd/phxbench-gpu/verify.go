package main

import (
	"fmt"
	"math/rand/v2"
	"os"

	"github.com/phxmount/phxmount/connector"
)

// verify copies back sampled ranges and every tensor's first and last 4 KiB
// and compares them with the file.
func verify(conn connector.Connector, mem connector.Memory, file string, start int64, ts []tensor) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	dataLen := ts[len(ts)-1].End
	type rng struct{ off, n int64 }
	var rs []rng
	for _, t := range ts {
		if t.End == t.Begin {
			continue
		}
		rs = append(rs, rng{t.Begin, min(4096, t.End-t.Begin)}, rng{max(t.Begin, t.End-4096), min(4096, t.End-t.Begin)})
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 64 {
		n := int64(mib)
		rs = append(rs, rng{r.Int64N(max(dataLen-n, 1)), min(n, dataLen)})
	}
	h, s, done, err := hostAndStream(conn, mib)
	if err != nil {
		return err
	}
	defer done()
	for _, x := range rs {
		got := h.Bytes()[:x.n]
		if err := s.CopyFromDevice(got, mem.Addr()+uint64(x.off)); err != nil {
			return err
		}
		if err := s.Synchronize(); err != nil {
			return err
		}
		want := make([]byte, x.n)
		if _, err := f.ReadAt(want, start+x.off); err != nil {
			return err
		}
		for i := range got {
			if got[i] != want[i] {
				return fmt.Errorf("data byte %d: GPU %#x, file %#x", x.off+int64(i), got[i], want[i])
			}
		}
	}
	return nil
}

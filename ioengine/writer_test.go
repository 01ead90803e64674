package ioengine

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/fscred"
)

// TestPoolWriterWrites: a pool whose writes run as fscred.Writer
// (PoolConfig.Writer) writes every byte where it should, with either
// engine; as root its workers hold the identity (an io_uring personality,
// the sync engine's credentials), and each worker's thread is root again
// between writes, for its reads. That the identity keeps a write out of
// root's reserved blocks is integration's TestReservedBlocksApplyThroughTheMount.
func TestPoolWriterWrites(t *testing.T) {
	dir := testDir(t)
	base, e := fscred.Current()
	if e != 0 {
		t.Fatal(e)
	}
	for _, kind := range []string{KindSync, KindIOUring} {
		t.Run(kind, func(t *testing.T) {
			p, err := NewPool(PoolConfig{Kind: kind, Workers: 2, Writer: true})
			if err != nil {
				t.Skipf("skipped: no %s pool here: %v", kind, err)
			}
			defer p.Close()
			const n = 1 << 20
			path := filepath.Join(dir, kind)
			fd := openFd(t, path, unix.O_RDWR|unix.O_CREAT)
			src := mmapAnon(t, 4*n)
			fillPattern(src, 0)
			ops := make([]Op, 4)
			for i := range ops {
				ops[i] = Op{Fd: fd, Write: true, Addr: addr(src[i*n:]), Len: n, Off: int64(i * n)}
			}
			if err := p.Run(ops); err != nil {
				t.Fatal(err)
			}
			for i, op := range ops {
				if op.Result != n {
					t.Fatalf("write %d: %d", i, op.Result)
				}
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 4*n || !checkPattern(t, "written", got, 0) {
				t.Fatalf("file of %d bytes", len(got))
			}
			if base.FSUID != 0 {
				return
			}
			for _, w := range p.workers {
				switch e := w.eng.(type) {
				case *uringEngine:
					if e.personality == 0 {
						t.Errorf("worker %d: no writer personality on its ring", w.id)
					}
				case *syncEngine:
					if e.writer == nil || e.writer.ids.FSUID == 0 {
						t.Errorf("worker %d: the sync engine writes as root", w.id)
					}
				}
			}
			done := make(chan int, len(p.workers))
			if err := p.Each(func(_ int, _ Engine) {
				s, _ := fscred.Current()
				done <- s.FSUID
			}); err != nil {
				t.Fatal(err)
			}
			for range p.workers {
				if u := <-done; u != 0 {
					t.Errorf("a worker's thread has fsuid %d between writes, want 0", u)
				}
			}
		})
	}
}

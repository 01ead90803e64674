package phxfs

import (
	"encoding/binary"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector/emu"
)

// TestShrunkImportFailsWithEFAULT: a client registers its emu buffer and
// then shrinks the memfd (ftruncate). Extents on the pages that are gone
// fail with -EFAULT, those on the rest still move, and the daemon (this
// process: it imported the buffer) lives on, in both the host and the
// staged transport.
func TestShrunkImportFailsWithEFAULT(t *testing.T) {
	if os.Getenv("PHX_TEST_CONNECTOR") != "" {
		t.Skip("needs the emu connector")
	}
	const size = 4 * emu.PageSize
	name := patternFile(t, 4*emu.PageSize)
	fd := openFile(t, name, unix.O_RDWR)
	forEach(t, func(t *testing.T, s setup) {
		client, err := emu.New(emu.Config{Staged: s.transport == Staged})
		if err != nil {
			t.Fatal(err)
		}
		m := alloc(t, client, 0, size)
		h, err := m.Export()
		if err != nil {
			t.Fatal(err)
		}
		l, c := newLib(t, s, 1)
		im, err := c.Import(0, h, size, os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		defer im.Close()
		r := register(t, l, im)
		defer l.DeregMem(0, r.Addr(), r.Size())
		if r.Transport() != s.transport {
			t.Fatalf("transport %s, want %s", r.Transport(), s.transport)
		}
		memfd := int(binary.LittleEndian.Uint32(h[12:])) // docs/abi.md, the emu handle
		if err := unix.Ftruncate(memfd, size/2); err != nil {
			t.Fatal(err)
		}
		for _, write := range []bool{false, true} {
			reqs := []Request{
				{Fd: fd, Device: 0, DevAddr: r.Addr(), Len: emu.PageSize},
				{Fd: fd, Device: 0, DevAddr: r.Addr(), BufOffset: 3 * emu.PageSize, Len: emu.PageSize, FileOffset: 2 * emu.PageSize},
			}
			batch := l.ReadBatch
			if write {
				batch = l.WriteBatch
			}
			failed, err := batch(reqs)
			if err != nil {
				t.Fatal(err)
			}
			if failed != 1 || reqs[0].Result != emu.PageSize || reqs[1].Result != -int64(unix.EFAULT) {
				t.Fatalf("write %v: %d failed, results %d %d; want 1, %d, -EFAULT", write, failed, reqs[0].Result, reqs[1].Result, emu.PageSize)
			}
		}
		checkPattern(t, deviceBytes(t, c, im, 0, emu.PageSize), 0)
	})
}

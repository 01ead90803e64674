package phxfs

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzRequestValidation throws arbitrary requests at a batch next to one
// registration and checks the rules: nothing outside the registration (or
// malformed) reaches the engine, and every accepted request reads exactly
// the file's bytes into the buffer.
func FuzzRequestValidation(f *testing.F) {
	f.Add(int64(0), int64(0), int64(4096), int64(0), int8(0))
	f.Add(int64(64<<10), int64(4096), int64(1<<20), int64(4096), int8(0))
	f.Add(int64(-1), int64(0), int64(4096), int64(0), int8(1))
	f.Add(int64(0), int64(-8), int64(4096), int64(0), int8(0))
	f.Add(int64(256<<10-8), int64(0), int64(16), int64(0), int8(0))
	f.Add(int64(0), int64(0), int64(-1), int64(1<<62), int8(-1))
	f.Add(int64(1<<62), int64(1<<62), int64(1<<62), int64(0), int8(0))
	s := setup{"sync", Host}
	l, c := newLib(f, s, 1)
	const size = 256 << 10
	const fsize = 192 << 10
	fd := openFile(f, patternFile(f, fsize), unix.O_RDONLY)
	m := alloc(f, c, 0, size)
	register(f, l, m)
	f.Fuzz(func(t *testing.T, bufDelta, bufOff, n, fileOff int64, dev int8) {
		n = n % (4 << 20) // keep the transfer small; the sign survives
		buf := m.Addr() + uint64(bufDelta)
		device := int(dev) % 2
		fillDevice(t, c, m, 0, make([]byte, size))
		// A negative device means host memory at HostAddr, left 0: never
		// let the fuzzer name a host address.
		reqs := []Request{{Fd: fd, Device: device, DevAddr: buf, BufOffset: bufOff, Len: n, FileOffset: fileOff}}
		before := l.Stats().Requests
		if _, err := l.ReadBatch(reqs); err != nil {
			t.Fatal(err)
		}
		r := reqs[0].Result
		start := int64(bufDelta) + bufOff
		inside := device == 0 && bufOff >= 0 && n >= 0 && bufDelta >= 0 && bufDelta < size &&
			start >= 0 && start <= size && n <= size-start && fileOff >= 0
		reached := l.Stats().Requests - before
		switch {
		case !inside && n != 0 && (n > 0 && bufOff >= 0 && fileOff >= 0):
			if r >= 0 || reached != 0 {
				t.Fatalf("request outside the registration: result %d, reached engine %d", r, reached)
			}
		case inside && n > 0 && fileOff < fsize:
			want := min(n, max(fsize-fileOff, 0))
			if r != want {
				t.Fatalf("result %d, want %d", r, want)
			}
			got := deviceBytes(t, c, m, start, r)
			for i := int64(0); i+8 <= r && (fileOff+i)%8 == 0; i += 8 {
				if v := binary.LittleEndian.Uint64(got[i:]); v != uint64(fileOff+i) {
					t.Fatalf("word at file offset %d reads %d", fileOff+i, v)
				}
			}
		case r > 0:
			t.Fatalf("malformed request moved %d bytes", r)
		}
	})
}

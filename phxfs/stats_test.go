package phxfs

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestTransportStats: the bytes a batch moves are counted under the
// registration's transport and direction, exactly, and no other transport
// moves; a short read counts what it delivered.
func TestTransportStats(t *testing.T) {
	forEach(t, func(t *testing.T, s setup) {
		l, c := newLib(t, s, 1)
		const size = 3<<20 + 12345
		name := patternFile(t, size)
		fd := openFile(t, name, unix.O_RDWR)
		m := alloc(t, c, 0, 4<<20)
		register(t, l, m)
		before := l.TransportStats()
		reqs := []Request{
			{Fd: fd, Device: 0, DevAddr: m.Addr(), Len: 1 << 20},
			{Fd: fd, Device: 0, DevAddr: m.Addr(), BufOffset: 1 << 20, Len: 3 << 20, FileOffset: 1 << 20}, // short: the file ends
		}
		if _, err := l.ReadBatch(reqs); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Write(fd, 0, m.Addr(), 0, 4096, 0); err != nil {
			t.Fatal(err)
		}
		after := l.TransportStats()
		for i, tb := range after {
			read, written := tb.BytesRead-before[i].BytesRead, tb.BytesWritten-before[i].BytesWritten
			wantRead, wantWritten := int64(0), int64(0)
			if tb.Transport == s.transport {
				wantRead, wantWritten = size, 4096
			}
			if tb.Transport != Transports[i] || read != wantRead || written != wantWritten {
				t.Errorf("%s: read %d written %d, want %d and %d", tb.Transport, read, written, wantRead, wantWritten)
			}
		}
	})
}

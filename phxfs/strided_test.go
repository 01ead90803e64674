package phxfs

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestStridedRequests reads a tensor-parallel rank's column slice of every
// row (one strided request), a strided request whose pieces touch (one
// engine operation), one cut by the end of file, and malformed ones, on
// every transport.
func TestStridedRequests(t *testing.T) {
	forEach(t, func(t *testing.T, s setup) {
		l, c := newLib(t, s, 1)
		const rows, rowBytes, slice = 256, 7168, 896 // a bf16 [256, 3584] split over 8 ranks
		name := patternFile(t, rows*rowBytes)
		fd := openFile(t, name, unix.O_RDONLY)
		m := alloc(t, c, 0, 2*mib)
		register(t, l, m)
		const rank = 5
		reqs := []Request{
			{Fd: fd, Device: 0, DevAddr: m.Addr(), Len: slice, FileOffset: rank * slice, Count: rows, FileStride: rowBytes, BufStride: slice},
			{Fd: fd, Device: 0, DevAddr: m.Addr(), BufOffset: 1 * mib, Len: 4096, FileOffset: 8192, Count: 16, FileStride: 4096, BufStride: 4096},
			{Fd: fd, Device: 0, DevAddr: m.Addr(), BufOffset: 1*mib + 64<<10, Len: 1000, FileOffset: rows*rowBytes - 2504, Count: 5, FileStride: 1000, BufStride: 1000},
			{Fd: fd, Device: 0, DevAddr: m.Addr(), Len: 100, Count: 3, FileStride: 99, BufStride: 100},       // pieces overlap
			{Fd: fd, Device: 0, DevAddr: m.Addr(), Len: 100, Count: -1},                                      // negative count
			{Fd: fd, Device: 0, DevAddr: m.Addr(), Len: 4096, Count: 600, FileStride: 4096, BufStride: 4096}, // past the buffer
		}
		before := l.Stats()
		failed, err := l.ReadBatch(reqs)
		if err != nil {
			t.Fatal(err)
		}
		want := []int64{rows * slice, 16 * 4096, 2504, errnoResult(unix.EINVAL), errnoResult(unix.EINVAL), errnoResult(unix.EFAULT)}
		for i := range want {
			if reqs[i].Result != want[i] {
				t.Fatalf("request %d: result %d, want %d (%s)", i, reqs[i].Result, want[i], describe(reqs))
			}
		}
		if failed != 4 {
			t.Fatalf("%d failed, want 4", failed)
		}
		got := deviceBytes(t, c, m, 0, rows*slice)
		for r := int64(0); r < rows; r++ {
			checkPattern(t, got[r*slice:(r+1)*slice], r*rowBytes+rank*slice)
		}
		checkPattern(t, deviceBytes(t, c, m, 1*mib, 16*4096), 8192)
		checkPattern(t, deviceBytes(t, c, m, 1*mib+64<<10, 2504), rows*rowBytes-2504)
		// The touching pieces are one operation (up to the transport's
		// limit), not sixteen.
		st := l.Stats()
		if co := st.Coalesced - before.Coalesced; co < 15 {
			t.Fatalf("%d pieces coalesced, want the touching request's 15 at least", co)
		}
	})
}

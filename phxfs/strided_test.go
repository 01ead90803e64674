package phxfs

import (
	"errors"
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

// TestBatchPiecesBounded: a batch whose pieces pass MaxBatchPieces (2^26
// one-byte pieces into a 64 MiB buffer; counts summed over requests;
// counts near 2^63; empty pieces count too) fails as a whole with E2BIG
// before anything is planned, moving no byte; a few empty pieces are a
// bad request (EINVAL), not pieces to walk; the largest batch allowed
// runs.
func TestBatchPiecesBounded(t *testing.T) {
	l, c := newLib(t, setup{"sync", Host}, 1)
	name := patternFile(t, 2*mib)
	fd := openFile(t, name, unix.O_RDONLY)
	m := alloc(t, c, 0, 64*mib)
	register(t, l, m)
	one := func(count int64) Request {
		return Request{Fd: fd, Device: 0, DevAddr: m.Addr(), Len: 1, Count: count, FileStride: 1, BufStride: 1}
	}
	for _, reqs := range [][]Request{
		{one(1 << 26)},
		{one(MaxBatchPieces), one(1)},
		{one(1<<63 - 1), one(1<<63 - 1)},
	} {
		before := l.Stats()
		if _, err := l.ReadBatch(reqs); !errors.Is(err, unix.E2BIG) {
			t.Errorf("%s: %v, want E2BIG", describe(reqs), err)
		}
		if st := l.Stats(); st.Requests != before.Requests || st.BytesRead != before.BytesRead {
			t.Errorf("%s: a refused batch reached the engine", describe(reqs))
		}
	}
	empty := []Request{{Fd: fd, Device: 0, DevAddr: m.Addr(), Count: 2}}
	if _, err := l.ReadBatch(empty); err != nil || empty[0].Result != errnoResult(unix.EINVAL) {
		t.Errorf("two empty pieces: %v, result %d; want EINVAL", err, empty[0].Result)
	}
	empty[0].Count = 1 << 40
	if _, err := l.ReadBatch(empty); !errors.Is(err, unix.E2BIG) {
		t.Errorf("2^40 empty pieces: %v, want E2BIG", err)
	}
	reqs := []Request{one(MaxBatchPieces / 2), {Fd: fd, Device: 0, DevAddr: m.Addr(), BufOffset: 32 * mib, Len: 1, Count: MaxBatchPieces / 2, FileStride: 2, BufStride: 1}}
	if failed, err := l.ReadBatch(reqs); err != nil || failed != 0 {
		t.Fatalf("the largest batch: %d failed, %v (%s)", failed, err, describe(reqs))
	}
	got := deviceBytes(t, c, m, 0, MaxBatchPieces/2)
	checkPattern(t, got, 0)
	strided := deviceBytes(t, c, m, 32*mib, MaxBatchPieces/2)
	file := make([]byte, 2*mib)
	fillPattern(file, 0)
	for j := range strided {
		if strided[j] != file[2*j] {
			t.Fatalf("strided piece %d: %#x, want %#x", j, strided[j], file[2*j])
		}
	}
}

package fusefs

import (
	"bytes"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
)

// stridedBatch sends a strided batch and returns its results and failed count.
func (e *ctlEnv) stridedBatch(t testing.TB, f *OpenFile, write bool, reqs []client.IOReq) ([]int64, int) {
	t.Helper()
	errno, res, failed := e.strided(t, f, write, reqs)
	if errno != 0 {
		t.Fatalf("strided batch: %v", errno)
	}
	return res, failed
}

// stridedErrno sends a strided batch and returns the ioctl's errno, and
// its results when it succeeded.
func (e *ctlEnv) stridedErrno(t testing.TB, f *OpenFile, write bool, reqs []client.IOReq) (unix.Errno, []int64) {
	t.Helper()
	errno, res, _ := e.strided(t, f, write, reqs)
	return errno, res
}

func (e *ctlEnv) strided(t testing.TB, f *OpenFile, write bool, reqs []client.IOReq) (unix.Errno, []int64, int) {
	t.Helper()
	b, err := client.EncodeStridedBatch(len(reqs), reqs)
	if err != nil {
		t.Fatal(err)
	}
	out, errno := e.ioctl(e.me, f, client.CmdStridedBatch(write, len(reqs)), b)
	if errno != 0 {
		return unix.Errno(errno), nil, 0
	}
	res := make([]int64, len(reqs))
	failed, err := client.DecodeStridedBatchResp(out, res)
	if err != nil {
		t.Fatal(err)
	}
	return 0, res, failed
}

// TestControlStridedBatch: a rank's column slice of every row in one
// extent, pieces cut by the end of file, and every per-extent refusal; a
// strided write lands each piece, as the same plain extents would.
func TestControlStridedBatch(t *testing.T) {
	for _, staged := range []bool{false, true} {
		t.Run(fmt.Sprintf("staged=%v", staged), func(t *testing.T) {
			e := newCtlEnv(t, staged, false)
			const rows, rowBytes, slice = 300, 3000, 375 // 8 ranks, odd sizes
			f, data := patternFile(t, rows*rowBytes, unix.O_RDONLY)
			m := e.alloc(t, 1<<20)
			mem := m.Bytes()
			poison(mem)
			r := e.registered(t, f, m)
			const rank = 3
			reqs := []client.IOReq{
				{ID: r.ID, Length: slice, FileOffset: rank * slice, Count: rows, FileStride: rowBytes, BufStride: slice},
				{ID: r.ID, BufOffset: 200000, Length: 1000, FileOffset: rows*rowBytes - 2500, Count: 5, FileStride: 1000, BufStride: 1000},
				{ID: r.ID, BufOffset: 300000, Length: 10, Count: 0},                                      // count 0
				{ID: r.ID, BufOffset: 300000, Length: 10, Count: 2, FileStride: 10, BufStride: 9},        // pieces overlap
				{ID: r.ID, BufOffset: 1<<20 - 100, Length: 10, Count: 11, FileStride: 10, BufStride: 10}, // past the buffer
				{ID: r.ID + 9, Length: 10, Count: 2, FileStride: 10, BufStride: 10},                      // unknown id
			}
			res, failed := e.stridedBatch(t, f, false, reqs)
			want := []int64{rows * slice, 2500, -int64(unix.EINVAL), -int64(unix.EINVAL), -int64(unix.EFAULT), -int64(unix.ENOENT)}
			for i := range want {
				if res[i] != want[i] {
					t.Errorf("extent %d: result %d, want %d", i, res[i], want[i])
				}
			}
			if failed != 5 {
				t.Errorf("failed = %d, want 5", failed)
			}
			for row := 0; row < rows; row++ {
				at := row*rowBytes + rank*slice
				if !bytes.Equal(mem[row*slice:(row+1)*slice], data[at:at+slice]) {
					t.Fatalf("row %d: the slice differs from the file", row)
				}
			}
			if !bytes.Equal(mem[200000:202500], data[len(data)-2500:]) || !allA5(mem[202500:210000]) {
				t.Errorf("the pieces before end of file differ, or bytes past it moved")
			}
			if !allA5(mem[rows*slice : 200000]) {
				t.Errorf("bytes between the extents moved")
			}
		})
	}
}

func TestControlStridedWrite(t *testing.T) {
	e := newCtlEnv(t, false, false)
	f, data := patternFile(t, 64<<10, unix.O_RDWR)
	m := e.alloc(t, 1<<20)
	for i := range m.Bytes() {
		m.Bytes()[i] = byte(i*7 + 1)
	}
	r := e.registered(t, f, m)
	// Rank 1 of 4 writes its column of 16 rows of 1000 bytes.
	reqs := []client.IOReq{{ID: r.ID, BufOffset: 64, Length: 250, FileOffset: 250, Count: 16, FileStride: 1000, BufStride: 250}}
	res, failed := e.stridedBatch(t, f, true, reqs)
	if res[0] != 16*250 || failed != 0 {
		t.Fatalf("strided write = %v, failed %d", res, failed)
	}
	for row := 0; row < 16; row++ {
		copy(data[row*1000+250:row*1000+500], m.Bytes()[64+row*250:64+(row+1)*250])
	}
	got := make([]byte, len(data))
	unix.Pread(f.Fd, got, 0)
	if !bytes.Equal(got, data) {
		t.Fatalf("file after the strided write differs")
	}
	if in := e.info(t, f); in.Counters.IoctlExtents != 1 || in.Counters.IoctlBytesWritten != 16*250 {
		t.Errorf("counters: %d extents, %d bytes written; want 1 and %d", in.Counters.IoctlExtents, in.Counters.IoctlBytesWritten, 16*250)
	}
}

func TestFoldPieces(t *testing.T) {
	pieces := []client.IOReq{{Length: 10}, {Length: 10}, {Length: 10}, {Length: 10}, {Length: 10}}
	of := []int{0, 0, 0, 1, 1}
	for _, c := range []struct {
		res  []int64
		want []int64
	}{
		{[]int64{10, 10, 10, 10, 10}, []int64{30, 20}},
		{[]int64{10, 4, 10, 10, 0}, []int64{14, 10}},
		{[]int64{-5, 10, 10, 10, -28}, []int64{-5, 10}},
		{[]int64{10, -5, 10, 0, 10}, []int64{10, 0}},
	} {
		got := foldPieces(2, of, pieces, c.res)
		if got[0] != c.want[0] || got[1] != c.want[1] {
			t.Errorf("fold %v = %v, want %v", c.res, got, c.want)
		}
	}
}

package client

// READ, WRITE and the batches (docs/abi.md).

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// IOReq is one extent: a READ or WRITE request, or one entry of a batch. An
// entry of a strided batch moves Count pieces of Length bytes: piece j
// between FileOffset + j*FileStride and BufOffset + j*BufStride. Count is
// 0 (taken as 1) everywhere else.
type IOReq struct {
	ID         uint64
	BufOffset  uint64
	Length     uint64
	FileOffset uint64
	Count      uint64
	FileStride uint64
	BufStride  uint64
}

// MaxOffset bounds every offset and length: values of 2^63 and more are
// invalid (EINVAL).
const MaxOffset = 1<<63 - 1

// Pieces is the number of pieces the extent moves (1 for a plain one).
func (r IOReq) Pieces() uint64 { return max(r.Count, 1) }

// Bytes is what the extent moves when nothing is short: Length a piece.
func (r IOReq) Bytes() uint64 { return r.Length * r.Pieces() }

// End is where the last piece ends in the file (FileOffset + Length for a
// plain extent); BufEnd in the buffer. Valid extents do not overflow.
func (r IOReq) End() uint64 { return r.FileOffset + (r.Pieces()-1)*r.FileStride + r.Length }

// BufEnd is where the last piece ends in the buffer.
func (r IOReq) BufEnd() uint64 { return r.BufOffset + (r.Pieces()-1)*r.BufStride + r.Length }

// Valid checks that an extent's numbers are representable (EINVAL
// otherwise): every offset and length, and the file end, below 2^63 and,
// for a strided extent, pieces that are not empty, strides no shorter
// than a piece, so that pieces do not overlap, and no stride that carries
// a piece past 2^63. Bounds against the buffer are the daemon's business
// (EFAULT); how many pieces one ioctl may carry is the batch's
// (MaxPieces, E2BIG).
func (r IOReq) Valid() error {
	if r.BufOffset > MaxOffset || r.Length > MaxOffset || r.FileOffset > MaxOffset {
		return einval("extent offsets and lengths must be below 2^63")
	}
	if r.Pieces() > 1 {
		if r.Length == 0 {
			// Nothing to move, but a piece each to walk: refused, so
			// that no count costs the daemon without bytes to show.
			return einval("strided extent of %d empty pieces", r.Pieces())
		}
		if r.FileStride < r.Length || r.BufStride < r.Length {
			return einval("strided extent: strides %d (file) and %d (buffer) shorter than a piece of %d", r.FileStride, r.BufStride, r.Length)
		}
		n := r.Pieces() - 1
		if r.FileStride > (MaxOffset-r.FileOffset)/n || r.BufStride > (MaxOffset-r.BufOffset)/n || r.Length > MaxOffset/r.Pieces() {
			return einval("strided extent of %d pieces runs past 2^63", r.Pieces())
		}
	}
	if r.End() > MaxOffset || r.End() < r.FileOffset {
		return einval("extent [%d, +%d) runs past the largest file offset", r.FileOffset, r.End()-r.FileOffset)
	}
	return nil // BufEnd does not wrap: the buffer's bounds decide (EFAULT)
}

// EncodeIO lays out a READ or WRITE request (result zero).
func EncodeIO(r IOReq) []byte {
	b := make([]byte, IOSize)
	putHeader(b)
	putExtent(b[8:], r)
	return b
}

func putExtent(b []byte, r IOReq) {
	le.PutUint64(b[0:], r.ID)
	le.PutUint64(b[8:], r.BufOffset)
	le.PutUint64(b[16:], r.Length)
	le.PutUint64(b[24:], r.FileOffset)
}

func getExtent(b []byte) IOReq {
	return IOReq{ID: le.Uint64(b[0:]), BufOffset: le.Uint64(b[8:]), Length: le.Uint64(b[16:]), FileOffset: le.Uint64(b[24:])}
}

// DecodeIO checks and decodes a READ or WRITE request. The result field
// must be zero on input.
func DecodeIO(b []byte) (IOReq, error) {
	if err := checkHeader(b, IOSize, "read/write"); err != nil {
		return IOReq{}, err
	}
	if le.Uint64(b[40:]) != 0 {
		return IOReq{}, einval("read/write: result field must be zero")
	}
	r := getExtent(b[8:])
	if err := r.Valid(); err != nil {
		return IOReq{}, err
	}
	return r, nil
}

// EncodeIOResp fills out (IOSize bytes) with the request and its result.
func EncodeIOResp(out []byte, r IOReq, result int64) {
	copy(out, EncodeIO(r))
	le.PutUint64(out[40:], uint64(result))
}

// DecodeIOResp reads the result of a READ or WRITE.
func DecodeIOResp(b []byte) (int64, error) {
	if err := checkHeader(b, IOSize, "read/write reply"); err != nil {
		return 0, err
	}
	return int64(le.Uint64(b[40:])), nil
}

// EncodeBatch lays out a batch of len(reqs) extents in a payload of the
// given capacity (len(reqs) <= capacity <= MaxExtents).
func EncodeBatch(capacity int, reqs []IOReq) ([]byte, error) {
	return plainBatch.encode(capacity, reqs)
}

// EncodeStridedBatch lays out a strided batch (len(reqs) <= capacity <=
// MaxStridedExtents); an extent's Count must be at least 1.
func EncodeStridedBatch(capacity int, reqs []IOReq) ([]byte, error) {
	return stridedBatch.encode(capacity, reqs)
}

func (l batchLayout) encode(capacity int, reqs []IOReq) ([]byte, error) {
	if capacity < 1 || capacity > l.max || len(reqs) > capacity {
		return nil, einval("%s of %d extents in capacity %d (1 to %d)", l.what, len(reqs), capacity, l.max)
	}
	b := make([]byte, l.size(capacity))
	putHeader(b)
	le.PutUint32(b[8:], uint32(len(reqs)))
	for i, r := range reqs {
		e := b[BatchHeader+i*l.extent:]
		putExtent(e, r)
		if l.extent == StridedExtentSize {
			le.PutUint64(e[32:], r.Count)
			le.PutUint64(e[40:], r.FileStride)
			le.PutUint64(e[48:], r.BufStride)
		}
	}
	return b, nil
}

// DecodeBatch checks and decodes a batch payload. An extent whose numbers
// are not representable (IOReq.Valid) is returned with its error in bad, so
// that it gets a per-extent -EINVAL while the rest proceed. Slots past the
// count must be zero, as must the failed count and every result.
func DecodeBatch(b []byte) (reqs []IOReq, bad []error, err error) { return plainBatch.decode(b) }

// DecodeStridedBatch is DecodeBatch for a strided batch; an extent whose
// count is 0 is bad too. A batch whose extents' counts sum past MaxPieces
// is refused as a whole (an error wrapping E2BIG), before any extent is
// decoded.
func DecodeStridedBatch(b []byte) (reqs []IOReq, bad []error, err error) {
	return stridedBatch.decode(b)
}

// stridedPieces is the pieces the first n extents of a strided batch
// payload move (the sum of their counts), saturating at 2^64 - 1: what
// MaxPieces bounds.
func stridedPieces(b []byte, n int) uint64 {
	var sum uint64
	for i := 0; i < n; i++ {
		c := le.Uint64(b[BatchHeader+i*StridedExtentSize+32:])
		if sum+c < sum {
			return ^uint64(0)
		}
		sum += c
	}
	return sum
}

func (l batchLayout) decode(b []byte) (reqs []IOReq, bad []error, err error) {
	capacity, err := l.capacity(len(b))
	if err != nil {
		return nil, nil, err
	}
	if err := checkHeader(b, len(b), l.what); err != nil {
		return nil, nil, err
	}
	n := le.Uint32(b[8:])
	if n > uint32(capacity) {
		return nil, nil, einval("%s: count %d exceeds the capacity %d", l.what, n, capacity)
	}
	if le.Uint32(b[12:]) != 0 {
		return nil, nil, einval("%s: failed count must be zero on input", l.what)
	}
	if !zero(b[BatchHeader+int(n)*l.extent:]) {
		return nil, nil, einval("%s: slots past the count must be zero", l.what)
	}
	if l.extent == StridedExtentSize {
		if p := stridedPieces(b, int(n)); p > MaxPieces {
			return nil, nil, fmt.Errorf("phx: %s of %d pieces, more than the %d one ioctl may move: %w", l.what, p, MaxPieces, unix.E2BIG)
		}
	}
	reqs = make([]IOReq, n)
	bad = make([]error, n)
	for i := range reqs {
		e := b[BatchHeader+i*l.extent:]
		if le.Uint64(e[l.extent-8:]) != 0 {
			return nil, nil, einval("%s: extent %d: result field must be zero on input", l.what, i)
		}
		reqs[i] = getExtent(e)
		if l.extent == StridedExtentSize {
			reqs[i].Count, reqs[i].FileStride, reqs[i].BufStride = le.Uint64(e[32:]), le.Uint64(e[40:]), le.Uint64(e[48:])
			if reqs[i].Count == 0 {
				bad[i] = einval("%s: extent %d: count 0", l.what, i)
				continue
			}
		}
		bad[i] = reqs[i].Valid()
	}
	return reqs, bad, nil
}

// EncodeBatchResp fills out (the request's size) with the request echoed,
// the failed count and a result per extent; a plain or strided batch, as
// the payload's size says (its command).
func EncodeBatchResp(out, in []byte, results []int64) { plainBatch.encodeResp(out, in, results) }

// EncodeStridedBatchResp is EncodeBatchResp for a strided batch.
func EncodeStridedBatchResp(out, in []byte, results []int64) {
	stridedBatch.encodeResp(out, in, results)
}

func (l batchLayout) encodeResp(out, in []byte, results []int64) {
	copy(out, in)
	failed := uint32(0)
	for i, r := range results {
		e := out[BatchHeader+i*l.extent:]
		le.PutUint64(e[l.extent-8:], uint64(r))
		want := le.Uint64(e[16:])
		if l.extent == StridedExtentSize {
			want *= le.Uint64(e[32:])
		}
		if r < 0 || uint64(r) != want {
			failed++
		}
	}
	le.PutUint32(out[12:], failed)
}

// DecodeBatchResp reads a batch's results into results (len = count) and
// returns the daemon's failed count.
func DecodeBatchResp(b []byte, results []int64) (int, error) {
	return plainBatch.decodeResp(b, results)
}

// DecodeStridedBatchResp is DecodeBatchResp for a strided batch.
func DecodeStridedBatchResp(b []byte, results []int64) (int, error) {
	return stridedBatch.decodeResp(b, results)
}

func (l batchLayout) decodeResp(b []byte, results []int64) (int, error) {
	capacity, err := l.capacity(len(b))
	if err != nil {
		return 0, err
	}
	if err := checkHeader(b, len(b), l.what+" reply"); err != nil {
		return 0, err
	}
	n := int(le.Uint32(b[8:]))
	if n > capacity || n != len(results) {
		return 0, einval("%s reply: count %d, want %d", l.what, n, len(results))
	}
	for i := range results {
		results[i] = int64(le.Uint64(b[BatchHeader+i*l.extent+l.extent-8:]))
	}
	return int(le.Uint32(b[12:])), nil
}

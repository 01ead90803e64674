package client

// READ, WRITE and the batches (docs/abi.md).

// IOReq is one extent: a READ or WRITE request, or one entry of a batch.
type IOReq struct {
	ID         uint64
	BufOffset  uint64
	Length     uint64
	FileOffset uint64
}

// MaxOffset bounds every offset and length: values of 2^63 and more are
// invalid (EINVAL).
const MaxOffset = 1<<63 - 1

// Valid checks that an extent's numbers are representable (EINVAL
// otherwise); bounds against the buffer are the daemon's business.
func (r IOReq) Valid() error {
	if r.BufOffset > MaxOffset || r.Length > MaxOffset || r.FileOffset > MaxOffset {
		return einval("extent offsets and lengths must be below 2^63")
	}
	if r.FileOffset+r.Length > MaxOffset {
		return einval("extent [%d, +%d) runs past the largest file offset", r.FileOffset, r.Length)
	}
	return nil
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
	if capacity < 1 || capacity > MaxExtents || len(reqs) > capacity {
		return nil, einval("batch of %d extents in capacity %d (1 to %d)", len(reqs), capacity, MaxExtents)
	}
	b := make([]byte, BatchSize(capacity))
	putHeader(b)
	le.PutUint32(b[8:], uint32(len(reqs)))
	for i, r := range reqs {
		putExtent(b[BatchHeader+i*ExtentSize:], r)
	}
	return b, nil
}

// DecodeBatch checks and decodes a batch payload. An extent whose numbers
// are not representable (IOReq.Valid) is returned with its error in bad, so
// that it gets a per-extent -EINVAL while the rest proceed. Slots past the
// count must be zero, as must the failed count and every result.
func DecodeBatch(b []byte) (reqs []IOReq, bad []error, err error) {
	capacity, err := batchCapacity(len(b))
	if err != nil {
		return nil, nil, err
	}
	if err := checkHeader(b, len(b), "batch"); err != nil {
		return nil, nil, err
	}
	n := le.Uint32(b[8:])
	if n > uint32(capacity) {
		return nil, nil, einval("batch: count %d exceeds the capacity %d", n, capacity)
	}
	if le.Uint32(b[12:]) != 0 {
		return nil, nil, einval("batch: failed count must be zero on input")
	}
	if !zero(b[BatchHeader+int(n)*ExtentSize:]) {
		return nil, nil, einval("batch: slots past the count must be zero")
	}
	reqs = make([]IOReq, n)
	bad = make([]error, n)
	for i := range reqs {
		e := b[BatchHeader+i*ExtentSize:]
		if le.Uint64(e[32:]) != 0 {
			return nil, nil, einval("batch: extent %d: result field must be zero on input", i)
		}
		reqs[i] = getExtent(e)
		bad[i] = reqs[i].Valid()
	}
	return reqs, bad, nil
}

// EncodeBatchResp fills out (the request's size) with the request echoed,
// the failed count and a result per extent.
func EncodeBatchResp(out, in []byte, results []int64) {
	copy(out, in)
	failed := uint32(0)
	for i, r := range results {
		e := out[BatchHeader+i*ExtentSize:]
		le.PutUint64(e[32:], uint64(r))
		if r < 0 || uint64(r) != le.Uint64(e[16:]) {
			failed++
		}
	}
	le.PutUint32(out[12:], failed)
}

// DecodeBatchResp reads a batch's results into results (len = count) and
// returns the daemon's failed count.
func DecodeBatchResp(b []byte, results []int64) (int, error) {
	capacity, err := batchCapacity(len(b))
	if err != nil {
		return 0, err
	}
	if err := checkHeader(b, len(b), "batch reply"); err != nil {
		return 0, err
	}
	n := int(le.Uint32(b[8:]))
	if n > capacity || n != len(results) {
		return 0, einval("batch reply: count %d, want %d", n, len(results))
	}
	for i := range results {
		results[i] = int64(le.Uint64(b[BatchHeader+i*ExtentSize+32:]))
	}
	return int(le.Uint32(b[12:])), nil
}

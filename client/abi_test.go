package client

import (
	"bytes"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// The command values are the ABI: docs/abi.md lists them, C and Python
// programs hard-code them.
func TestCommandValues(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uint32
	}{
		{"REGISTER", CmdRegister, 0xC080E501},
		{"DEREGISTER", CmdDeregister, 0x4020E502},
		{"READ", CmdRead, 0xC030E503},
		{"WRITE", CmdWrite, 0xC030E504},
		{"INFO", CmdInfo, 0xC200E507},
		{"BATCH_READ/16", CmdBatch(false, 16), 0xC290E505},
		{"BATCH_READ/128", CmdBatch(false, 128), 0xD410E505},
		{"BATCH_READ/400", CmdBatch(false, 400), 0xFE90E505},
		{"BATCH_WRITE/16", CmdBatch(true, 16), 0xC290E506},
		{"BATCH_WRITE/128", CmdBatch(true, 128), 0xD410E506},
		{"BATCH_WRITE/400", CmdBatch(true, 400), 0xFE90E506},
		{"BATCH_READ_STRIDED/1", CmdStridedBatch(false, 1), 0xC050E508},
		{"BATCH_READ_STRIDED/255", CmdStridedBatch(false, 255), 0xFFD0E508},
		{"BATCH_WRITE_STRIDED/16", CmdStridedBatch(true, 16), 0xC410E509},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
		if ours, err := Known(c.got); !ours || err != nil {
			t.Errorf("%s: Known = %v, %v", c.name, ours, err)
		}
	}
	if MaxExtents != 409 || BatchSize(MaxExtents) > MaxIoctlSize || BatchSize(MaxExtents+1) <= MaxIoctlSize {
		t.Errorf("MaxExtents %d does not fill a restricted ioctl", MaxExtents)
	}
	if MaxStridedExtents != 255 || StridedBatchSize(255) > MaxIoctlSize || StridedBatchSize(256) <= MaxIoctlSize {
		t.Errorf("MaxStridedExtents %d does not fill a restricted ioctl", MaxStridedExtents)
	}
}

// A strided extent is valid when its pieces do not overlap and its last
// piece ends below 2^63 in the file and in the buffer.
func TestStridedValid(t *testing.T) {
	for _, c := range []struct {
		name string
		r    IOReq
		ok   bool
	}{
		{"one piece", IOReq{Length: 100, Count: 1}, true},
		{"column slice", IOReq{Length: 3584, FileOffset: 25088, Count: 4096, FileStride: 28672, BufStride: 3584}, true},
		{"zero strides for one piece", IOReq{Length: 10, Count: 1, FileStride: 0, BufStride: 0}, true},
		{"file stride shorter than a piece", IOReq{Length: 100, Count: 2, FileStride: 99, BufStride: 100}, false},
		{"buffer stride shorter than a piece", IOReq{Length: 100, Count: 2, FileStride: 100, BufStride: 50}, false},
		{"last piece past 2^63 in the file", IOReq{Length: 1, FileOffset: 1 << 62, Count: 3, FileStride: 1 << 61, BufStride: 1}, false},
		{"strides that overflow", IOReq{Length: 1, Count: 1 << 32, FileStride: 1 << 40, BufStride: 1}, false},
		{"buffer end past 2^63: the buffer's bounds decide", IOReq{Length: 2, BufOffset: 1 << 62, Count: 2, FileStride: 2, BufStride: 1<<62 - 2}, true},
		{"buffer stride that overflows", IOReq{Length: 1, BufOffset: 1 << 62, Count: 3, FileStride: 1, BufStride: 1 << 62}, false},
		{"ends exactly at 2^63-1", IOReq{Length: 1, FileOffset: MaxOffset - 11, Count: 11, FileStride: 1, BufStride: 1}, true},
		{"empty pieces", IOReq{Length: 0, Count: 2}, false},
		{"2^32 empty pieces at zero strides", IOReq{ID: 7, Count: 1 << 32}, false},
		{"one empty piece", IOReq{Length: 0, Count: 1}, true},
	} {
		if err := c.r.Valid(); (err == nil) != c.ok {
			t.Errorf("%s: Valid = %v", c.name, err)
		} else if err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("%s: %v, want EINVAL", c.name, err)
		}
	}
}

func TestStridedBatchRoundTrip(t *testing.T) {
	reqs := []IOReq{{ID: 1, Length: 3584, FileOffset: 25088, Count: 4096, FileStride: 28672, BufStride: 3584},
		{ID: 2, Length: 10, Count: 1}, {ID: 3, Length: 10, Count: 2, FileStride: 5, BufStride: 10}}
	b, err := EncodeStridedBatch(4, reqs)
	if err != nil || len(b) != StridedBatchSize(4) {
		t.Fatalf("EncodeStridedBatch: %d bytes, %v", len(b), err)
	}
	got, bad, err := DecodeStridedBatch(b)
	if err != nil || len(got) != 3 || got[0] != reqs[0] || got[1] != reqs[1] {
		t.Fatalf("DecodeStridedBatch = %+v, %v", got, err)
	}
	if bad[0] != nil || bad[1] != nil || !errors.Is(bad[2], unix.EINVAL) {
		t.Fatalf("bad = %v: only the overlapping extent is", bad)
	}
	zeroCount := append([]byte(nil), b...)
	le.PutUint64(zeroCount[BatchHeader+StridedExtentSize+32:], 0)
	if _, bad, err := DecodeStridedBatch(zeroCount); err != nil || !errors.Is(bad[1], unix.EINVAL) {
		t.Fatalf("count 0: %v %v", bad, err)
	}
	out := make([]byte, len(b))
	EncodeStridedBatchResp(out, b, []int64{3584 * 4096, 7, -int64(unix.EINVAL)})
	res := make([]int64, 3)
	failed, err := DecodeStridedBatchResp(out, res)
	if err != nil || failed != 2 || res[0] != 3584*4096 || res[1] != 7 {
		t.Fatalf("DecodeStridedBatchResp = %d %v %v", failed, res, err)
	}
	if _, _, err := DecodeBatch(b); !errors.Is(err, unix.EINVAL) { // 16 + 64*4 is not 16 + 40*k
		t.Errorf("a strided payload decoded as a plain batch: %v", err)
	}
	if _, err := EncodeStridedBatch(MaxStridedExtents+1, nil); err == nil {
		t.Errorf("capacity past MaxStridedExtents")
	}
}

// TestStridedBatchPieces: a strided batch carries at most MaxPieces
// pieces, its extents' counts summed (overflowing sums included): past it
// the whole batch is E2BIG, and no extent is decoded.
func TestStridedBatchPieces(t *testing.T) {
	piece := func(count uint64) IOReq {
		return IOReq{ID: 3, Length: 1, Count: count, FileStride: 2, BufStride: 1}
	}
	for _, c := range []struct {
		name string
		reqs []IOReq
		ok   bool
	}{
		{"one extent of MaxPieces", []IOReq{piece(MaxPieces)}, true},
		{"one extent of MaxPieces + 1", []IOReq{piece(MaxPieces + 1)}, false},
		{"two extents summing to MaxPieces", []IOReq{piece(MaxPieces - 10), piece(10)}, true},
		{"two extents summing past it", []IOReq{piece(MaxPieces - 10), piece(11)}, false},
		{"counts that overflow 2^64", []IOReq{piece(1<<64 - 1), piece(2)}, false},
		{"2^32 empty pieces, a made-up buffer", []IOReq{{ID: 12345, Count: 1 << 32}}, false},
		{"2^26 one-byte pieces", []IOReq{{ID: 1, Length: 1, Count: 1 << 26, FileStride: 1, BufStride: 1}}, false},
		{"a count-0 extent counts nothing", []IOReq{piece(MaxPieces), {ID: 1, Length: 5}}, true},
	} {
		b, err := EncodeStridedBatch(len(c.reqs), c.reqs)
		if err != nil {
			t.Fatal(err)
		}
		reqs, bad, err := DecodeStridedBatch(b)
		switch {
		case c.ok && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case !c.ok && !errors.Is(err, unix.E2BIG):
			t.Errorf("%s: err %v, want E2BIG", c.name, err)
		case !c.ok && (reqs != nil || bad != nil):
			t.Errorf("%s: refused, but %d extents decoded", c.name, len(reqs))
		}
	}
}

func TestKnown(t *testing.T) {
	for _, c := range []struct {
		cmd  uint32
		ours bool
		bad  bool
	}{
		{0x80088801, false, false},            // the kernel module's type byte
		{ioc(3, 0x40, 48), false, false},      // unknown number
		{ioc(2, NrRead, IOSize), true, true},  // wrong direction
		{ioc(3, NrRead, 40), true, true},      // wrong size
		{ioc(3, NrBatchRead, 17), true, true}, // not 16+40k
		{ioc(3, NrBatchRead, 16), true, true}, // zero capacity
		{ioc(3, NrBatchWrite, uint32(BatchSize(409))), true, false},
		{ioc(3, NrBatchWrite, uint32(BatchSize(1))), true, false},
		{ioc(1, NrDeregister, DeregisterSize), true, false},
		{ioc(3, NrDeregister, DeregisterSize), true, true},
	} {
		ours, err := Known(c.cmd)
		if ours != c.ours || (err != nil) != c.bad {
			t.Errorf("Known(%#x) = %v, %v; want ours=%v bad=%v", c.cmd, ours, err, c.ours, c.bad)
		}
		if err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("Known(%#x): %v is not EINVAL", c.cmd, err)
		}
	}
}

func TestRegisterRoundTrip(t *testing.T) {
	req := RegisterReq{Vendor: VendorEmu, Device: 3, Size: 1 << 20}
	for i := range req.Handle {
		req.Handle[i] = byte(i * 7)
	}
	b := EncodeRegister(req)
	if le.Uint32(b) != Magic || !bytes.Equal(b[:4], []byte("PHXM")) {
		t.Fatalf("magic bytes %q", b[:4])
	}
	got, err := DecodeRegister(b)
	if err != nil || got != req {
		t.Fatalf("DecodeRegister = %+v, %v", got, err)
	}
	resp := RegisterResp{ID: 42, Transport: TransportStaged}
	resp.Token[0], resp.Token[15] = 0xab, 0xcd
	out := make([]byte, RegisterSize)
	EncodeRegisterResp(out, req, resp)
	r2, err := DecodeRegisterResp(out)
	if err != nil || r2 != resp {
		t.Fatalf("DecodeRegisterResp = %+v, %v", r2, err)
	}
	if resp.Token.String() != "ab0000000000000000000000000000cd" {
		t.Errorf("token string %s", resp.Token)
	}
	// The request part of the reply is the request.
	if _, err := DecodeRegister(out); err == nil {
		t.Errorf("a reply (outputs set) decoded as a request")
	}
	bad := bytes.Clone(b)
	bad[4] = 2
	if _, err := DecodeRegister(bad); !errors.Is(err, unix.EINVAL) {
		t.Errorf("version 2: %v", err)
	}
	bad = bytes.Clone(b)
	bad[0] ^= 1
	if _, err := DecodeRegister(bad); !errors.Is(err, unix.EINVAL) {
		t.Errorf("bad magic: %v", err)
	}
	if _, err := DecodeRegister(b[:127]); !errors.Is(err, unix.EINVAL) {
		t.Errorf("short: %v", err)
	}
}

func TestIORoundTrip(t *testing.T) {
	r := IOReq{ID: 9, BufOffset: 4096, Length: 1 << 20, FileOffset: 12345}
	b := EncodeIO(r)
	got, err := DecodeIO(b)
	if err != nil || got != r {
		t.Fatalf("DecodeIO = %+v, %v", got, err)
	}
	out := make([]byte, IOSize)
	EncodeIOResp(out, r, 777)
	if n, err := DecodeIOResp(out); err != nil || n != 777 {
		t.Fatalf("DecodeIOResp = %d, %v", n, err)
	}
	EncodeIOResp(out, r, -int64(unix.EFAULT))
	if n, _ := DecodeIOResp(out); n != -int64(unix.EFAULT) {
		t.Fatalf("negative result %d", n)
	}
	for _, bad := range []IOReq{
		{ID: 1, Length: 1 << 63},
		{ID: 1, FileOffset: 1 << 63},
		{ID: 1, BufOffset: 1<<64 - 1},
		{ID: 1, FileOffset: 1<<63 - 10, Length: 11},
	} {
		if _, err := DecodeIO(EncodeIO(bad)); !errors.Is(err, unix.EINVAL) {
			t.Errorf("DecodeIO(%+v) = %v, want EINVAL", bad, err)
		}
	}
	b[40] = 1
	if _, err := DecodeIO(b); !errors.Is(err, unix.EINVAL) {
		t.Errorf("result set on input: %v", err)
	}
}

func TestBatchRoundTrip(t *testing.T) {
	reqs := []IOReq{{ID: 1, Length: 10}, {ID: 2, BufOffset: 64, Length: 20, FileOffset: 100}, {ID: 1, BufOffset: 1 << 63, Length: 1}}
	b, err := EncodeBatch(16, reqs)
	if err != nil || len(b) != BatchSize(16) {
		t.Fatalf("EncodeBatch: %d bytes, %v", len(b), err)
	}
	got, bad, err := DecodeBatch(b)
	if err != nil || len(got) != 3 {
		t.Fatalf("DecodeBatch = %v, %v", got, err)
	}
	for i := range reqs {
		if got[i] != reqs[i] {
			t.Errorf("extent %d = %+v, want %+v", i, got[i], reqs[i])
		}
	}
	if bad[0] != nil || bad[1] != nil || !errors.Is(bad[2], unix.EINVAL) {
		t.Errorf("bad = %v", bad)
	}
	out := make([]byte, len(b))
	EncodeBatchResp(out, b, []int64{10, 5, -int64(unix.EINVAL)})
	res := make([]int64, 3)
	failed, err := DecodeBatchResp(out, res)
	if err != nil || failed != 2 || res[0] != 10 || res[1] != 5 || res[2] != -int64(unix.EINVAL) {
		t.Fatalf("DecodeBatchResp = %d %v %v", failed, res, err)
	}
	// Count past the capacity, data past the count, results set on input.
	c := bytes.Clone(b)
	le.PutUint32(c[8:], 17)
	if _, _, err := DecodeBatch(c); !errors.Is(err, unix.EINVAL) {
		t.Errorf("count 17 in 16: %v", err)
	}
	c = bytes.Clone(b)
	c[BatchHeader+3*ExtentSize] = 1
	if _, _, err := DecodeBatch(c); !errors.Is(err, unix.EINVAL) {
		t.Errorf("garbage past the count: %v", err)
	}
	if _, _, err := DecodeBatch(out); !errors.Is(err, unix.EINVAL) {
		t.Errorf("a reply decoded as a request: %v", err)
	}
	if _, err := EncodeBatch(2, reqs); err == nil {
		t.Errorf("3 extents in capacity 2")
	}
	if _, err := EncodeBatch(MaxExtents+1, nil); err == nil {
		t.Errorf("capacity past MaxExtents")
	}
}

func TestInfoRoundTrip(t *testing.T) {
	in := Info{Device: 1, Transport: TransportHost, Flags: InfoPassthrough | InfoReadOnly | InfoNetworkBacking, Workers: 4,
		PageSize: 65536, BounceSize: 4 << 20, DIOMemAlign: 512, DIOOffsetAlign: 4096, Devices: 2, Cache: CacheRevalidate,
		Vendor: "emu", Engine: "io_uring", PCIAddress: "0000:e0:01.0", DeviceName: "phxmount emulated device 1",
		PassthroughWhy: "kernel passthrough active"}
	for i, p := range in.Counters.fields() {
		*p = uint64(1000 + i)
	}
	out := make([]byte, InfoSize)
	EncodeInfo(out, in)
	got, err := DecodeInfo(out)
	if err != nil || got != in {
		t.Fatalf("DecodeInfo = %+v, %v\nwant %+v", got, err, in)
	}
	if !got.Passthrough() || !got.ReadOnly() || !got.NetworkBacking() {
		t.Errorf("flags")
	}
	if le.Uint32(out[52:]) != uint32(CacheRevalidate) || got.Cache.String() != "revalidate" {
		t.Errorf("cache field: %d at 52, %q", le.Uint32(out[52:]), got.Cache)
	}
	if le.Uint64(out[CountersOffset+8*18:]) != 1018 || in.Counters.XattrLoads != 1018 {
		t.Errorf("XattrLoads is not counter 18 at %d", CountersOffset+8*18)
	}
	if le.Uint64(out[CountersOffset+8*(numCounters-1):]) != in.Counters.StagedFallbacks || numCounters != 24 {
		t.Errorf("StagedFallbacks is not the last of 24 counters")
	}
	for i, b := range out[CountersOffset+8*numCounters:] {
		if b != 0 {
			t.Fatalf("reserved byte %d past the counters is %#x", CountersOffset+8*numCounters+i, b)
		}
	}
	long := in
	long.Vendor = "a-vendor-name-longer-than-sixteen"
	EncodeInfo(out, long)
	got, _ = DecodeInfo(out)
	if got.Vendor != long.Vendor[:15] || got.Engine != in.Engine {
		t.Errorf("long vendor = %q, engine %q", got.Vendor, got.Engine)
	}
	r := EncodeInfoReq(7)
	if dev, err := DecodeInfoReq(r); err != nil || dev != 7 {
		t.Errorf("DecodeInfoReq = %d, %v", dev, err)
	}
	if _, err := DecodeInfoReq(out); err == nil {
		t.Errorf("a reply decoded as a request")
	}
}

// TestInfoCacheFieldIsCompatible: the cache field took the reserved u32 at
// offset 52, so a client built for the layout before it (which never reads
// those bytes) decodes every other field of a new daemon's reply as
// before, a new client reads an old daemon's reply (zero there) as
// CacheUnknown, and a request must still hold zero there.
func TestInfoCacheFieldIsCompatible(t *testing.T) {
	in := Info{Device: 3, Transport: TransportStaged, Flags: InfoPassthrough, Workers: 2, PageSize: 65536,
		Devices: 4, Vendor: "emu", Engine: "sync", PassthroughWhy: "why"}
	old, cur := make([]byte, InfoSize), make([]byte, InfoSize)
	EncodeInfo(old, in)
	in.Cache, in.Flags = CacheWatch, in.Flags|InfoNetworkBacking
	EncodeInfo(cur, in)
	for i := range old {
		inCache := i >= 52 && i < 56
		inFlags := i == 16 // the low byte of the flags, which bit 5 is in
		if old[i] != cur[i] && !inCache && !inFlags {
			t.Errorf("byte %d differs (%#x, %#x): not only the cache field and the new flag bit moved", i, old[i], cur[i])
		}
	}
	got, err := DecodeInfo(old)
	if err != nil || got.Cache != CacheUnknown || got.Cache.String() != "unknown" || got.Devices != 4 || got.Vendor != "emu" {
		t.Errorf("an old daemon's reply: %+v, %v", got, err)
	}
	req := EncodeInfoReq(0)
	le.PutUint32(req[52:], uint32(CacheWatch))
	if _, err := DecodeInfoReq(req); !errors.Is(err, unix.EINVAL) {
		t.Errorf("a request with the cache field set: %v, want EINVAL", err)
	}
	if CacheClass(9).String() != "cache(9)" {
		t.Errorf("unknown class: %q", CacheClass(9))
	}
}

func TestDeregister(t *testing.T) {
	b := EncodeDeregister(5)
	if id, err := DecodeDeregister(b); err != nil || id != 5 {
		t.Fatalf("DecodeDeregister = %d, %v", id, err)
	}
	b[20] = 1
	if _, err := DecodeDeregister(b); !errors.Is(err, unix.EINVAL) {
		t.Errorf("reserved set: %v", err)
	}
}

func TestClassFor(t *testing.T) {
	for n, want := range map[int]int{1: 16, 16: 16, 17: 128, 128: 128, 129: 400, 400: 400} {
		if got := classFor(plainBatch, n); got != want {
			t.Errorf("classFor(%d) = %d, want %d", n, got, want)
		}
	}
	for n, want := range map[int]int{1: 16, 129: 255, 255: 255} {
		if got := classFor(stridedBatch, n); got != want {
			t.Errorf("strided classFor(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestCmdString(t *testing.T) {
	for cmd, want := range map[uint32]string{CmdRegister: "REGISTER", CmdDeregister: "DEREGISTER", CmdRead: "READ",
		CmdWrite: "WRITE", CmdInfo: "INFO", CmdBatch(false, 16): "BATCH_READ", CmdBatch(true, 409): "BATCH_WRITE",
		0x8008ae01: "ioctl(type 0xae, nr 0x1)", Type<<8 | 0x7f: "ioctl(type 0xe5, nr 0x7f)"} {
		if got := ParseCmd(cmd).String(); got != want {
			t.Errorf("%#x: %q, want %q", cmd, got, want)
		}
	}
}

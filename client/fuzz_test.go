package client

import (
	"bytes"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// Every decoder is fuzzed: it must never panic, must reject with EINVAL, and
// what it accepts must encode back to the same bytes.

func mustEINVAL(t *testing.T, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, unix.EINVAL) {
		t.Fatalf("decoder error %v is not EINVAL", err)
	}
}

// decodes decodes b: what decode accepts must encode back to b, and what it
// refuses is EINVAL.
func decodes[T any](t *testing.T, b []byte, decode func([]byte) (T, error), encode func(T) []byte) {
	t.Helper()
	v, err := decode(b)
	mustEINVAL(t, err)
	if err == nil && !bytes.Equal(encode(v), b) {
		t.Fatalf("round trip differs")
	}
}

func FuzzDecodeRegister(f *testing.F) {
	var h [HandleSize]byte
	copy(h[:], "PHXEMU01")
	f.Add(EncodeRegister(RegisterReq{Vendor: VendorEmu, Size: 1 << 20, Handle: h}))
	f.Add(EncodeRegister(RegisterReq{}))
	f.Add(make([]byte, RegisterSize))
	f.Add([]byte("PHXM"))
	f.Fuzz(func(t *testing.T, b []byte) {
		decodes(t, b, DecodeRegister, EncodeRegister)
		resp, err := DecodeRegisterResp(b)
		mustEINVAL(t, err)
		if err == nil && resp.ID == 0 {
			t.Fatalf("accepted buffer id 0")
		}
	})
}

func FuzzDecodeDeregister(f *testing.F) {
	f.Add(EncodeDeregister(1))
	f.Add(EncodeDeregister(1<<64 - 1))
	f.Add(make([]byte, DeregisterSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		decodes(t, b, DecodeDeregister, EncodeDeregister)
	})
}

func FuzzDecodeIO(f *testing.F) {
	f.Add(EncodeIO(IOReq{ID: 1, Length: 4096}))
	f.Add(EncodeIO(IOReq{ID: 1, BufOffset: 1 << 62, Length: 1 << 62, FileOffset: 1 << 62}))
	f.Add(EncodeIO(IOReq{ID: 1<<64 - 1, Length: 1<<64 - 1}))
	f.Add(make([]byte, IOSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeIO(b)
		mustEINVAL(t, err)
		if err != nil {
			return
		}
		if r.Valid() != nil || r.FileOffset+r.Length > MaxOffset {
			t.Fatalf("accepted an invalid extent %+v", r)
		}
		if !bytes.Equal(EncodeIO(r), b) {
			t.Fatalf("round trip differs")
		}
		out := make([]byte, IOSize)
		EncodeIOResp(out, r, -5)
		if n, err := DecodeIOResp(out); err != nil || n != -5 {
			t.Fatalf("reply %d %v", n, err)
		}
	})
}

func FuzzDecodeBatch(f *testing.F) {
	for _, c := range []int{1, 16, 128, 400, MaxExtents} {
		reqs := make([]IOReq, min(c, 5))
		for i := range reqs {
			reqs[i] = IOReq{ID: uint64(i + 1), BufOffset: uint64(i) << 14, Length: 1 << 14, FileOffset: uint64(i) << 20}
		}
		b, _ := EncodeBatch(c, reqs)
		f.Add(b)
	}
	f.Add(make([]byte, BatchSize(2)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		reqs, bad, err := DecodeBatch(b)
		mustEINVAL(t, err)
		if err != nil {
			return
		}
		if len(bad) != len(reqs) {
			t.Fatalf("%d errors for %d extents", len(bad), len(reqs))
		}
		for i, e := range bad {
			mustEINVAL(t, e)
			if (e == nil) != (reqs[i].Valid() == nil) {
				t.Fatalf("extent %d: validity mismatch", i)
			}
		}
		again, err := EncodeBatch((len(b)-BatchHeader)/ExtentSize, reqs)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("round trip differs (%v)", err)
		}
		results := make([]int64, len(reqs))
		for i := range results {
			results[i] = int64(reqs[i].Length)
		}
		out := make([]byte, len(b))
		EncodeBatchResp(out, b, results)
		got := make([]int64, len(reqs))
		failed, err := DecodeBatchResp(out, got)
		if err != nil || failed != 0 {
			t.Fatalf("reply: failed %d, %v", failed, err)
		}
	})
}

func FuzzDecodeStridedBatch(f *testing.F) {
	for _, c := range []int{1, 16, MaxStridedExtents} {
		b, _ := EncodeStridedBatch(c, []IOReq{{ID: 1, Length: 3584, FileOffset: 25088, Count: 4096, FileStride: 28672, BufStride: 3584}})
		f.Add(b)
	}
	f.Add(make([]byte, StridedBatchSize(2)))
	huge, _ := EncodeStridedBatch(2, []IOReq{{ID: 7, Count: 1 << 32}, {ID: 7, Length: 1, Count: 1 << 26, FileStride: 1, BufStride: 1}})
	f.Add(huge)
	f.Fuzz(func(t *testing.T, b []byte) {
		reqs, bad, err := DecodeStridedBatch(b)
		if errors.Is(err, unix.E2BIG) {
			return // too many pieces: the one other error a strided batch has
		}
		mustEINVAL(t, err)
		if err != nil {
			return
		}
		var pieces uint64
		for i, e := range bad {
			mustEINVAL(t, e)
			pieces += reqs[i].Count
			if e == nil && (reqs[i].Count == 0 || reqs[i].End() > MaxOffset || reqs[i].BufEnd() < reqs[i].BufOffset ||
				(reqs[i].Count > 1 && reqs[i].Length == 0)) {
				t.Fatalf("extent %d accepted: %+v", i, reqs[i])
			}
		}
		if pieces > MaxPieces {
			t.Fatalf("a batch of %d pieces accepted", pieces)
		}
		again, err := EncodeStridedBatch((len(b)-BatchHeader)/StridedExtentSize, reqs)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("round trip differs (%v)", err)
		}
	})
}

func FuzzDecodeInfo(f *testing.F) {
	f.Add(EncodeInfoReq(0))
	out := make([]byte, InfoSize)
	EncodeInfo(out, Info{Vendor: "emu", Engine: "io_uring", Transport: TransportHost})
	f.Add(out)
	f.Fuzz(func(t *testing.T, b []byte) {
		decodes(t, b, DecodeInfoReq, EncodeInfoReq)
		in, err := DecodeInfo(b)
		mustEINVAL(t, err)
		if err != nil {
			return
		}
		o := make([]byte, InfoSize)
		EncodeInfo(o, in)
		again, err := DecodeInfo(o)
		if err != nil || again != in {
			t.Fatalf("info round trip differs")
		}
	})
}

func FuzzKnown(f *testing.F) {
	for _, c := range []uint32{CmdRegister, CmdDeregister, CmdRead, CmdWrite, CmdInfo, CmdBatch(false, 16), CmdBatch(true, 409), 0x80088801, 0} {
		f.Add(c)
	}
	f.Fuzz(func(t *testing.T, cmd uint32) {
		ours, err := Known(cmd)
		mustEINVAL(t, err)
		c := ParseCmd(cmd)
		if ours && c.Type != Type {
			t.Fatalf("%#x claimed with type %#x", cmd, c.Type)
		}
		if ours && err == nil && c.Size > MaxIoctlSize {
			t.Fatalf("%#x accepted with size %d", cmd, c.Size)
		}
	})
}

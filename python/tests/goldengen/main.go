// Command goldengen writes the ABI golden vectors that the Python client's
// tests (python/tests/test_abi.py) check their struct packing against: every
// struct encoded by package client, the Go side of the ABI, as hex.
//
//	go run ./python/tests/goldengen > python/tests/golden_abi.json
//
// Its test fails when the committed file no longer matches package client.
package main

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"

	"github.com/phxmount/phxmount/client"
)

type vector struct {
	Name string         `json:"name"`
	Args map[string]any `json:"args"`
	Hex  string         `json:"hex"`
}

func main() {
	b, err := generate()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Stdout.Write(b)
}

func generate() ([]byte, error) {
	var vs []vector
	add := func(name string, args map[string]any, b []byte) {
		vs = append(vs, vector{Name: name, Args: args, Hex: hex.EncodeToString(b)})
	}
	var handle [client.HandleSize]byte
	for i := range handle {
		handle[i] = byte(0xA0 + i)
	}
	reg := client.RegisterReq{Vendor: client.VendorByName("nvidia"), Device: 3, Size: 8 << 30, Handle: handle}
	add("register", map[string]any{"vendor": 2, "device": 3, "size": 8 << 30, "handle": hex.EncodeToString(handle[:])}, client.EncodeRegister(reg))

	var tok client.Token
	for i := range tok {
		tok[i] = byte(i*7 + 1)
	}
	out := make([]byte, client.RegisterSize)
	client.EncodeRegisterResp(out, reg, client.RegisterResp{ID: 0x1122334455, Token: tok, Transport: client.TransportByName("staged")})
	add("register_resp", map[string]any{"id": 0x1122334455, "token": hex.EncodeToString(tok[:]), "transport": 3}, out)

	add("deregister", map[string]any{"id": 77}, client.EncodeDeregister(77))

	io := client.IOReq{ID: 5, BufOffset: 65536, Length: 128 << 20, FileOffset: 1<<40 + 3}
	add("io", map[string]any{"id": 5, "buf_offset": 65536, "length": 128 << 20, "file_offset": 1<<40 + 3}, client.EncodeIO(io))
	iout := make([]byte, client.IOSize)
	client.EncodeIOResp(iout, io, -5)
	add("io_resp", map[string]any{"result": -5}, iout)

	var reqs []client.IOReq
	var exts []any
	for i := range 3 {
		r := client.IOReq{ID: uint64(10 + i), BufOffset: uint64(i) << 27, Length: 1<<27 - uint64(i), FileOffset: 8 + uint64(i)<<27}
		reqs = append(reqs, r)
		exts = append(exts, map[string]any{"id": r.ID, "buf_offset": r.BufOffset, "length": r.Length, "file_offset": r.FileOffset})
	}
	for _, capacity := range []int{3, 16, 409} {
		b, err := client.EncodeBatch(capacity, reqs)
		if err != nil {
			return nil, err
		}
		add(fmt.Sprintf("batch_%d", capacity), map[string]any{"capacity": capacity, "extents": exts, "cmd": client.CmdBatch(false, capacity), "cmd_write": client.CmdBatch(true, capacity)}, b)
		if capacity == 16 {
			bout := make([]byte, len(b))
			client.EncodeBatchResp(bout, b, []int64{int64(reqs[0].Length), -2, 100})
			add("batch_resp_16", map[string]any{"results": []int64{int64(reqs[0].Length), -2, 100}, "failed": 2}, bout)
		}
	}

	// A strided batch: a column slice of every row, a plain extent, one of
	// two pieces.
	sreqs := []client.IOReq{
		{ID: 7, BufOffset: 1 << 20, Length: 3584, FileOffset: 25088, Count: 4096, FileStride: 28672, BufStride: 3584},
		{ID: 8, Length: 100, FileOffset: 5, Count: 1},
		{ID: 9, BufOffset: 64, Length: 16, FileOffset: 1 << 40, Count: 2, FileStride: 1 << 30, BufStride: 32},
	}
	var sexts []any
	for _, r := range sreqs {
		sexts = append(sexts, map[string]any{"id": r.ID, "buf_offset": r.BufOffset, "length": r.Length, "file_offset": r.FileOffset,
			"count": r.Count, "file_stride": r.FileStride, "buf_stride": r.BufStride})
	}
	for _, capacity := range []int{3, 255} {
		b, err := client.EncodeStridedBatch(capacity, sreqs)
		if err != nil {
			return nil, err
		}
		add(fmt.Sprintf("strided_%d", capacity), map[string]any{"capacity": capacity, "extents": sexts,
			"cmd": client.CmdStridedBatch(false, capacity), "cmd_write": client.CmdStridedBatch(true, capacity)}, b)
		if capacity == 3 {
			bout := make([]byte, len(b))
			res := []int64{3584 * 4096, 40, -22}
			client.EncodeStridedBatchResp(bout, b, res)
			add("strided_resp_3", map[string]any{"results": res, "failed": 2}, bout)
		}
	}

	add("info_req", map[string]any{"device": 2}, client.EncodeInfoReq(2))
	info := client.Info{Device: 2, Transport: client.TransportByName("staged"), Flags: client.InfoPassthrough | client.InfoReadOnly,
		Workers: 16, PageSize: 65536, BounceSize: 4 << 20, DIOMemAlign: 512, DIOOffsetAlign: 4096, Devices: 8,
		Vendor: "nvidia", Engine: "io_uring", PCIAddress: "0000:00:06.0", DeviceName: "NVIDIA H200", PassthroughWhy: "kernel passthrough active"}
	iinfo := make([]byte, client.InfoSize)
	client.EncodeInfo(iinfo, info)
	// Counter i (wire order) holds i+1; the names come from the one table.
	for i := range client.CounterNames() {
		binary.LittleEndian.PutUint64(iinfo[client.CountersOffset+8*i:], uint64(i+1))
	}
	add("info", map[string]any{"device": 2, "transport": 3, "flags": 3, "workers": 16, "page_size": 65536, "bounce_size": 4 << 20,
		"dio_mem_align": 512, "dio_offset_align": 4096, "devices": 8, "vendor": "nvidia", "engine": "io_uring",
		"pci_address": "0000:00:06.0", "device_name": "NVIDIA H200", "passthrough_why": "kernel passthrough active",
		"counter_names": client.CounterNames()}, iinfo)

	cmds := map[string]any{"register": client.CmdRegister, "deregister": client.CmdDeregister, "read": client.CmdRead,
		"write": client.CmdWrite, "info": client.CmdInfo, "max_extents": client.MaxExtents,
		"max_strided_extents": client.MaxStridedExtents, "max_pieces": client.MaxPieces}
	var js bytes.Buffer
	enc := json.NewEncoder(&js)
	enc.SetIndent("", " ")
	if err := enc.Encode(map[string]any{"commands": cmds, "vectors": vs}); err != nil {
		return nil, err
	}
	return js.Bytes(), nil
}

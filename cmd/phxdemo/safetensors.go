package main

// The safetensors files of the demo: gen writes one shaped like a small
// transformer's weights, parse reads one back.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
)

type tensor struct {
	DType       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// layout is a small transformer's tensors, scaled so that the data is about
// size bytes.
func layout(size int64) (names []string, ts map[string]tensor) {
	const hidden = 1024
	ts = map[string]tensor{}
	var off int64
	add := func(name string, shape ...int64) {
		n := int64(2) // bf16
		for _, d := range shape {
			n *= d
		}
		ts[name] = tensor{DType: "BF16", Shape: shape, DataOffsets: [2]int64{off, off + n}}
		names = append(names, name)
		off += n
	}
	add("model.embed_tokens.weight", 32000, hidden)
	perLayer := int64(2*(4*hidden*hidden+3*hidden*2816) + 2*2*hidden)
	layers := max((size-off)/perLayer, 1)
	for l := int64(0); l < layers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		add(p+"input_layernorm.weight", hidden)
		for _, m := range []string{"q", "k", "v", "o"} {
			add(p+"self_attn."+m+"_proj.weight", hidden, hidden)
		}
		add(p+"post_attention_layernorm.weight", hidden)
		add(p+"mlp.gate_proj.weight", 2816, hidden)
		add(p+"mlp.up_proj.weight", 2816, hidden)
		add(p+"mlp.down_proj.weight", hidden, 2816)
	}
	add("model.norm.weight", hidden)
	return names, ts
}

// gen writes the file: 8-byte little-endian header length, JSON header,
// tensor data from a fixed-seed generator.
func gen(out string, size int64) error {
	if out == "" {
		return errors.New("gen: -out is required")
	}
	names, ts := layout(size)
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt", "generator": "phxdemo"}}
	for n, t := range ts {
		hdr[n] = t
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return err
	}
	for len(js)%8 != 0 { // safetensors pads the header with spaces
		js = append(js, ' ')
	}
	last := ts[names[len(names)-1]].DataOffsets[1]
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	var lenb [8]byte
	binary.LittleEndian.PutUint64(lenb[:], uint64(len(js)))
	if _, err := f.Write(append(lenb[:], js...)); err != nil {
		return err
	}
	buf := make([]byte, 4<<20)
	x := uint64(0x9E3779B97F4A7C15)
	for done := int64(0); done < last; {
		n := min(int64(len(buf)), last-done)
		for i := int64(0); i+8 <= n; i += 8 { // splitmix64
			x += 0x9E3779B97F4A7C15
			z := x
			z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
			z = (z ^ (z >> 27)) * 0x94D049BB133111EB
			binary.LittleEndian.PutUint64(buf[i:], z^(z>>31))
		}
		if _, err := f.Write(buf[:n]); err != nil {
			return err
		}
		done += n
	}
	fmt.Printf("wrote %s: %d tensors, %.1f MiB (header %d bytes)\n", out, len(names), float64(8+int64(len(js))+last)/(1<<20), len(js))
	return f.Close()
}

// safetensors is a parsed file: where its tensor data starts and ends,
// and its tensors in file order.
type safetensors struct {
	dataStart, dataLen int64
	names              []string
	ts                 map[string]tensor
}

// parse reads a safetensors file's header.
func parse(f *os.File) (safetensors, error) {
	js, err := readHeader(f)
	if err != nil {
		return safetensors{}, err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(js, &raw); err != nil {
		return safetensors{}, err
	}
	st := safetensors{dataStart: 8 + int64(len(js)), ts: map[string]tensor{}}
	for k, v := range raw {
		if k == "__metadata__" {
			continue
		}
		var t tensor
		if err := json.Unmarshal(v, &t); err != nil {
			return safetensors{}, fmt.Errorf("tensor %s: %w", k, err)
		}
		st.ts[k] = t
		st.names = append(st.names, k)
	}
	if len(st.names) == 0 {
		return safetensors{}, errors.New("no tensors")
	}
	sort.Slice(st.names, func(i, j int) bool { return st.ts[st.names[i]].DataOffsets[0] < st.ts[st.names[j]].DataOffsets[0] })
	st.dataLen = st.ts[st.names[len(st.names)-1]].DataOffsets[1]
	return st, nil
}

// readHeader reads the JSON header: its length (8 bytes, little-endian),
// then the header itself.
func readHeader(f *os.File) ([]byte, error) {
	var lenb [8]byte
	if _, err := f.ReadAt(lenb[:], 0); err != nil {
		return nil, err
	}
	n := int64(binary.LittleEndian.Uint64(lenb[:]))
	if n <= 0 || n > 100<<20 {
		return nil, fmt.Errorf("header length %d", n)
	}
	js := make([]byte, n)
	if _, err := f.ReadAt(js, 8); err != nil {
		return nil, err
	}
	return js, nil
}

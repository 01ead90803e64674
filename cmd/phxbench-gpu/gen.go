package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The safetensors file: gen writes one of random tensors, readHeader reads
// its (or any) header back.

// tensor is one entry of a safetensors header: its bytes are [Begin, End)
// of the data section.
type tensor struct {
	Name  string
	DType string
	Shape []int64
	Begin int64
	End   int64
}

var dtypeSize = map[string]int64{"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "F16": 2, "BF16": 2, "I32": 4, "F32": 4, "I64": 8, "F64": 8}

func isFloat(dt string) bool { return dt == "F16" || dt == "BF16" || dt == "F32" || dt == "F64" }

// layout plans about size bytes of tensors: big 2-D tensors of varied
// dtypes and sizes, with a few odd-sized small ones so that later tensors
// start at offsets that are not multiples of their element size.
func layout(size int64) []tensor {
	big := []string{"BF16", "F32", "F16", "BF16", "I64", "F64", "BF16", "I32"}
	var ts []tensor
	var pos int64
	add := func(name, dt string, shape ...int64) {
		n := dtypeSize[dt]
		for _, s := range shape {
			n *= s
		}
		if shape == nil {
			shape = []int64{} // a scalar: "shape": []
		}
		ts = append(ts, tensor{Name: name, DType: dt, Shape: shape, Begin: pos, End: pos + n})
		pos += n
	}
	for i := 0; pos < size-256*mib || i < 2; i++ {
		dt := big[i%len(big)]
		cols := int64(4096)
		want := int64(64+(i*37)%192) * mib
		rows := want / (cols * dtypeSize[dt])
		add(fmt.Sprintf("layers.%d.weight", i), dt, rows, cols)
		switch i {
		case 3:
			add("layers.3.odd_u8", "U8", 13)
		case 11:
			add("layers.11.mask", "BOOL", 7, 3)
		}
	}
	if rest := size - pos; rest > 0 {
		add("tail.weight", "BF16", rest/2/4096, 4096)
	}
	add("tail.bias", "F32", 4099)
	add("tail.i8", "I8", 5)
	add("tail.scalar", "F64")
	add("tail.empty", "F16", 0, 8)
	return ts
}

func splitmix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}

// fill writes the data bytes [off, off+len(b)) of the data section: random,
// made finite for floats (the top exponent bit cleared) and 0/1 for BOOL.
func fill(b []byte, off int64, seed uint64, ts []tensor) {
	for i := 0; i < len(b); i += 8 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], splitmix(seed^uint64((off+int64(i))/8)))
		copy(b[i:], w[:])
	}
	end := off + int64(len(b))
	k := sort.Search(len(ts), func(k int) bool { return ts[k].End > off })
	for ; k < len(ts) && ts[k].Begin < end; k++ {
		t := ts[k]
		lo, hi := max(t.Begin, off), min(t.End, end)
		switch {
		case t.DType == "BOOL":
			for p := lo; p < hi; p++ {
				b[p-off] &= 1
			}
		case isFloat(t.DType):
			sz := dtypeSize[t.DType]
			// top byte of each element: Begin + k*sz + sz-1
			first := t.Begin + sz - 1
			if lo > first {
				first += (lo - first + sz - 1) / sz * sz
			}
			for p := first; p < hi; p += sz {
				b[p-off] &^= 0x40
			}
		}
	}
}

func genMain(args []string) error {
	fs := flag.NewFlagSet("gen", flag.ExitOnError)
	out := fs.String("out", "", "file to write")
	sizeS := fs.String("size", "8GiB", "data bytes (suffix MiB or GiB)")
	seed := fs.Uint64("seed", 1, "seed")
	prefix := fs.String("prefix", "", "tensor name prefix (shards of one checkpoint need distinct names)")
	fs.Parse(args)
	size, err := parseSize(*sizeS)
	if err != nil || *out == "" {
		return fmt.Errorf("gen: -out and -size please (%v)", err)
	}
	ts := layout(size)
	for i := range ts {
		ts[i].Name = *prefix + ts[i].Name
	}
	js, err := encodeHeader(ts)
	if err != nil {
		return err
	}
	start := int64(8 + len(js))
	total := ts[len(ts)-1].End
	f, err := os.OpenFile(*out, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	var pre [8]byte
	binary.LittleEndian.PutUint64(pre[:], uint64(len(js)))
	if _, err := f.WriteAt(append(pre[:], js...), 0); err != nil {
		return err
	}
	t0 := time.Now()
	if err := writeData(f, start, total, *seed, ts); err != nil {
		return err
	}
	fmt.Printf("gen: %s: %d tensors, %d data bytes + %d header, %.1fs\n", *out, len(ts), total, start, time.Since(t0).Seconds())
	return nil
}

// encodeHeader is the JSON header of ts, padded with spaces so that the
// data section starts 8-aligned.
func encodeHeader(ts []tensor) ([]byte, error) {
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt", "generator": "phxbench-gpu"}}
	for _, t := range ts {
		hdr[t.Name] = map[string]any{"dtype": t.DType, "shape": t.Shape, "data_offsets": []int64{t.Begin, t.End}}
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return nil, err
	}
	for (8+len(js))%8 != 0 {
		js = append(js, ' ')
	}
	return js, nil
}

// writeData fills the data section, total bytes at start in f, 64 MiB
// blocks at a time on every CPU; the first write error wins.
func writeData(f *os.File, start, total int64, seed uint64, ts []tensor) error {
	const block = 64 * mib
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	sem := make(chan struct{}, runtime.NumCPU())
	for off := int64(0); off < total; off += block {
		wg.Add(1)
		sem <- struct{}{}
		go func(off int64) {
			defer wg.Done()
			defer func() { <-sem }()
			b := make([]byte, min(block, total-off))
			fill(b, off, seed, ts)
			if _, err := f.WriteAt(b, start+off); err != nil {
				select {
				case errc <- err:
				default:
				}
			}
		}(off)
	}
	wg.Wait()
	return firstErr(errc)
}

func parseSize(s string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "GiB"):
		mult, s = gib, strings.TrimSuffix(s, "GiB")
	case strings.HasSuffix(s, "MiB"):
		mult, s = mib, strings.TrimSuffix(s, "MiB")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mult, err
}

// readHeader parses a safetensors header: tensors in data order and the
// data section's start.
func readHeader(name string) ([]tensor, int64, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	var pre [8]byte
	if _, err := f.ReadAt(pre[:], 0); err != nil {
		return nil, 0, err
	}
	n := binary.LittleEndian.Uint64(pre[:])
	if n > 100<<20 {
		return nil, 0, fmt.Errorf("%s: header of %d bytes", name, n)
	}
	js := make([]byte, n)
	if _, err := f.ReadAt(js, 8); err != nil {
		return nil, 0, err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(js, &raw); err != nil {
		return nil, 0, err
	}
	var ts []tensor
	for k, v := range raw {
		if k == "__metadata__" {
			continue
		}
		var e struct {
			DType   string  `json:"dtype"`
			Shape   []int64 `json:"shape"`
			Offsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(v, &e); err != nil || len(e.Offsets) != 2 {
			return nil, 0, fmt.Errorf("%s: tensor %s: %v", name, k, err)
		}
		ts = append(ts, tensor{Name: k, DType: e.DType, Shape: e.Shape, Begin: e.Offsets[0], End: e.Offsets[1]})
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Begin < ts[j].Begin })
	return ts, 8 + int64(n), nil
}

package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestGenParse: parse reads back what gen wrote, tensors in file order,
// the data ending where the file does.
func TestGenParse(t *testing.T) {
	const size = 8 << 20
	names, ts := layout(size)
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := gen(path, size); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := parse(f)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.names, names) {
		t.Fatalf("parsed tensors %q, want %q", st.names, names)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if st.dataLen != ts[names[len(names)-1]].DataOffsets[1] || st.dataStart+st.dataLen != fi.Size() {
		t.Errorf("data [%d, +%d), file of %d bytes", st.dataStart, st.dataLen, fi.Size())
	}
}

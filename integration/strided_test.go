package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
)

// TestStridedThroughTheMount: a tensor-parallel rank's column slices of a
// row-major tensor, every rank of 8, each one BATCH_READ_STRIDED extent,
// through a real mount on both transports; then one rank writes its
// column back with BATCH_WRITE_STRIDED and the backing file shows it.
func TestStridedThroughTheMount(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
	}{{"host", nil}, {"staged", []string{"PHXMOUNT_EMU_STAGED=1"}}} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDaemon(t, withArgs("--vendor", "emu"), withEnv(tc.env...))
			const rows, rowBytes, world = 512, 8192, 8 // a bf16 [512, 4096]
			const slice = rowBytes / world
			data := writePattern(t, filepath.Join(d.Backing, "w"), rows*rowBytes, 0644)
			f := openClient(t, filepath.Join(d.Mnt, "w"), unix.O_RDWR)
			m := emuBuffer(t, 0, rows*rowBytes)
			b := register(t, f, m)
			ext := make([]client.Extent, world)
			for r := range ext {
				ext[r] = client.Extent{Buffer: b.ID, BufOffset: int64(r) * rows * slice, Len: slice,
					FileOffset: int64(r) * slice, Count: rows, FileStride: rowBytes, BufStride: slice}
			}
			failed, err := f.ReadStrided(ext)
			if err != nil || failed != 0 {
				t.Fatalf("ReadStrided = %d, %v (%+v)", failed, err, ext)
			}
			for r := 0; r < world; r++ {
				for row := 0; row < rows; row++ {
					got := m.Bytes()[r*rows*slice+row*slice:][:slice]
					if !bytes.Equal(got, data[row*rowBytes+r*slice:][:slice]) {
						t.Fatalf("rank %d row %d differs from the file", r, row)
					}
				}
			}
			// Rank 2 writes its column from a buffer of new bytes.
			fill(m.Bytes(), 0x5C)
			w := []client.Extent{{Buffer: b.ID, Len: slice, FileOffset: 2 * slice, Count: rows, FileStride: rowBytes, BufStride: slice}}
			if failed, err := f.WriteStrided(w); err != nil || failed != 0 || w[0].Result != rows*slice {
				t.Fatalf("WriteStrided = %d, %v, result %d", failed, err, w[0].Result)
			}
			for row := 0; row < rows; row++ {
				fill(data[row*rowBytes+2*slice:][:slice], 0x5C)
			}
			if got, err := os.ReadFile(filepath.Join(d.Backing, "w")); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("the backing file after the strided write differs")
			}
		})
	}
}

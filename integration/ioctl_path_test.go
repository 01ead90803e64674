package integration

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"phxmount/client"
)

// TestIoctlPath drives the ioctl data path of a real phxmount daemon on the
// emulated device, host-addressable and staged: single reads, batches over
// several files and buffers with unaligned and failing extents, a batch
// larger than one ioctl, writes — every byte checked against the file.
func TestIoctlPath(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       []string
		transport client.Transport
	}{
		{"host", nil, client.TransportHost},
		{"staged", []string{"PHXMOUNT_EMU_STAGED=1", "PHXMOUNT_EMU_DEVICES=2"}, client.TransportStaged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDaemon(t, withArgs("--vendor", "emu"), withEnv(tc.env...))
			sizes := []int64{5<<20 + 13, 1 << 20, 300001}
			var files [][]byte
			for i, sz := range sizes {
				files = append(files, writePattern(t, filepath.Join(d.Backing, fmt.Sprintf("f%d", i)), sz, 0644))
			}
			fs := make([]*client.File, len(sizes))
			for i := range fs {
				fs[i] = openClient(t, filepath.Join(d.Mnt, fmt.Sprintf("f%d", i)), unix.O_RDONLY)
			}
			in, err := fs[0].Info()
			if err != nil {
				t.Fatalf("INFO: %v", err)
			}
			if in.Transport != tc.transport || in.Vendor != "emu" || in.PageSize != 64<<10 {
				t.Fatalf("INFO = %+v", in)
			}
			if in.PassthroughWhy == "" || strings.HasPrefix(in.PassthroughWhy, "unknown") {
				t.Errorf("INFO does not report the passthrough state: %q", in.PassthroughWhy)
			}
			m1, m2 := emuBuffer(t, 0, 8<<20), emuBuffer(t, 0, 1<<20)
			b1, b2 := register(t, fs[0], m1), register(t, fs[1], m2)
			if b1.Transport != tc.transport || b1.ID == b2.ID || b1.Token == b2.Token {
				t.Fatalf("buffers %+v %+v", b1, b2)
			}

			// Single extents, unaligned, on several files.
			n, err := fs[0].Read(b1, 7, 3<<20+5, 1001)
			if err != nil || n != 3<<20+5 {
				t.Fatalf("READ = %d, %v", n, err)
			}
			if !bytes.Equal(m1.Bytes()[7:7+n], files[0][1001:1001+n]) || m1.Bytes()[6] != 0xA5 || m1.Bytes()[7+n] != 0xA5 {
				t.Fatalf("READ bytes differ from the file")
			}
			n, err = fs[2].Read(b2, 0, 1<<20, 0) // short: the file is 300001 bytes
			if err != nil || n != 300001 || !bytes.Equal(m2.Bytes()[:n], files[2]) {
				t.Fatalf("short READ = %d, %v", n, err)
			}

			// A batch per file, extents over both buffers, some failing.
			fill(m1.Bytes(), 0xA5)
			fill(m2.Bytes(), 0xA5)
			type want struct {
				mem  []byte
				file []byte
			}
			var checks []want
			for fi, f := range fs {
				var ext []client.Extent
				for j := int64(0); j < 20; j++ {
					bo := int64(fi)<<21 + j*65536 + j // unaligned, disjoint
					fo := (j * 12347) % (sizes[fi] - 5000)
					e := client.Extent{Buffer: b1.ID, BufOffset: bo, Len: 4000 + j, FileOffset: fo}
					if j%5 == 4 {
						e = client.Extent{Buffer: b2.ID, BufOffset: int64(fi)*300000 + j*1000, Len: 999, FileOffset: fo}
					}
					ext = append(ext, e)
				}
				ext = append(ext,
					client.Extent{Buffer: b2.ID, BufOffset: 1<<20 - 100, Len: 101, FileOffset: 0},    // past the buffer
					client.Extent{Buffer: 9999, Len: 1},                                              // unknown id
					client.Extent{Buffer: b1.ID, BufOffset: 7 << 20, Len: 4096, FileOffset: 1 << 40}, // past EOF: 0 bytes
				)
				failed, err := f.ReadBatch(ext)
				if err != nil || failed != 3 {
					t.Fatalf("file %d: ReadBatch = %d, %v", fi, failed, err)
				}
				for j, e := range ext[:20] {
					if e.Result != e.Len {
						t.Fatalf("file %d extent %d: %d of %d", fi, j, e.Result, e.Len)
					}
					m := m1
					if e.Buffer == b2.ID {
						m = m2
					}
					checks = append(checks, want{m.Bytes()[e.BufOffset : e.BufOffset+e.Len], files[fi][e.FileOffset : e.FileOffset+e.Len]})
				}
				if ext[20].Result != -int64(unix.EFAULT) || ext[21].Result != -int64(unix.ENOENT) || ext[22].Result != 0 {
					t.Fatalf("failing extents: %d %d %d", ext[20].Result, ext[21].Result, ext[22].Result)
				}
			}
			moved := 0
			for i, c := range checks {
				if !bytes.Equal(c.mem, c.file) {
					t.Fatalf("batch extent %d: bytes differ from the file", i)
				}
				moved += len(c.mem)
			}
			if got := len(m1.Bytes()) + len(m2.Bytes()) - bytes.Count(m1.Bytes(), []byte{0xA5}) - bytes.Count(m2.Bytes(), []byte{0xA5}); got > moved {
				t.Fatalf("%d bytes changed in the buffers, the extents moved %d", got, moved)
			}
			if !allBytes(m2.Bytes()[1<<20-100:], 0xA5) {
				t.Fatalf("the out-of-bounds extent moved bytes")
			}

			// 1,000 extents of 4 KiB: three ioctls (400, 400, 200 in the 400 class).
			fill(m1.Bytes(), 0xA5)
			ext := make([]client.Extent, 1000)
			for j := range ext {
				ext[j] = client.Extent{Buffer: b1.ID, BufOffset: int64(j) * 4096, Len: 4096, FileOffset: int64(999-j) * 4096}
			}
			failed, err := fs[0].ReadBatch(ext)
			if err != nil || failed != 0 {
				t.Fatalf("1000-extent batch: %d failed, %v", failed, err)
			}
			for j := range ext {
				if !bytes.Equal(m1.Bytes()[j*4096:(j+1)*4096], files[0][(999-j)*4096:(1000-j)*4096]) {
					t.Fatalf("1000-extent batch: extent %d differs", j)
				}
			}

			// Writes: a single WRITE and a batch, then the backing file.
			wpath := filepath.Join(d.Mnt, "w")
			wdata := writePattern(t, filepath.Join(d.Backing, "w"), 2<<20, 0644)
			w := openClient(t, wpath, unix.O_RDWR)
			for i := range m2.Bytes() {
				m2.Bytes()[i] = byte(i*7 + 1)
			}
			if n, err := w.Write(b2, 3, 100000, 5); err != nil || n != 100000 {
				t.Fatalf("WRITE = %d, %v", n, err)
			}
			copy(wdata[5:], m2.Bytes()[3:100003])
			wext := []client.Extent{
				{Buffer: b2.ID, BufOffset: 200000, Len: 65536, FileOffset: 1 << 20},
				{Buffer: b2.ID, BufOffset: 1<<20 - 1, Len: 2, FileOffset: 0},   // past the buffer
				{Buffer: b2.ID, BufOffset: 0, Len: 10, FileOffset: 2<<20 + 10}, // extends the file
			}
			if failed, err := w.WriteBatch(wext); err != nil || failed != 1 || wext[1].Result != -int64(unix.EFAULT) {
				t.Fatalf("WriteBatch = %d, %v, %+v", failed, err, wext)
			}
			copy(wdata[1<<20:], m2.Bytes()[200000:265536])
			wdata = append(wdata, make([]byte, 10)...)
			wdata = append(wdata, m2.Bytes()[:10]...)
			got, err := os.ReadFile(filepath.Join(d.Backing, "w"))
			if err != nil || !bytes.Equal(got, wdata) {
				t.Fatalf("backing file after writes differs (%d bytes, want %d; %v)", len(got), len(wdata), err)
			}

			// A second device (staged run only has two).
			if tc.name == "staged" {
				m3 := emuBuffer(t, 1, 1<<20)
				b3 := register(t, fs[1], m3)
				if n, err := fs[1].Read(b3, 0, 1<<20, 0); err != nil || n != 1<<20 || !bytes.Equal(m3.Bytes(), files[1]) {
					t.Fatalf("device 1 READ = %d, %v", n, err)
				}
			}

			// Deregister, then the id is dead.
			if err := fs[0].Deregister(b1); err != nil {
				t.Fatal(err)
			}
			if _, err := fs[0].Read(b1, 0, 1, 0); !errors.Is(err, unix.ENOENT) {
				t.Fatalf("READ after DEREGISTER: %v", err)
			}
			in, _ = fs[0].Info()
			c := in.Counters
			if c.ReleasedDeregister != 1 || c.BuffersRegistered < 2 || c.IoctlBytesRead == 0 || c.IoctlBytesWritten != 100000+65536+10 {
				t.Fatalf("counters %+v", c)
			}
			// Closing the file b2 was registered on releases it.
			fs[1].Close()
			if !waitFor(5e9, func() bool { in, _ = fs[0].Info(); return in.Counters.ReleasedClose >= 1 }) {
				t.Fatalf("closing the registering file did not release its buffer: %+v", in.Counters)
			}
			if _, err := fs[2].Read(b2, 0, 1, 0); !errors.Is(err, unix.ENOENT) {
				t.Fatalf("READ with a buffer whose file was closed: %v", err)
			}
		})
	}
}

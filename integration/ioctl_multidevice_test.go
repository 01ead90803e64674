package integration

import (
	"bytes"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"phxmount/client"
)

// TestIoctlSeveralDevices serves two emulated devices from one mount: two
// client processes, one per device, load the file at the same time, and
// one batch lands extents in buffers on both devices.
func TestIoctlSeveralDevices(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu", "--emu-devices", "2"))
	data := writePattern(t, filepath.Join(d.Backing, "weights"), 6<<20+4096+17, 0644)
	path := filepath.Join(d.Mnt, "weights")

	children := []*child{
		startChild(t, nil, "device", path, "0", "20"),
		startChild(t, nil, "device", path, "1", "20"),
	}
	for i, c := range children {
		if got := c.expect(t, "OK"); !strings.HasSuffix(got, "device "+strconv.Itoa(i)) {
			t.Fatalf("child on device %d: %q", i, got)
		}
	}

	f := openClient(t, path, unix.O_RDONLY)
	m0, m1 := emuBuffer(t, 0, 4<<20), emuBuffer(t, 1, 4<<20)
	b0, b1 := register(t, f, m0), register(t, f, m1)
	ext := []client.Extent{
		{Buffer: b0.ID, BufOffset: 0, Len: 3 << 20, FileOffset: 0},
		{Buffer: b1.ID, BufOffset: 5, Len: 3<<20 + 4096 + 17, FileOffset: 3 << 20},
		{Buffer: b1.ID, BufOffset: 4<<20 - 1, Len: 2, FileOffset: 0}, // past the buffer on device 1
	}
	failed, err := f.ReadBatch(ext)
	if err != nil || failed != 1 || ext[2].Result != -int64(unix.EFAULT) {
		t.Fatalf("ReadBatch = %d, %v, %+v", failed, err, ext)
	}
	if !bytes.Equal(m0.Bytes()[:3<<20], data[:3<<20]) || m0.Bytes()[3<<20] != 0xA5 {
		t.Fatal("device 0 bytes differ from the file")
	}
	if !bytes.Equal(m1.Bytes()[5:5+len(data)-3<<20], data[3<<20:]) || m1.Bytes()[4] != 0xA5 || m1.Bytes()[4<<20-1] != 0xA5 {
		t.Fatal("device 1 bytes differ from the file, or the refused extent moved bytes")
	}
}

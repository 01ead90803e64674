package fusefs

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
)

// What one ioctl may make the daemon allocate is bounded whatever its
// numbers (client.MaxPieces, docs/abi.md "Limits").

// allocated is the bytes the process allocated while fn ran.
func allocated(fn func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	fn()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// TestStridedBatchTooManyPieces: the batches that used to take the daemon
// down (a count of 2^32 on a made-up buffer id, written; 2^26 one-byte
// pieces read into a 64 MiB buffer) are refused as a whole with E2BIG,
// cost next to nothing, and move no byte; the largest batch allowed runs.
func TestStridedBatchTooManyPieces(t *testing.T) {
	e := newCtlEnv(t, false, false)
	f, data := patternFile(t, 1<<20, unix.O_RDWR)
	m := e.alloc(t, 64<<20)
	poison(m.Bytes())
	r := e.registered(t, f, m)
	const madeUp = 987654321
	for _, c := range []struct {
		name  string
		write bool
		reqs  []client.IOReq
	}{
		{"2^32 empty pieces written from a made-up buffer", true, []client.IOReq{{ID: madeUp, Count: 1 << 32}}},
		{"2^32 one-byte pieces written from a made-up buffer", true, []client.IOReq{{ID: madeUp, Length: 1, Count: 1 << 32, FileStride: 1, BufStride: 1}}},
		{"2^26 one-byte pieces read into 64 MiB", false, []client.IOReq{{ID: r.ID, Length: 1, Count: 1 << 26, FileStride: 1, BufStride: 1}}},
		{"MaxPieces + 1 over two extents", false, []client.IOReq{
			{ID: r.ID, Length: 1, Count: client.MaxPieces, FileStride: 2, BufStride: 1},
			{ID: r.ID, Length: 1, Count: 1, FileStride: 2, BufStride: 1}}},
	} {
		var got unix.Errno
		n := allocated(func() { got, _ = e.stridedErrno(t, f, c.write, c.reqs) })
		if got != unix.E2BIG {
			t.Errorf("%s: errno %v, want E2BIG", c.name, got)
		}
		if n > 1<<20 {
			t.Errorf("%s: the refusal allocated %d bytes", c.name, n)
		}
	}
	if !allA5(m.Bytes()) {
		t.Errorf("a refused batch moved bytes into the buffer")
	}
	got := make([]byte, len(data))
	if _, err := unix.Pread(f.Fd, got, 0); err != nil || !bytes.Equal(got, data) {
		t.Errorf("a refused batch changed the file (%v)", err)
	}
	if in := e.info(t, f); in.Counters.IoctlRejected != 4 || in.Counters.IoctlExtents != 0 {
		t.Errorf("counters: %d ioctls rejected, %d extents; want 4 and 0", in.Counters.IoctlRejected, in.Counters.IoctlExtents)
	}
}

// TestStridedEmptyPieces: more than one piece of length 0 is a bad extent
// (-EINVAL) that moves nothing, while its neighbours run.
func TestStridedEmptyPieces(t *testing.T) {
	e := newCtlEnv(t, false, false)
	f, data := patternFile(t, 64<<10, unix.O_RDWR)
	m := e.alloc(t, 1<<20)
	poison(m.Bytes())
	r := e.registered(t, f, m)
	for _, write := range []bool{false, true} {
		reqs := []client.IOReq{{ID: r.ID, Count: 1000}, {ID: r.ID, Length: 100, FileOffset: 8, Count: 1}}
		got, res := e.stridedErrno(t, f, write, reqs)
		if got != 0 || res[0] != -int64(unix.EINVAL) || res[1] != 100 {
			t.Errorf("write %v: errno %v, results %v; want -EINVAL and 100", write, got, res)
		}
	}
	if !bytes.Equal(m.Bytes()[:100], data[8:108]) {
		t.Errorf("the neighbour's bytes did not land")
	}
}

// TestStridedMadeUpBufferCostsNothing: the largest write allowed, on a
// buffer id no one registered, is refused per extent (-ENOENT) before any
// piece of it is made.
func TestStridedMadeUpBufferCostsNothing(t *testing.T) {
	e := newCtlEnv(t, false, false)
	f, _ := patternFile(t, 4096, unix.O_RDWR)
	reqs := []client.IOReq{{ID: 424242, Length: 1, Count: client.MaxPieces, FileStride: 1, BufStride: 1}}
	var got unix.Errno
	var res []int64
	n := allocated(func() { got, res = e.stridedErrno(t, f, true, reqs) })
	if got != 0 || res[0] != -int64(unix.ENOENT) {
		t.Fatalf("errno %v, results %v; want -ENOENT", got, res)
	}
	if n > 256<<10 {
		t.Errorf("refusing %d pieces of a made-up buffer allocated %d bytes: pieces were made before the buffer was looked up", client.MaxPieces, n)
	}
}

// TestStridedLargestBatchBounded: MaxPieces one-byte pieces, the most
// costly batch per byte there is, read and written, land every byte, and
// the daemon's allocation for each stays under the bound docs/abi.md
// gives ("Limits": under 1 KiB a piece; the staged write is the most
// costly, about 850 bytes a piece, the host read about 150).
func TestStridedLargestBatchBounded(t *testing.T) {
	for _, staged := range []bool{false, true} {
		e := newCtlEnv(t, staged, false)
		f, data := patternFile(t, 2*client.MaxPieces, unix.O_RDWR)
		m := e.alloc(t, 1<<20)
		mem := m.Bytes()
		poison(mem)
		r := e.registered(t, f, m)
		// Every other byte of the file into consecutive bytes of the buffer:
		// no two pieces join.
		reqs := []client.IOReq{{ID: r.ID, Length: 1, Count: client.MaxPieces, FileStride: 2, BufStride: 1}}
		var got unix.Errno
		var res []int64
		n := allocated(func() { got, res = e.stridedErrno(t, f, false, reqs) })
		if got != 0 || res[0] != client.MaxPieces {
			t.Fatalf("staged %v: read: errno %v, results %v", staged, got, res)
		}
		for j := 0; j < client.MaxPieces; j++ {
			if mem[j] != data[2*j] {
				t.Fatalf("staged %v: read: piece %d is %#x, want %#x", staged, j, mem[j], data[2*j])
			}
		}
		t.Logf("staged %v: a read of %d pieces allocated %d bytes (%d a piece)", staged, client.MaxPieces, n, n/client.MaxPieces)
		if n > 1024*client.MaxPieces {
			t.Errorf("staged %v: a read of %d pieces allocated %d bytes", staged, client.MaxPieces, n)
		}

		// Written back one byte in two, each byte incremented.
		for j := 0; j < client.MaxPieces; j++ {
			mem[j]++
		}
		reqs[0].FileOffset = 1
		n = allocated(func() { got, res = e.stridedErrno(t, f, true, reqs) })
		if got != 0 || res[0] != client.MaxPieces {
			t.Fatalf("staged %v: write: errno %v, results %v", staged, got, res)
		}
		file := make([]byte, len(data))
		unix.Pread(f.Fd, file, 0)
		for j := 0; j < client.MaxPieces; j++ {
			if file[2*j] != data[2*j] || file[2*j+1] != data[2*j]+1 {
				t.Fatalf("staged %v: write: bytes %d, %d are %#x %#x", staged, 2*j, 2*j+1, file[2*j], file[2*j+1])
			}
		}
		t.Logf("staged %v: a write of %d pieces allocated %d bytes (%d a piece)", staged, client.MaxPieces, n, n/client.MaxPieces)
		if n > 1024*client.MaxPieces {
			t.Errorf("staged %v: a write of %d pieces allocated %d bytes", staged, client.MaxPieces, n)
		}
	}
}

// TestEveryLimitHasItsErrno walks docs/abi.md's table of limits
// (client.Limits): for each, a request at the limit is served (or refused
// for another reason that shows the limit did not decide) and one past it
// gets the table's errno. A limit added to the table without a check here
// fails.
func TestEveryLimitHasItsErrno(t *testing.T) {
	e := newCtlEnv(t, false, false)
	f, _ := patternFile(t, 1<<20, unix.O_RDWR)
	m := e.alloc(t, 1<<20)
	r := e.registered(t, f, m)
	plain := func(n int) unix.Errno { // a batch of n one-byte extents, in a payload of capacity n
		reqs := make([]client.IOReq, n)
		for i := range reqs {
			reqs[i] = client.IOReq{ID: r.ID, BufOffset: uint64(i), Length: 1, FileOffset: uint64(i)}
		}
		b := make([]byte, client.BatchSize(n))
		if enc, err := client.EncodeBatch(min(n, client.MaxExtents), reqs[:min(n, client.MaxExtents)]); err == nil {
			copy(b, enc)
		}
		binary.LittleEndian.PutUint32(b[8:], uint32(n))
		_, errno := e.ioctl(e.me, f, client.CmdBatch(false, n), b)
		return unix.Errno(errno)
	}
	strided := func(n int) unix.Errno {
		reqs := make([]client.IOReq, min(n, client.MaxStridedExtents))
		for i := range reqs {
			reqs[i] = client.IOReq{ID: r.ID, BufOffset: uint64(i), Length: 1, FileOffset: uint64(i), Count: 1}
		}
		b := make([]byte, client.StridedBatchSize(n))
		enc, _ := client.EncodeStridedBatch(len(reqs), reqs)
		copy(b, enc)
		binary.LittleEndian.PutUint32(b[8:], uint32(n))
		_, errno := e.ioctl(e.me, f, client.CmdStridedBatch(false, n), b)
		return unix.Errno(errno)
	}
	pieces := func(n uint64) unix.Errno {
		got, _ := e.stridedErrno(t, f, false, []client.IOReq{{ID: r.ID, Length: 1, Count: n, FileStride: 1, BufStride: 1}})
		return got
	}
	read := func(off uint64) unix.Errno {
		_, errno := e.read(e.me, f, client.IOReq{ID: r.ID, Length: 0, FileOffset: off})
		return unix.Errno(errno)
	}
	device := func(dev uint32) unix.Errno {
		h, _ := m.Export()
		_, errno := e.ioctl(e.me, f, client.CmdRegister, client.EncodeRegister(client.RegisterReq{Vendor: client.VendorEmu, Device: dev, Size: 1 << 20, Handle: h}))
		_, ierrno := e.ioctl(e.me, f, client.CmdInfo, client.EncodeInfoReq(int32(dev)))
		if errno != ierrno {
			return unix.Errno(0xdead) // REGISTER and INFO disagree
		}
		return unix.Errno(errno)
	}
	load := func(n int) unix.Errno {
		v := "token=00000000000000000000000000000000,offset=0"
		v += strings.Repeat(" ", n-len(v))
		return unix.Errno(e.s.SetXattr(e.me, XattrTarget{Name: "pattern"}, XattrLoad, []byte(v)))
	}
	checks := map[string]struct {
		at, past         func() unix.Errno
		atWant, pastWant unix.Errno // what the request at the limit gets
	}{
		// The ioctl's size is 14 bits of the command: a capacity past the
		// largest does not fit it, and its size bits are not 16 + 40k.
		"max_ioctl_size":      {func() unix.Errno { return plain(client.MaxExtents) }, func() unix.Errno { return plain(client.MaxExtents + 1) }, 0, unix.EINVAL},
		"max_extents":         {func() unix.Errno { return plain(client.MaxExtents) }, func() unix.Errno { return plain(client.MaxExtents + 1) }, 0, unix.EINVAL},
		"max_strided_extents": {func() unix.Errno { return strided(client.MaxStridedExtents) }, func() unix.Errno { return strided(client.MaxStridedExtents + 1) }, 0, unix.EINVAL},
		"max_pieces":          {func() unix.Errno { return pieces(client.MaxPieces) }, func() unix.Errno { return pieces(client.MaxPieces + 1) }, 0, unix.E2BIG},
		"max_offset":          {func() unix.Errno { return read(client.MaxOffset) }, func() unix.Errno { return read(client.MaxOffset + 1) }, 0, unix.EINVAL},
		// Device 65,536 is asked about (the emu connector has one device).
		"max_device":     {func() unix.Errno { return device(client.MaxDevice) }, func() unix.Errno { return device(client.MaxDevice + 1) }, unix.ENODEV, unix.ENODEV},
		"max_load_value": {func() unix.Errno { return load(client.MaxLoadValue) }, func() unix.Errno { return load(client.MaxLoadValue + 1) }, unix.EKEYREJECTED, unix.EINVAL},
	}
	// The registration limits are mount options: TestMountLimits,
	// TestUserLimits and TestConcurrentRegistersKeepTheProcessLimit run at
	// and past them; here, that the control's defaults are the table's.
	options := map[string]int64{"max_buffers_per_process": int64(e.s.cfg.MaxBuffersPerProcess),
		"max_buffers_per_user": int64(e.s.cfg.MaxBuffersPerUser), "max_buffers": int64(e.s.cfg.MaxBuffers),
		"max_registered_bytes_per_user": e.s.cfg.MaxRegisteredBytesPerUser, "max_registered_bytes": e.s.cfg.MaxRegisteredBytes,
		"max_pieces_in_flight_per_user": e.s.cfg.MaxPiecesInFlightPerUser, "max_pieces_in_flight": e.s.cfg.MaxPiecesInFlight}
	for _, l := range client.Limits() {
		if v, ok := options[l.Name]; l.Option {
			if !ok || uint64(v) != l.Value {
				t.Errorf("option %s: the control's default is %d, the table's %d", l.Name, v, l.Value)
			}
			continue
		}
		c, ok := checks[l.Name]
		if !ok {
			t.Errorf("limit %s has no check here", l.Name)
			continue
		}
		if got := c.at(); got != c.atWant {
			t.Errorf("%s: at the limit: %v, want %v", l.Name, got, c.atWant)
		}
		if c.pastWant != l.Errno {
			t.Errorf("%s: the check wants %v past the limit, the table says %v", l.Name, c.pastWant, l.Errno)
		}
		if got := c.past(); got != l.Errno {
			t.Errorf("%s: past the limit: %v, want %v", l.Name, got, l.Errno)
		}
	}
}

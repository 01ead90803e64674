package integration

// The ioctl data path of a real daemon on the emulated device, and how it
// fails: single reads, batches and writes checked byte for byte, bad
// input refused with its errno, several devices from one mount, a client
// killed mid-batch, an unmount while busy, and the daemon killed while a
// writer is busy.
//
// Its helpers serve the xattr and control tests too: pattern files,
// emulated device buffers in the test process, and child processes (the
// test binary re-executed) that act as other clients.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/connector/emu"
)

// TestIoctlPath drives the ioctl data path of a real phxmount daemon on the
// emulated device, host-addressable and staged: single reads, batches over
// several files and buffers with unaligned and failing extents, a batch
// larger than one ioctl, writes — every byte checked against the file.
func TestIoctlPath(t *testing.T) {
	transports := []struct {
		name      string
		env       []string
		transport client.Transport
	}{
		{"host", nil, client.TransportHost},
		{"staged", []string{"PHXMOUNT_EMU_STAGED=1", "PHXMOUNT_EMU_DEVICES=2"}, client.TransportStaged},
	}
	for _, tc := range transports {
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

// TestIoctlBadInput: malformed and out-of-bounds requests, another process
// using a buffer id, writes on a read-only fd and mount, a read on a
// write-only fd by a user who may not read the file. Each gets its errno
// and moves no byte: the buffer stays poisoned and the file unchanged.
func TestIoctlBadInput(t *testing.T) {
	d, data, path := startEmuFile(t, 1<<20, "-o", "allow_other")
	f, m, b := openRegistered(t, path, 1<<20)

	raw := func(cmd uint32, payload []byte) error { return f.Ioctl(cmd, payload) }
	io := func(r client.IOReq) []byte { return client.EncodeIO(r) }
	badMagic := io(client.IOReq{ID: b.ID, Length: 4096})
	badMagic[0] ^= 0xff
	badVersion := io(client.IOReq{ID: b.ID, Length: 4096})
	badVersion[4] = 9
	resultSet := io(client.IOReq{ID: b.ID, Length: 4096})
	resultSet[40] = 1
	batchOver, _ := client.EncodeBatch(16, []client.IOReq{{ID: b.ID, Length: 1}})
	batchOver[8] = 17 // count past the capacity
	wrongSize := make([]byte, 40)
	for _, c := range []struct {
		name    string
		cmd     uint32
		payload []byte
		want    unix.Errno
	}{
		{"bad magic", client.CmdRead, badMagic, unix.EINVAL},
		{"bad version", client.CmdRead, badVersion, unix.EINVAL},
		{"result set on input", client.CmdRead, resultSet, unix.EINVAL},
		{"wrong size for READ", client.CmdRead&^(0x3fff<<16) | 40<<16, wrongSize, unix.EINVAL},
		{"batch count past capacity", client.CmdBatch(false, 16), batchOver, unix.EINVAL},
		{"unknown command", client.CmdRead&^0xff | 0x3f, make([]byte, 48), unix.ENOTTY},
		{"another type byte", 0xC0308803, make([]byte, 48), unix.ENOTTY},
		{"past the buffer", client.CmdRead, io(client.IOReq{ID: b.ID, BufOffset: 1<<20 - 4095, Length: 4096}), unix.EFAULT},
		{"buffer offset past the end", client.CmdRead, io(client.IOReq{ID: b.ID, BufOffset: 1 << 21, Length: 0}), unix.EFAULT},
		{"length wraps", client.CmdRead, io(client.IOReq{ID: b.ID, BufOffset: 4096, Length: 1<<63 - 4096}), unix.EFAULT},
		{"offset >= 2^63", client.CmdRead, io(client.IOReq{ID: b.ID, FileOffset: 1 << 63, Length: 1}), unix.EINVAL},
		{"unknown buffer", client.CmdRead, io(client.IOReq{ID: b.ID + 1000, Length: 1}), unix.ENOENT},
		{"write on O_RDONLY", client.CmdWrite, io(client.IOReq{ID: b.ID, Length: 4096}), unix.EBADF},
		{"register 4 KiB", client.CmdRegister, client.EncodeRegister(client.RegisterReq{Size: 4096}), unix.EINVAL},
		{"register nvidia handle", client.CmdRegister, client.EncodeRegister(client.RegisterReq{Vendor: client.VendorNvidia, Size: 65536}), unix.ENODEV},
		{"info device 9", client.CmdInfo, client.EncodeInfoReq(9), unix.ENODEV},
	} {
		err := raw(c.cmd, c.payload)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// The batch form of the same checks: per-extent errnos.
	ext := []client.Extent{
		{Buffer: b.ID, BufOffset: 1<<20 - 1, Len: 2},
		{Buffer: b.ID + 1000, Len: 1},
	}
	if failed, err := f.ReadBatch(ext); err != nil || failed != 2 || ext[0].Result != -int64(unix.EFAULT) || ext[1].Result != -int64(unix.ENOENT) {
		t.Errorf("failing batch: %d %v %+v", failed, err, ext)
	}
	if _, err := f.WriteBatch([]client.Extent{{Buffer: b.ID, Len: 1}}); !errors.Is(err, unix.EBADF) {
		t.Errorf("batch write on O_RDONLY: %v", err)
	}

	// Another process (the test binary re-executed) uses our buffer id.
	c := startChild(t, nil, "use", path, strconv.FormatUint(b.ID, 10))
	if got := c.expect(t, "READ"); got != "EPERM" {
		t.Errorf("another process's READ: %s, want EPERM", got)
	}
	if got := c.expect(t, "BATCH"); got != "OK -1" { // -EPERM
		t.Errorf("another process's batch: %s, want OK -1 (-EPERM)", got)
	}
	if got := c.expect(t, "DEREGISTER"); got != "EPERM" {
		t.Errorf("another process's DEREGISTER: %s, want EPERM", got)
	}
	// Nobody opens a file it may write but not read, registers its own
	// buffer and tries to read through it.
	secret := writePattern(t, filepath.Join(d.Backing, "secret"), 1<<20, 0622)
	nob := startChild(t, asUser(nobody), "wronly", filepath.Join(d.Mnt, "secret"))
	if got := nob.expect(t, "READ"); got != "EBADF BATCH EBADF UNTOUCHED true" {
		t.Errorf("nobody reading a 0622 file through a write-only fd: %s", got)
	}
	if _, err := os.Open(filepath.Join(d.Mnt, "secret")); err != nil {
		// root may; just a sanity check that the file is there
		t.Fatal(err)
	}

	// Nothing moved: our buffer is untouched (we never read into it) and
	// the files are unchanged.
	if !allBytes(m.Bytes(), 0xA5) {
		t.Errorf("a refused request moved bytes into the buffer")
	}
	if got, _ := os.ReadFile(filepath.Join(d.Backing, "f")); !bytes.Equal(got, data) {
		t.Errorf("the file changed")
	}
	if got, _ := os.ReadFile(filepath.Join(d.Backing, "secret")); !bytes.Equal(got, secret) {
		t.Errorf("the secret file changed")
	}
	// The buffer still works for its owner.
	if n, err := f.Read(b, 0, 4096, 8); err != nil || n != 4096 || !bytes.Equal(m.Bytes()[:4096], data[8:4104]) {
		t.Errorf("owner READ after the refusals: %d %v", n, err)
	}
}

// TestIoctlReadOnlyMount: a write ioctl on a read-only mount gets EROFS,
// whatever the descriptor, and the file is unchanged.
func TestIoctlReadOnlyMount(t *testing.T) {
	d, data, path := startEmuFile(t, 1<<20, "-o", "ro")
	f, m, b := openRegistered(t, path, 1<<20)
	fill(m.Bytes(), 0x11)
	if _, err := f.Write(b, 0, 4096, 0); !errors.Is(err, unix.EROFS) {
		t.Errorf("WRITE on a read-only mount: %v, want EROFS", err)
	}
	if _, err := f.WriteBatch([]client.Extent{{Buffer: b.ID, Len: 4096}}); !errors.Is(err, unix.EROFS) {
		t.Errorf("BATCH_WRITE on a read-only mount: %v, want EROFS", err)
	}
	if in, err := f.Info(); err != nil || !in.ReadOnly() {
		t.Errorf("INFO on a read-only mount: %+v %v", in, err)
	}
	if got, _ := os.ReadFile(filepath.Join(d.Backing, "f")); !bytes.Equal(got, data) {
		t.Errorf("the file changed")
	}
	// Reads still work.
	if n, err := f.Read(b, 0, 1<<20, 0); err != nil || n != 1<<20 || !bytes.Equal(m.Bytes(), data) {
		t.Errorf("READ on a read-only mount: %d %v", n, err)
	}
}

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
	// A client finds the mount's index of its device by PCI address, in
	// sysfs's or the CUDA driver's spelling.
	for want, pci := range []string{"0000:e0:00.0", "00000000:E0:01.0"} {
		if dev, err := f.DeviceByPCI(pci); dev != want || err != nil {
			t.Errorf("DeviceByPCI(%s) = %d, %v; want %d", pci, dev, err, want)
		}
	}
	if dev, err := f.DeviceByPCI("0000:e0:07.0"); !errors.Is(err, unix.ENODEV) {
		t.Errorf("DeviceByPCI of a device the mount does not have = %d, %v; want ENODEV", dev, err)
	}
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

// TestFaultClientKilledMidBatch: a client killed (SIGKILL) while its
// batches run has its buffers released; another client keeps being served
// the whole time, byte-exact. The client's file stays open in a process it
// started, so the release comes from the death of the registering process,
// not from the close of its file.
func TestFaultClientKilledMidBatch(t *testing.T) {
	d, data, mf := startEmuFile(t, 8<<20)
	f, m, b := openRegistered(t, mf, 4<<20)

	c := startChild(t, nil, "busy", mf)
	keeper, _ := strconv.Atoi(c.expect(t, "KEEPER"))
	if keeper > 0 {
		t.Cleanup(func() { syscall.Kill(keeper, syscall.SIGKILL) })
	}
	ids := strings.Fields(c.expect(t, "IDS"))
	c.expect(t, "BUSY")
	if got := infoCounter(t, d.Mnt, "buffers_live"); got != 3 {
		t.Fatalf("buffers_live = %d with the busy client, want 3", got)
	}

	// Our own reads run across the kill.
	var stop atomic.Bool
	var served atomic.Int64
	var bad atomic.Value
	reading := make(chan struct{})                 // closed when the reader stops
	defer func() { stop.Store(true); <-reading }() // before the buffer is unmapped
	go func() {
		defer close(reading)
		for i := int64(0); !stop.Load(); i++ {
			off := (i * 65536) % (4 << 20)
			n, err := f.Read(b, off, 65536, off+(1<<20))
			if err != nil || n != 65536 || !bytes.Equal(m.Bytes()[off:off+65536], data[off+(1<<20):off+(1<<20)+65536]) {
				bad.Store(errors.Join(err, errors.New("short or wrong bytes")))
				return
			}
			served.Add(1)
		}
	}()
	time.Sleep(100 * time.Millisecond)
	c.cmd.Process.Signal(syscall.SIGKILL)
	c.cmd.Wait()
	if !waitFor(10*time.Second, func() bool { return infoCounter(t, d.Mnt, "released_death") == 2 }) {
		t.Fatalf("the killed client's buffers %v were not released: %v", ids, phxInfo(t, d.Mnt))
	}
	before := served.Load()
	time.Sleep(100 * time.Millisecond)
	stop.Store(true)
	<-reading
	if v := bad.Load(); v != nil {
		t.Fatalf("the surviving client was not served correctly: %v", v)
	}
	if served.Load() <= before {
		t.Fatalf("the surviving client stopped being served after the kill")
	}
	if got := infoCounter(t, d.Mnt, "buffers_live"); got != 1 {
		t.Fatalf("buffers_live = %d after the kill, want 1", got)
	}
	if got := infoCounter(t, d.Mnt, "released_close"); got != 0 {
		t.Errorf("released_close = %d: the keeper still holds the file", got)
	}
	if d.Stderr() == "" || !strings.Contains(d.Stderr(), "died") {
		t.Errorf("the daemon did not log the release")
	}
}

type extentErr struct{ errno unix.Errno }

func (e extentErr) Error() string { return "extents failed with " + unix.ErrnoName(e.errno) }

// TestFaultUnmountWhileBusy: SIGTERM to the daemon while a client's batches
// run. The daemon exits, nothing stays mounted, and every batch the client
// saw complete carried the right bytes; the rest failed with an errno.
func TestFaultUnmountWhileBusy(t *testing.T) {
	d, data, path := startEmuFile(t, 8<<20)
	f, err := client.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	m := emuBuffer(t, 0, 4<<20)
	b := register(t, f, m)
	var ext []client.Extent
	for j := int64(0); j < 256; j++ {
		ext = append(ext, client.Extent{Buffer: b.ID, BufOffset: j << 14, Len: 1 << 14, FileOffset: (255 - j) << 14})
	}
	done := make(chan error, 1)
	var ok atomic.Int64
	go func() {
		for {
			fill(m.Bytes(), 0)
			failed, err := f.ReadBatch(ext)
			if err != nil {
				done <- err
				return
			}
			for j, e := range ext {
				switch {
				case e.Result == e.Len:
					if !bytes.Equal(m.Bytes()[e.BufOffset:e.BufOffset+e.Len], data[e.FileOffset:e.FileOffset+e.Len]) {
						done <- fmt.Errorf("wrong bytes in extent %d", j)
						return
					}
				case e.Result >= 0:
					done <- fmt.Errorf("extent %d: %d of %d bytes", j, e.Result, e.Len)
					return
				}
			}
			if failed != 0 {
				// The daemon released the buffer while shutting down: every
				// failing extent carries an errno.
				done <- extentErr{unix.Errno(-ext[len(ext)-1].Result)}
				return
			}
			ok.Add(1)
		}
	}()
	time.Sleep(200 * time.Millisecond)
	d.Signal(syscall.SIGTERM)
	// The open file keeps the mount busy: the daemon detaches it lazily and
	// later requests fail.
	var got error
	select {
	case got = <-done:
	case <-time.After(20 * time.Second):
		f.Close()
		t.Fatalf("the client's batches neither finished nor failed 20 s after SIGTERM")
	}
	f.Close()
	if ok.Load() == 0 {
		t.Errorf("no batch completed before the unmount")
	}
	var ce *client.Error
	var ee extentErr
	if !errors.As(got, &ce) && !errors.As(got, &ee) {
		t.Fatalf("the client ended with %v, want an errno from the ioctl or its extents", got)
	}
	if code, exited := d.WaitExit(15 * time.Second); !exited {
		t.Fatalf("the daemon did not exit after SIGTERM")
	} else if code != 0 {
		t.Errorf("daemon exit status %d", code)
	}
	if d.Mounted() {
		t.Errorf("%s is still mounted", d.Mnt)
	}
	t.Logf("%d batches completed before the unmount; the client then got %v", ok.Load(), got)
}

// TestKilledMidWrite: the daemon dies by SIGKILL while a writer is busy.
// Everything the writer had fsync'd is intact on the backing file, and after
// `umount -l` the same backing directory mounts again and reads the same.
func TestKilledMidWrite(t *testing.T) {
	eachPassthrough(t, func(t *testing.T, mode string, d *daemon) {
		p := filepath.Join(d.Mnt, "victim")
		const acked = 8 << 20
		data := pattern(acked, 9)
		f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		// Keep writing past the acknowledged part while the daemon dies.
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			junk := pattern(1<<20, 10)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := f.Write(junk); err != nil {
					return
				}
			}
		}()
		time.Sleep(100 * time.Millisecond)
		if err := d.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		d.WaitExit(10 * time.Second)
		close(stop)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Log("writer still blocked 10 s after the kill (its descriptor belongs to a dead connection)")
		}
		f.Close()
		got, err := os.ReadFile(filepath.Join(d.Backing, "victim"))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) < acked || !bytes.Equal(got[:acked], data) {
			t.Fatalf("backing file has %d bytes; the %d fsync'd bytes are not intact", len(got), acked)
		}
		runCmd(t, "umount", "-l", d.Mnt)
		d2 := startDaemon(t, withBacking(d.Backing), withMountpoint(d.Mnt), withArgs("--passthrough", mode))
		got2, err := os.ReadFile(filepath.Join(d2.Mnt, "victim"))
		if err != nil {
			t.Fatalf("read after remount: %v", err)
		}
		if !bytes.Equal(got2, got) {
			t.Fatalf("after remount the file reads %d bytes unlike the backing file's %d", len(got2), len(got))
		}
		compareTrees(t, d2.Backing, d2.Mnt)
	})
}

// The helpers of the ioctl, xattr, control and fault tests.

// writePattern writes a file whose every 8-byte little-endian word holds
// its own offset (the tail shorter than a word is 0xEE).
func writePattern(t testing.TB, path string, size int64, mode os.FileMode) []byte {
	t.Helper()
	b := patternBytes(size)
	if err := os.WriteFile(path, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return b
}

func patternBytes(size int64) []byte {
	b := make([]byte, size)
	for i := int64(0); i < size; i++ {
		b[i] = 0xEE
	}
	for i := int64(0); i+8 <= size; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(i))
	}
	return b
}

// emuDevice is the test process's view of the emulated device.
var emuConn = func() *emu.Connector {
	c, err := emu.New(emu.Config{Devices: 2})
	if err != nil {
		panic(err)
	}
	return c
}()

// emuBuffer allocates device memory on the emulated device dev, filled
// with 0xA5.
func emuBuffer(t testing.TB, dev int, size int64) *emu.Memory {
	t.Helper()
	m, err := emuConn.Alloc(dev, size)
	if err != nil {
		t.Fatal(err)
	}
	mem := m.(*emu.Memory)
	t.Cleanup(func() { mem.Close() })
	fill(mem.Bytes(), 0xA5)
	return mem
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

func allBytes(b []byte, v byte) bool { return bytes.Count(b, []byte{v}) == len(b) }

// register registers m through f.
func register(t testing.TB, f *client.File, m *emu.Memory) client.Buffer {
	t.Helper()
	h, err := m.Export()
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.Register(client.VendorEmu, m.Device(), h, m.Size())
	if err != nil {
		t.Fatalf("register %d bytes on device %d: %v", m.Size(), m.Device(), err)
	}
	return b
}

// openRegistered opens path read-only with the ioctl client and registers
// an emuBuffer of size bytes on device 0 through it.
func openRegistered(t testing.TB, path string, size int64) (*client.File, *emu.Memory, client.Buffer) {
	t.Helper()
	f := openClient(t, path, unix.O_RDONLY)
	m := emuBuffer(t, 0, size)
	return f, m, register(t, f, m)
}

func openClient(t testing.TB, path string, flags int) *client.File {
	t.Helper()
	f, err := client.OpenFile(path, flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// phxInfo reads user.phx.info of path into a map.
func phxInfo(t testing.TB, path string) map[string]string {
	t.Helper()
	buf := make([]byte, 8192)
	n, err := unix.Getxattr(path, "user.phx.info", buf)
	if err != nil {
		t.Fatalf("getxattr user.phx.info %s: %v", path, err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(buf[:n]), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = v
		}
	}
	return m
}

func infoCounter(t testing.TB, path, key string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(phxInfo(t, path)[key], 10, 64)
	if err != nil {
		t.Fatalf("user.phx.info %s: %q", key, phxInfo(t, path)[key])
	}
	return v
}

// waitFor polls cond for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// child is the test binary re-executed as another client process: it runs
// TestIoctlHelperChild with PHX_CHILD set to a mode, prints lines on stdout
// and reads commands on stdin.
type child struct {
	cmd   *exec.Cmd
	out   *bufio.Reader
	in    io.WriteCloser
	lines chan string
}

func startChild(t testing.TB, cred *syscall.Credential, mode string, args ...string) *child {
	t.Helper()
	return startChildTest(t, "TestIoctlHelperChild", cred, mode, args...)
}

// startChildTest re-executes the test binary to run test (a helper that
// reads PHX_CHILD and PHX_CHILD_ARGS) as cred (nil: as this process).
func startChildTest(t testing.TB, test string, cred *syscall.Credential, mode string, args ...string) *child {
	t.Helper()
	var attr *syscall.SysProcAttr
	if cred != nil {
		attr = &syscall.SysProcAttr{Credential: cred}
	}
	return startChildProc(t, test, attr, mode, args...)
}

// testBinary is this test binary's path; forOthers: a copy of it named
// name in a world-readable directory, which another user can run.
func testBinary(t testing.TB, forOthers bool, name string) string {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if !forOthers {
		return bin
	}
	dir := t.TempDir()
	os.Chmod(dir, 0755)
	os.Chmod(filepath.Dir(dir), 0755)
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(dir, name)
	if err := os.WriteFile(bin, b, 0755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// startChildProc is startChildTest with the child's process attributes
// (credentials, namespaces; nil: as this process).
func startChildProc(t testing.TB, test string, attr *syscall.SysProcAttr, mode string, args ...string) *child {
	t.Helper()
	bin := testBinary(t, attr != nil, "child.test")
	cmd := exec.Command(bin, "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PHX_CHILD="+mode, "PHX_CHILD_ARGS="+strings.Join(args, "\x1f"))
	cmd.Dir = "/"
	cmd.SysProcAttr = attr
	stdout, _ := cmd.StdoutPipe()
	stdin, _ := cmd.StdinPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, in: stdin, lines: make(chan string, 100)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return c
}

// expect returns the child's next line that starts with prefix.
func (c *child) expect(t testing.TB, prefix string) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("child exited before printing %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return strings.TrimSpace(strings.TrimPrefix(l, prefix))
			}
		case <-timeout:
			t.Fatalf("child printed no %q in 30 s", prefix)
		}
	}
}

func errnoName(err error) string {
	if err == nil {
		return "OK"
	}
	var e unix.Errno
	if ce, ok := err.(*client.Error); ok {
		e = ce.Errno
	} else if en, ok := err.(unix.Errno); ok {
		e = en
	} else {
		return "ERR(" + err.Error() + ")"
	}
	return unix.ErrnoName(e)
}

// TestIoctlHelperChild is the body of child processes; it skips when run
// normally.
func TestIoctlHelperChild(t *testing.T) {
	mode := os.Getenv("PHX_CHILD")
	if mode == "" {
		t.Skip("helper process for the ioctl/fault tests (runs only when re-executed)")
	}
	args := strings.Split(os.Getenv("PHX_CHILD_ARGS"), "\x1f")
	say := func(format string, a ...any) { fmt.Printf(format+"\n", a...) }
	defer os.Exit(0)
	switch mode {
	case "use": // args: path, buffer id — use another process's buffer
		f, err := client.Open(args[0])
		if err != nil {
			say("OPEN %s", errnoName(err))
			return
		}
		id, _ := strconv.ParseUint(args[1], 10, 64)
		_, err = f.Read(client.Buffer{ID: id}, 0, 4096, 0)
		say("READ %s", errnoName(err))
		ext := []client.Extent{{Buffer: id, Len: 4096}}
		_, err = f.ReadBatch(ext)
		say("BATCH %s %d", errnoName(err), ext[0].Result)
		say("DEREGISTER %s", errnoName(f.DeregisterID(id)))
	case "wronly": // args: path — open write-only, register, try to read
		f, err := client.OpenFile(args[0], unix.O_WRONLY)
		if err != nil {
			say("OPEN %s", errnoName(err))
			return
		}
		conn, _ := emu.New(emu.Config{})
		m, _ := conn.Alloc(0, 1<<20)
		fill(m.(*emu.Memory).Bytes(), 0xA5)
		h, _ := m.Export()
		b, err := f.Register(client.VendorEmu, 0, h, 1<<20)
		if err != nil {
			say("REGISTER %s", errnoName(err))
			return
		}
		_, err = f.Read(b, 0, 4096, 0)
		ext := []client.Extent{{Buffer: b.ID, Len: 4096}}
		_, berr := f.ReadBatch(ext)
		say("READ %s BATCH %s UNTOUCHED %v", errnoName(err), errnoName(berr), allBytes(m.(*emu.Memory).Bytes(), 0xA5))
	case "device": // args: path, device, rounds — load the file onto one device, again and again
		dev, _ := strconv.Atoi(args[1])
		rounds, _ := strconv.Atoi(args[2])
		want, err := os.ReadFile(args[0])
		if err != nil {
			say("READFILE %v", err)
			return
		}
		f, err := client.Open(args[0])
		if err != nil {
			say("OPEN %s", errnoName(err))
			return
		}
		conn, _ := emu.New(emu.Config{Devices: dev + 1})
		size := (int64(len(want)) + 64<<10 - 1) &^ (64<<10 - 1)
		m, err := conn.Alloc(dev, size)
		if err != nil {
			say("ALLOC %v", err)
			return
		}
		h, _ := m.Export()
		b, err := f.Register(client.VendorEmu, dev, h, size)
		if err != nil {
			say("REGISTER %s", errnoName(err))
			return
		}
		mem := m.(*emu.Memory).Bytes()
		for r := 0; r < rounds; r++ {
			fill(mem, 0xA5)
			var ext []client.Extent
			for off := int64(0); off < int64(len(want)); off += 256 << 10 {
				ext = append(ext, client.Extent{Buffer: b.ID, BufOffset: off, Len: min(256<<10, int64(len(want))-off), FileOffset: off})
			}
			if failed, err := f.ReadBatch(ext); err != nil || failed != 0 {
				say("BAD round %d: %d failed, %s", r, failed, errnoName(err))
				return
			}
			if !bytes.Equal(mem[:len(want)], want) {
				say("BAD round %d: bytes differ", r)
				return
			}
		}
		say("OK %d rounds on device %d", rounds, dev)
	case "write": // args: path, "syscall" or "ioctl", offset, length, RLIMIT_FSIZE (-1: none)
		off, _ := strconv.ParseInt(args[2], 10, 64)
		n, _ := strconv.ParseInt(args[3], 10, 64)
		data := bytes.Repeat([]byte{0x5A}, int(n))
		var write func() (int64, error)
		if args[1] == "syscall" {
			write = func() (int64, error) {
				fd, err := unix.Open(args[0], unix.O_WRONLY, 0)
				if err != nil {
					return 0, err
				}
				defer unix.Close(fd)
				m, err := unix.Pwrite(fd, data, off)
				return int64(m), err
			}
		} else {
			var err error
			// The buffer is made before the limit applies: a memfd is a file.
			if write, err = childIoctlWriter(args[0], data, off); err != nil {
				say("SETUP %s", errnoName(err))
				return
			}
		}
		if lim, _ := strconv.ParseInt(args[4], 10, 64); lim >= 0 {
			if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: uint64(lim), Max: uint64(lim)}); err != nil {
				say("SETRLIMIT %v", err)
				return
			}
		}
		// Go ignores SIGXFSZ unless asked: catch it to see whether it came.
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGXFSZ)
		got, err := write()
		if err != nil {
			got = 0
		}
		xfsz := "no"
		if args[4] != "-1" {
			select {
			case <-sig:
				xfsz = "yes"
			case <-time.After(200 * time.Millisecond):
			}
		}
		say("WRITE %s %d SIGXFSZ %s", errnoName(err), got, xfsz)
	case "busy": // args: path — register two buffers and read in a loop until killed
		f, err := client.Open(args[0])
		if err != nil {
			say("OPEN %s", errnoName(err))
			return
		}
		conn, _ := emu.New(emu.Config{})
		var ext []client.Extent
		var ids []string
		for i := 0; i < 2; i++ {
			m, _ := conn.Alloc(0, 4<<20)
			h, _ := m.Export()
			b, err := f.Register(client.VendorEmu, 0, h, 4<<20)
			if err != nil {
				say("REGISTER %s", errnoName(err))
				return
			}
			ids = append(ids, strconv.FormatUint(b.ID, 10))
			for j := int64(0); j < 256; j++ {
				ext = append(ext, client.Extent{Buffer: b.ID, BufOffset: j << 14, Len: 1 << 14, FileOffset: j << 14})
			}
		}
		// Keep the open file alive in another process: the release must
		// then come from this process's death.
		keeper := exec.Command("sleep", "60")
		keeper.ExtraFiles = []*os.File{os.NewFile(uintptr(f.Fd()), "f")}
		if err := keeper.Start(); err != nil {
			say("KEEPER %v", err)
			return
		}
		say("KEEPER %d", keeper.Process.Pid)
		say("IDS %s", strings.Join(ids, " "))
		for n := 0; ; n++ {
			if _, err := f.ReadBatch(ext); err != nil {
				say("BATCHERR %s", errnoName(err))
				time.Sleep(10 * time.Millisecond)
			}
			if n == 2 {
				say("BUSY")
			}
		}
	}
}

// childIoctlWriter prepares an ioctl WRITE of data at off of path from an
// emulated device buffer of this process, and returns it.
func childIoctlWriter(path string, data []byte, off int64) (func() (int64, error), error) {
	f, err := client.OpenFile(path, unix.O_WRONLY)
	if err != nil {
		return nil, err
	}
	conn, _ := emu.New(emu.Config{})
	size := (int64(len(data)) + 64<<10 - 1) &^ (64<<10 - 1)
	m, err := conn.Alloc(0, max(size, 64<<10))
	if err != nil {
		return nil, err
	}
	copy(m.(*emu.Memory).Bytes(), data)
	h, _ := m.Export()
	b, err := f.Register(client.VendorEmu, 0, h, m.Size())
	if err != nil {
		return nil, err
	}
	return func() (int64, error) { return f.Write(b, 0, int64(len(data)), off) }, nil
}

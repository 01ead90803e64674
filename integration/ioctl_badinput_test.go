package integration

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"phxmount/client"
)

// TestIoctlBadInput: malformed and out-of-bounds requests, another process
// using a buffer id, writes on a read-only fd and mount, a read on a
// write-only fd by a user who may not read the file. Each gets its errno
// and moves no byte: the buffer stays poisoned and the file unchanged.
func TestIoctlBadInput(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu", "-o", "allow_other"))
	data := writePattern(t, filepath.Join(d.Backing, "f"), 1<<20, 0644)
	f := openClient(t, filepath.Join(d.Mnt, "f"), unix.O_RDONLY)
	m := emuBuffer(t, 0, 1<<20)
	b := register(t, f, m)

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
	c := startChild(t, nil, "use", filepath.Join(d.Mnt, "f"), strconv.FormatUint(b.ID, 10))
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
	nob := startChild(t, &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}, "wronly", filepath.Join(d.Mnt, "secret"))
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
	d := startDaemon(t, withArgs("--vendor", "emu", "-o", "ro"))
	data := writePattern(t, filepath.Join(d.Backing, "f"), 1<<20, 0644)
	f := openClient(t, filepath.Join(d.Mnt, "f"), unix.O_RDONLY)
	m := emuBuffer(t, 0, 1<<20)
	b := register(t, f, m)
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

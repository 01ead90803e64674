package nvidia

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
)

func TestFakeIPCHandleByValue(t *testing.T) {
	c, f := withFake(t)
	m, err := c.Alloc(1, 3<<20)
	if err != nil {
		t.Fatal(err)
	}
	h, err := m.Export()
	if err != nil {
		t.Fatal(err)
	}
	im, err := c.Import(1, h, 2<<20, 4242)
	if err != nil {
		t.Fatal(err)
	}
	// The driver saw exactly the 64 bytes, passed by value, and the flag.
	if f.openHandle.Reserved != h || f.openFlags != cuIpcMemLazyEnablePeerAcc {
		t.Fatalf("cuIpcOpenMemHandle_v2 got %x flags %#x, want %x flags 1", f.openHandle.Reserved, f.openFlags, h)
	}
	if im.Addr() != m.Addr() || im.Size() != 2<<20 || im.Device() != 1 {
		t.Fatalf("imported %#x+%d on %d", im.Addr(), im.Size(), im.Device())
	}
	if err := im.Close(); err != nil {
		t.Fatal(err)
	}
	// More than the allocation is refused and the mapping closed again.
	if _, err := c.Import(1, h, 4<<20, 0); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("import beyond the allocation: %v", err)
	}
	if f.ipcOpen != f.ipcClose {
		t.Errorf("%d opens, %d closes", f.ipcOpen, f.ipcClose)
	}
	var bad connector.Handle
	_, err = c.Import(0, bad, 4096, 0)
	var ce *CUDAError
	if !errors.As(err, &ce) || ce.Func != "cuIpcOpenMemHandle_v2" || ce.Name != "CUDA_ERROR_INVALID_VALUE" {
		t.Fatalf("garbage handle: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Export(); !errors.Is(err, unix.EBADF) {
		t.Errorf("Export after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestFakeResolve(t *testing.T) {
	c, _ := withFake(t)
	m, err := c.Alloc(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ok := [][2]uint64{{0, 1 << 20}, {4096, 4096}, {1<<20 - 1, 1}}
	for _, r := range ok {
		if host, err := c.Resolve(0, m.Addr()+r[0], int64(r[1])); err != nil || host != 0 {
			t.Errorf("Resolve(+%d, %d) = %#x, %v", r[0], r[1], host, err)
		}
	}
	bad := []struct {
		dev       int
		addr      uint64
		size      int64
		wantErrno unix.Errno
	}{
		{0, m.Addr(), 1<<20 + 1, unix.EFAULT},
		{0, m.Addr() + 1<<20, 1, unix.EFAULT},
		{0, m.Addr() - 1, 2, unix.EFAULT},
		{1, m.Addr(), 4096, unix.EFAULT}, // memory of device 0
		{0, 0x1000, 4096, unix.EFAULT},   // not CUDA memory
		{2, m.Addr(), 4096, unix.ENODEV},
	}
	for _, b := range bad {
		if _, err := c.Resolve(b.dev, b.addr, b.size); !errors.Is(err, b.wantErrno) {
			t.Errorf("Resolve(%d, %#x, %d) = %v, want %v", b.dev, b.addr, b.size, err, b.wantErrno)
		}
	}
}

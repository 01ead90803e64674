package nvidia

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
)

// Tests on the real driver. They skip where libcuda.so.1 is absent; the
// fake-driver tests cover the same paths there.

const ipcEnv = "PHX_NVIDIA_IPC_CHILD" // "hex handle,size" for the child process

func gpu(t *testing.T) *Connector {
	t.Helper()
	if ok, err := haveLibcuda(); !ok {
		t.Skipf("no libcuda.so.1: %v", err)
	}
	c, err := Open()
	if errors.Is(err, unix.ENODEV) {
		t.Skipf("no usable NVIDIA GPU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

func closeT(t *testing.T, c interface{ Close() error }) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Error(err)
	}
}

// devMem, pinned and stream make n bytes of device 0's memory, n bytes of
// pinned host memory and a stream on device 0; each is closed, checked,
// when the test ends (before the connector).
func devMem(t *testing.T, c *Connector, n int64) connector.Memory {
	t.Helper()
	m, err := c.Alloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeT(t, m) })
	return m
}

func pinned(t *testing.T, c *Connector, n int64) connector.HostMemory {
	t.Helper()
	h, err := c.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeT(t, h) })
	return h
}

func stream(t *testing.T, c *Connector) connector.Stream {
	t.Helper()
	s, err := c.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeT(t, s) })
	return s
}

// holds says whether m starts with want, read back with CopyToHost.
func holds(t *testing.T, c *Connector, m connector.Memory, want []byte) bool {
	t.Helper()
	got := make([]byte, len(want))
	if err := c.CopyToHost(got, m.Addr(), 0); err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(got, want)
}

func TestGPUDevices(t *testing.T) {
	c := gpu(t)
	devs, err := c.Devices()
	if err != nil || len(devs) == 0 {
		t.Fatalf("devices %v, %v", devs, err)
	}
	pci := regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
	for i, d := range devs {
		t.Logf("device %d: %q at %s, %d MiB, page %d", d.Index, d.Name, d.PCIAddress, d.MemoryBytes>>20, d.PageSize)
		if d.Index != i || d.Name == "" || !pci.MatchString(d.PCIAddress) || d.PageSize != 65536 || d.MemoryBytes < 1<<30 {
			t.Errorf("device %d: %+v", i, d)
		}
	}
}

func TestGPURoundTrip(t *testing.T) {
	c := gpu(t)
	const n = 4<<20 + 123
	m := devMem(t, c, n)
	want := pattern(n, 0x3c)
	if err := c.CopyToDeviceSync(0, m.Addr(), want); err != nil {
		t.Fatal(err)
	}
	if !holds(t, c, m, want) {
		t.Fatal("host-to-device-to-host bytes differ")
	}
	// Memset a middle range, then read back an unaligned window around it.
	if err := c.Memset(0, m.Addr()+1000, 0xa5, 5000); err != nil {
		t.Fatal(err)
	}
	for i := 1000; i < 6000; i++ {
		want[i] = 0xa5
	}
	win := make([]byte, 7001)
	if err := c.CopyToHost(win, m.Addr()+7, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(win, want[7:7+len(win)]) {
		t.Fatal("bytes differ after memset")
	}
}

func TestGPUStreamPinned(t *testing.T) {
	c := gpu(t)
	const chunk, chunks = 4 << 20, 4
	m := devMem(t, c, chunk*chunks)
	src := pinned(t, c, chunk*chunks)
	dst := pinned(t, c, chunk*chunks)
	copy(src.Bytes(), pattern(chunk*chunks, 0x77))
	s := stream(t, c)
	for i := range chunks {
		if err := s.CopyToDevice(m.Addr()+uint64(i*chunk), src.Bytes()[i*chunk:(i+1)*chunk]); err != nil {
			t.Fatal(err)
		}
	}
	goMem := make([]byte, chunk)
	if err := s.CopyFromDevice(dst.Bytes(), m.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyFromDevice(goMem, m.Addr()+chunk); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("pinned stream round trip differs")
	}
	if !bytes.Equal(goMem, src.Bytes()[chunk:2*chunk]) {
		t.Fatal("pageable stream copy differs")
	}
	if err := c.Close(); !errors.Is(err, unix.EBUSY) {
		t.Errorf("Close with live memory: %v", err)
	}
}

// TestGPUConcurrentStreams has goroutines, each with a stream, copy into
// their own region: calls land on whatever threads, each must find the
// context current.
func TestGPUConcurrentStreams(t *testing.T) {
	c := gpu(t)
	const g, n = 6, 2 << 20
	m := devMem(t, c, g*n)
	errc := make(chan error, g)
	for i := range g {
		go func() {
			errc <- func() error {
				s, err := c.NewStream(0)
				if err != nil {
					return err
				}
				defer s.Close()
				want := pattern(n, byte(i))
				got := make([]byte, n)
				for range 20 {
					dst := m.Addr() + uint64(i*n)
					if err := s.CopyToDevice(dst, want); err != nil {
						return err
					}
					if err := s.CopyFromDevice(got, dst); err != nil {
						return err
					}
					if err := s.Synchronize(); err != nil {
						return err
					}
					if !bytes.Equal(got, want) {
						return fmt.Errorf("goroutine %d: bytes differ", i)
					}
				}
				return nil
			}()
		}()
	}
	for range g {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

func TestGPUCopyRate(t *testing.T) {
	c := gpu(t)
	const n = 256 << 20
	m := devMem(t, c, n)
	h := pinned(t, c, n)
	s := stream(t, c)
	const chunk = 4 << 20
	for round := range 3 {
		start := time.Now()
		for off := 0; off < n; off += chunk {
			if err := s.CopyToDevice(m.Addr()+uint64(off), h.Bytes()[off:off+chunk]); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		d := time.Since(start)
		t.Logf("round %d: 256 MiB pinned host-to-device in 4 MiB async copies: %.1f GB/s (%.1f us per enqueue+copy)",
			round, float64(n)/d.Seconds()/1e9, float64(d.Microseconds())/float64(n/chunk))
	}
}

func TestGPUResolve(t *testing.T) {
	c := gpu(t)
	const n = 4 << 20 // a multiple of the 2 MiB allocation granule
	m := devMem(t, c, n)
	a, err := c.attrs(0, m.Addr()+100)
	t.Logf("attributes of +100: %+v (alloc %#x), %v", a, m.Addr(), err)
	for _, r := range [][2]int64{{0, n}, {100, 4096}, {n - 1, 1}} {
		if host, err := c.Resolve(0, m.Addr()+uint64(r[0]), r[1]); err != nil || host != 0 {
			t.Errorf("Resolve(+%d, %d) = %#x, %v", r[0], r[1], host, err)
		}
	}
	h := pinned(t, c, 4096)
	goMem := make([]byte, 4096)
	for _, b := range []struct {
		what string
		addr uint64
		size int64
	}{
		{"one byte past the end", m.Addr(), n + 1},
		{"starting at the end", m.Addr() + n, 1},
		{"one byte before", m.Addr() - 1, 2},
		{"pinned host memory", uint64(uintptr(unsafe.Pointer(&h.Bytes()[0]))), 4096},
		{"Go memory", uint64(uintptr(unsafe.Pointer(&goMem[0]))), 4096},
		{"address 0x1000", 0x1000, 4096},
	} {
		_, err := c.Resolve(0, b.addr, b.size)
		if !errors.Is(err, unix.EFAULT) {
			t.Errorf("Resolve %s: %v, want EFAULT", b.what, err)
		} else {
			t.Logf("Resolve %s: %v", b.what, err)
		}
	}
	if devs, _ := c.Devices(); len(devs) > 1 {
		if _, err := c.Resolve(1, m.Addr(), 4096); !errors.Is(err, unix.EFAULT) {
			t.Errorf("Resolve on another device: %v", err)
		}
	}
}

func TestGPUErrors(t *testing.T) {
	c := gpu(t)
	_, err := c.Alloc(0, 1<<50)
	var ce *CUDAError
	if !errors.As(err, &ce) || ce.Name != "CUDA_ERROR_OUT_OF_MEMORY" || !errors.Is(err, unix.ENOMEM) ||
		!strings.HasPrefix(err.Error(), "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (") {
		t.Fatalf("1 PiB alloc: %v", err)
	}
	t.Logf("1 PiB alloc: %v", err)
	_, err = c.Import(0, connector.Handle{}, 4096, 0)
	if !errors.As(err, &ce) || !strings.HasPrefix(ce.Name, "CUDA_ERROR_") || ce.Func != c.d.cuIpcOpenMemHandle.name {
		t.Fatalf("import of a zero handle: %v", err)
	}
	t.Logf("import of a zero handle: %v", err)
	// The context still works after those errors.
	m, err := c.Alloc(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, m)
}

// TestGPUIPC exports memory on every GPU and has a child process (this
// test binary again) import it on the same GPU, check the parent's bytes
// and write its own: the daemon imports buffers of any GPU, not only the
// first.
func TestGPUIPC(t *testing.T) {
	c := gpu(t)
	devs, _ := c.Devices()
	for _, d := range devs {
		t.Run(fmt.Sprintf("device%d", d.Index), func(t *testing.T) { ipcRoundTrip(t, c, d.Index) })
	}
	if len(devs) < 2 {
		t.Logf("one GPU: the import on a second GPU did not run")
	}
}

func ipcRoundTrip(t *testing.T, c *Connector, dev int) {
	const n = 3 << 20
	m, err := c.Alloc(dev, n)
	if err != nil {
		t.Fatal(err)
	}
	defer closeT(t, m)
	if err := c.CopyToDeviceSync(dev, m.Addr(), pattern(n, 0x11)); err != nil {
		t.Fatal(err)
	}
	h, err := m.Export()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestGPUIPCChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%d", ipcEnv, hex.EncodeToString(h[:]), n, dev))
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	if err != nil || !strings.Contains(string(out), "--- PASS: TestGPUIPCChild") {
		t.Fatalf("child: %v", err)
	}
	got := make([]byte, n)
	if err := c.CopyToHost(got, m.Addr(), dev); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, pattern(n, 0x22)) {
		t.Fatal("the child's bytes are not in the parent's memory")
	}
}

// TestGPUIPCChild is the child half of TestGPUIPC.
func TestGPUIPCChild(t *testing.T) {
	arg := os.Getenv(ipcEnv)
	if arg == "" {
		t.Skip("child of TestGPUIPC only")
	}
	f := strings.Split(arg, ",")
	raw, err := hex.DecodeString(f[0])
	if len(f) != 3 || err != nil || len(raw) != connector.HandleSize {
		t.Fatalf("bad %s=%q", ipcEnv, arg)
	}
	n, _ := strconv.Atoi(f[1])
	dev, _ := strconv.Atoi(f[2])
	c := gpu(t)
	var h connector.Handle
	copy(h[:], raw)
	if _, err := c.Import(dev, h, int64(n)+(4<<20), os.Getppid()); !errors.Is(err, unix.EINVAL) {
		t.Errorf("import of more than was exported: %v, want EINVAL", err)
	}
	m, err := c.Import(dev, h, int64(n), os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	defer closeT(t, m)
	t.Logf("imported %#x+%d on device %d", m.Addr(), m.Size(), dev)
	if _, err := c.Resolve(dev, m.Addr()+4096, int64(n)-4096); err != nil {
		t.Errorf("Resolve inside the import: %v", err)
	}
	got := make([]byte, n)
	if err := c.CopyToHost(got, m.Addr(), dev); err != nil || !bytes.Equal(got, pattern(n, 0x11)) {
		t.Fatalf("imported memory does not hold the parent's bytes (%v)", err)
	}
	if err := c.CopyToDeviceSync(dev, m.Addr(), pattern(n, 0x22)); err != nil {
		t.Fatal(err)
	}
}

// TestGPUKernelPast4GiB is TestFakeKernelPiecesPast4GiB on the real
// kernel: a scatter and a gather whose span, one piece's offset and one
// piece's length pass 4 GiB land every byte (PHX_SCATTER=kernel).
func TestGPUKernelPast4GiB(t *testing.T) {
	c := gpu(t)
	if err := c.SetScatter("kernel"); err != nil {
		t.Fatal(err)
	}
	const big = 4<<30 + 4096 // the long piece: past 4 GiB, a multiple of 16
	const odd = 4096 + 3     // the far piece: the kernel's byte path
	host := pinned(t, c, big+8192+odd)
	m := devMem(t, c, big+(1<<20))
	ps := []connector.Piece{
		{Off: 0, Len: big, Dev: m.Addr() + 65536},
		{Off: big + 8192, Len: odd, Dev: m.Addr()},
	}
	b := host.Bytes()
	for i := 0; i < len(b); i += 4096 {
		b[i] = byte(i>>12) ^ 0x5a
	}
	b[big+8192+odd-1] = 0xee
	s := stream(t, c)
	waitFence(t, s, s.ScatterToDevice(b, ps))
	clear(b)
	waitFence(t, s, s.GatherFromDevice(b, ps))
	for i := 0; i < len(b); i += 4096 {
		if i >= big && i < big+8192 {
			continue // between the pieces
		}
		if b[i] != byte(i>>12)^0x5a {
			t.Fatalf("byte %d: %#x after the round trip, want %#x", i, b[i], byte(i>>12)^0x5a)
		}
	}
	if b[big+8192+odd-1] != 0xee {
		t.Fatal("the far piece's last byte did not come back")
	}
	t.Log(c.ScatterReport())
}

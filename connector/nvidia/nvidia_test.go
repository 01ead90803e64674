package nvidia

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
)

func TestLayout(t *testing.T) {
	if s := unsafe.Sizeof(ipcMemHandle{}); s != 64 {
		t.Fatalf("CUipcMemHandle is %d bytes, want 64", s)
	}
	if s := unsafe.Sizeof(connector.Handle{}); s != unsafe.Sizeof(ipcMemHandle{}) {
		t.Fatalf("connector.Handle is %d bytes, CUipcMemHandle 64", s)
	}
	var a ptrAttrs
	// cuPointerGetAttributes writes an unsigned int, an int, a CUdeviceptr
	// and a size_t through these.
	for name, got := range map[string]uintptr{
		"memType": unsafe.Sizeof(a.memType), "ordinal": unsafe.Sizeof(a.ordinal),
		"start": unsafe.Sizeof(a.start), "size": unsafe.Sizeof(a.size),
	} {
		want := uintptr(8)
		if name == "memType" || name == "ordinal" {
			want = 4
		}
		if got != want {
			t.Errorf("ptrAttrs.%s is %d bytes, want %d", name, got, want)
		}
	}
}

func TestErrnoMapping(t *testing.T) {
	for _, c := range []struct {
		code  uint32
		errno unix.Errno
	}{
		{1, unix.EINVAL}, {2, unix.ENOMEM}, {100, unix.ENODEV}, {101, unix.ENODEV},
		{34, unix.ENODEV}, {400, unix.EINVAL}, {801, unix.EOPNOTSUPP}, {46, unix.EBUSY},
		{700, unix.EIO}, {999, unix.EIO},
	} {
		if got := errnoFor(c.code); got != c.errno {
			t.Errorf("errnoFor(%d) = %v, want %v", c.code, got, c.errno)
		}
	}
	e := newCUDAError("cuMemAlloc_v2", 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")
	if got, want := e.Error(), "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(e, unix.ENOMEM) {
		t.Errorf("%v does not wrap ENOMEM", e)
	}
	if got, want := newCUDAError("cuInit", 12345, "", "").Error(), "cuInit: CUDA_ERROR_12345"; got != want {
		t.Errorf("unnamed code: %q, want %q", got, want)
	}
}

// haveLibcuda reports whether the driver library can be loaded here.
func haveLibcuda() (bool, error) {
	_, err := load()
	if err != nil && errors.Is(err, unix.ENODEV) {
		return false, err
	}
	return true, err
}

func TestOpenWithoutDriver(t *testing.T) {
	_, err := openDriver("libphx-no-such-driver.so.1")
	if !errors.Is(err, unix.ENODEV) || !strings.Contains(err.Error(), "libphx-no-such-driver.so.1 not found") {
		t.Fatalf("opening a missing library: %v, want ENODEV naming it", err)
	}
	if ok, _ := haveLibcuda(); ok {
		t.Log("libcuda.so.1 is present here: Open's no-driver error not checked")
		return
	}
	_, err = Open()
	if !errors.Is(err, unix.ENODEV) || !strings.Contains(err.Error(), "libcuda.so.1") || !strings.Contains(err.Error(), "no NVIDIA driver") {
		t.Fatalf("Open without the driver: %v, want ENODEV naming libcuda.so.1", err)
	}
}

func TestBindSymbols(t *testing.T) {
	fakeMu.Lock()
	defer fakeMu.Unlock()
	fakeDriver(newFake())
	// A missing required symbol is an error naming it, never a panic.
	_, err := bind(func(name string) uintptr {
		if name == "cuMemAlloc_v2" {
			return 0
		}
		return fakeSyms[name]
	})
	if !errors.Is(err, unix.ENOSYS) || !strings.Contains(err.Error(), "cuMemAlloc_v2") {
		t.Fatalf("missing cuMemAlloc_v2: %v", err)
	}
	// Unversioned fallbacks serve older drivers.
	d, err := bind(func(name string) uintptr {
		switch name {
		case "cuIpcOpenMemHandle_v2", "cuDevicePrimaryCtxRelease_v2":
			return 0
		case "cuIpcOpenMemHandle":
			return fakeSyms["cuIpcOpenMemHandle_v2"]
		case "cuDevicePrimaryCtxRelease":
			return fakeSyms["cuDevicePrimaryCtxRelease_v2"]
		}
		return fakeSyms[name]
	})
	if err != nil {
		t.Fatal(err)
	}
	if d.cuIpcOpenMemHandle.name != "cuIpcOpenMemHandle" || d.cuDevicePrimaryCtxRelease.name != "cuDevicePrimaryCtxRelease" {
		t.Errorf("fallbacks bound as %q, %q", d.cuIpcOpenMemHandle.name, d.cuDevicePrimaryCtxRelease.name)
	}
}

// TestValidationBeforeCUDA uses a connector with no driver at all: any
// driver call would panic on the nil table, so each error here comes from
// the checks made before calling CUDA.
func TestValidationBeforeCUDA(t *testing.T) {
	c := &Connector{devs: []connector.DeviceInfo{{Index: 0}}}
	is := func(what string, err error, want unix.Errno) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	}
	_, err := c.Alloc(1, 4096)
	is("Alloc on device 1 of 1", err, unix.ENODEV)
	_, err = c.Alloc(-1, 4096)
	is("Alloc on device -1", err, unix.ENODEV)
	_, err = c.Alloc(0, 0)
	is("Alloc of 0 bytes", err, unix.EINVAL)
	_, err = c.Alloc(0, -5)
	is("Alloc of -5 bytes", err, unix.EINVAL)
	_, err = c.Import(0, connector.Handle{}, 0, 1)
	is("Import of 0 bytes", err, unix.EINVAL)
	_, err = c.Import(3, connector.Handle{}, 4096, 1)
	is("Import on device 3", err, unix.ENODEV)
	_, err = c.Resolve(0, 0x1000, 0)
	is("Resolve of 0 bytes", err, unix.EINVAL)
	_, err = c.Resolve(0, ^uint64(0)-10, 100)
	is("Resolve wrapping", err, unix.EFAULT)
	_, err = c.Resolve(2, 0x1000, 1)
	is("Resolve on device 2", err, unix.ENODEV)
	_, err = c.AllocHost(0)
	is("AllocHost of 0 bytes", err, unix.EINVAL)
	_, err = c.NewStream(1)
	is("NewStream on device 1", err, unix.ENODEV)
	is("Memset of -1 bytes", c.Memset(0, 0x1000, 0, -1), unix.EINVAL)
	is("Memset on device 1", c.Memset(1, 0x1000, 0, 1), unix.ENODEV)
	is("CopyToHost on device 1", c.CopyToHost(make([]byte, 1), 0x1000, 1), unix.ENODEV)
	is("CopyToDeviceSync on device 1", c.CopyToDeviceSync(1, 0x1000, make([]byte, 1)), unix.ENODEV)
	if err := c.Memset(0, 0x1000, 0, 0); err != nil {
		t.Errorf("Memset of 0 bytes: %v", err)
	}
	if err := c.CopyToHost(nil, 0x1000, 0); err != nil {
		t.Errorf("CopyToHost of 0 bytes: %v", err)
	}
	if c.Vendor() != "nvidia" || c.HostAddressable() {
		t.Errorf("vendor %q, host addressable %v", c.Vendor(), c.HostAddressable())
	}
}

// withFake opens a connector over a fresh fake driver.
func withFake(t *testing.T) (*Connector, *fakeGPU) {
	t.Helper()
	fakeMu.Lock()
	t.Cleanup(fakeMu.Unlock)
	f := newFake()
	c, err := newConnector(fakeDriver(f))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.noCtx) > 0 {
			t.Errorf("driver calls without the right context current: %v", f.noCtx)
		}
	})
	return c, f
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7+i>>8) ^ seed
	}
	return b
}

func TestFakeDevices(t *testing.T) {
	c, f := withFake(t)
	devs, err := c.Devices()
	if err != nil {
		t.Fatal(err)
	}
	want := []connector.DeviceInfo{
		{Index: 0, Name: "Fake GPU 0", PCIAddress: "0000:3b:00.0", PageSize: 65536, MemoryBytes: fakeMem},
		{Index: 1, Name: "Fake GPU 1", PCIAddress: "0000:3b:01.0", PageSize: 65536, MemoryBytes: fakeMem},
	}
	if len(devs) != len(want) {
		t.Fatalf("devices %+v", devs)
	}
	for i := range want {
		if devs[i] != want[i] {
			t.Errorf("device %d: %+v, want %+v", i, devs[i], want[i])
		}
	}
	if f.retained != [fakeDevs]int{} {
		t.Errorf("listing devices retained contexts: %v", f.retained)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestFakeErrorsCarryNames(t *testing.T) {
	c, f := withFake(t)
	f.allocFail = 2
	_, err := c.Alloc(0, 1<<20)
	if err == nil || err.Error() != "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (out of memory)" || !errors.Is(err, unix.ENOMEM) {
		t.Fatalf("Alloc under OOM: %v", err)
	}
	var ce *CUDAError
	if !errors.As(err, &ce) || ce.Code != 2 || ce.Func != "cuMemAlloc_v2" {
		t.Fatalf("not a CUDAError: %#v", err)
	}
	f.allocFail = 0
	err = c.CopyToHost(make([]byte, 8), 0x1234, 0)
	if err == nil || err.Error() != "cuMemcpyDtoH_v2: CUDA_ERROR_INVALID_VALUE (invalid argument)" || !errors.Is(err, unix.EINVAL) {
		t.Fatalf("copy from a bad address: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestFakeRoundTrip(t *testing.T) {
	c, f := withFake(t)
	for dev := range fakeDevs {
		m, err := c.Alloc(dev, 1<<20+123)
		if err != nil {
			t.Fatal(err)
		}
		want := pattern(int(m.Size()), byte(dev))
		if err := c.CopyToDeviceSync(dev, m.Addr(), want); err != nil {
			t.Fatal(err)
		}
		if err := c.Memset(dev, m.Addr()+10, 0xee, 5); err != nil {
			t.Fatal(err)
		}
		copy(want[10:15], []byte{0xee, 0xee, 0xee, 0xee, 0xee})
		got := make([]byte, len(want))
		if err := c.CopyToHost(got, m.Addr(), dev); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("device %d: bytes differ after round trip", dev)
		}

		s, err := c.NewStream(dev)
		if err != nil {
			t.Fatal(err)
		}
		h, err := c.AllocHost(4096)
		if err != nil {
			t.Fatal(err)
		}
		copy(h.Bytes(), pattern(4096, 0x5a))
		if err := s.CopyToDevice(m.Addr()+4096, h.Bytes()); err != nil {
			t.Fatal(err)
		}
		back := make([]byte, 4096)
		if err := s.CopyFromDevice(back, m.Addr()+4096); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back, h.Bytes()) {
			t.Fatal("stream round trip differs")
		}
		// An enqueue error is returned to its caller, and to no one after.
		if err := s.CopyToDevice(0x10, back); !errors.Is(err, unix.EINVAL) {
			t.Fatalf("bad async copy: %v", err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatalf("Synchronize after a failed enqueue: %v", err)
		}

		if err := c.Close(); !errors.Is(err, unix.EBUSY) {
			t.Fatalf("Close with live objects: %v", err)
		}
		for _, cl := range []interface{ Close() error }{s, h, m} {
			if err := cl.Close(); err != nil {
				t.Fatal(err)
			}
			if err := cl.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
		}
		if h.Bytes() != nil {
			t.Error("Bytes after Close")
		}
		if err := s.Synchronize(); !errors.Is(err, unix.EBADF) {
			t.Errorf("Synchronize after Close: %v", err)
		}
	}
	if f.streamFlag != cuStreamNonBlocking {
		t.Errorf("stream created with flags %#x", f.streamFlag)
	}
	if len(f.allocs) != 0 || len(f.host) != 0 || len(f.streams) != 0 {
		t.Errorf("leaks: %d allocs, %d host, %d streams", len(f.allocs), len(f.host), len(f.streams))
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if f.retained != [fakeDevs]int{} {
		t.Errorf("contexts still retained after Close: %v", f.retained)
	}
	if _, err := c.Alloc(0, 1); !errors.Is(err, unix.EBADF) {
		t.Errorf("Alloc after Close: %v", err)
	}
}

// TestFakeConcurrentContexts drives both devices from many goroutines: the
// fake records any call made on a thread whose current context is not the
// device's, which is what goroutine migration would cause without onDev.
func TestFakeConcurrentContexts(t *testing.T) {
	c, _ := withFake(t)
	done := make(chan error)
	for g := range 8 {
		go func() {
			dev := g % fakeDevs
			m, err := c.Alloc(dev, 64<<10)
			if err != nil {
				done <- err
				return
			}
			want := pattern(64<<10, byte(g))
			got := make([]byte, len(want))
			for range 50 {
				if err := c.CopyToDeviceSync(dev, m.Addr(), want); err != nil {
					done <- err
					return
				}
				if err := c.CopyToHost(got, m.Addr(), dev); err != nil {
					done <- err
					return
				}
				if !bytes.Equal(got, want) {
					done <- errors.New("bytes differ")
					return
				}
			}
			done <- m.Close()
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSyncModeChecked: PHX_CUDA_SYNC takes spin, yield or blocking, or
// nothing; anything else is an error, not ignored.
func TestSyncModeChecked(t *testing.T) {
	for _, v := range []string{"", "spin", "yield", "blocking"} {
		if got, err := ParseSyncMode(v); err != nil || got != v {
			t.Errorf("ParseSyncMode(%q) = %q, %v", v, got, err)
		}
	}
	for _, v := range []string{"Spin", "busy", "1"} {
		if _, err := ParseSyncMode(v); !errors.Is(err, unix.EINVAL) {
			t.Errorf("ParseSyncMode(%q): %v, want EINVAL", v, err)
		}
	}
	t.Setenv(EnvSync, "sometimes")
	if _, err := Open(); !errors.Is(err, unix.EINVAL) {
		t.Errorf("Open with %s=sometimes: %v, want EINVAL", EnvSync, err)
	}
}

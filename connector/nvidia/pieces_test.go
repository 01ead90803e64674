package nvidia

import (
	"bytes"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
)

// scatterPieces lays out n pieces of varied sizes (some not multiples of
// 16, so the kernel's byte path runs too) packed in a host buffer and
// landing shuffled in a device region at base. It returns the pieces, the
// host buffer's size and the device region's size.
func scatterPieces(n int, base uint64) ([]connector.Piece, int64, int64) {
	ps := make([]connector.Piece, n)
	var off int64
	for i := range ps {
		ln := int64(4096 + 16*(i%5))
		if i%7 == 3 {
			ln += 3
		}
		ps[i] = connector.Piece{Off: off, Len: ln}
		off += (ln + 15) &^ 15
	}
	// Slots in reverse order, 8 KiB apart: scattered destinations.
	for i := range ps {
		ps[i].Dev = base + uint64(n-1-i)*8192
	}
	return ps, off, int64(n) * 8192
}

// TestFakeScatterGather moves the same pieces each way, through every
// method, and checks every byte on the device and back.
func TestFakeScatterGather(t *testing.T) {
	for _, mode := range []string{"kernel", "batch", "copies", "auto"} {
		t.Run(mode, func(t *testing.T) {
			c, f := withFake(t)
			if err := c.SetScatter(mode); err != nil {
				t.Fatal(err)
			}
			n := 300 // more than one launch's worth
			m, err := c.Alloc(0, int64(n)*8192)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { closeT(t, m) })
			ps, hostLen, devLen := scatterPieces(n, m.Addr())
			src := pattern(int(hostLen), 0x5a)
			s, err := c.NewStream(0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { closeT(t, s) })
			waitFence(t, s, s.ScatterToDevice(src, ps))
			checkLanded(t, c, m, ps, src, devLen)
			back := make([]byte, hostLen)
			waitFence(t, s, s.GatherFromDevice(back, ps))
			for i, p := range ps {
				if !bytes.Equal(back[p.Off:p.Off+p.Len], src[p.Off:p.Off+p.Len]) {
					t.Fatalf("piece %d differs after the gather", i)
				}
			}
			checkMethod(t, c, f, mode)
		})
	}
}

// checkLanded checks that every piece's bytes of src are at its device
// address in m, whose first devLen bytes it reads back.
func checkLanded(t *testing.T, c *Connector, m connector.Memory, ps []connector.Piece, src []byte, devLen int64) {
	t.Helper()
	dev := make([]byte, devLen)
	if err := c.CopyToHost(dev, m.Addr(), 0); err != nil {
		t.Fatal(err)
	}
	for i, p := range ps {
		at := p.Dev - m.Addr()
		if !bytes.Equal(dev[at:at+uint64(p.Len)], src[p.Off:p.Off+p.Len]) {
			t.Fatalf("piece %d (%d bytes) differs on the device", i, p.Len)
		}
	}
}

// fakeMemAndStream makes size bytes of device 0's memory and a stream on
// device 0, both closed, checked, when the test ends.
func fakeMemAndStream(t *testing.T, c *Connector, size int64) (connector.Memory, connector.Stream) {
	t.Helper()
	m, err := c.Alloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeT(t, m) })
	s, err := c.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeT(t, s) })
	return m, s
}

func waitFence(t *testing.T, s connector.Stream, enqueueErr error) {
	t.Helper()
	if enqueueErr != nil {
		t.Fatal(enqueueErr)
	}
	fe, err := s.Fence()
	if err == nil {
		err = fe.Wait()
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := fe.Wait(); !errors.Is(err, unix.EINVAL) {
		t.Errorf("second Wait: %v, want EINVAL", err)
	}
}

// checkMethod checks that the mode's method ran (auto picks the kernel
// for these 4 KiB pieces) and that ScatterReport counts it.
func checkMethod(t *testing.T, c *Connector, f *fakeGPU, mode string) {
	t.Helper()
	f.mu.Lock()
	launches, batches := f.pieces.launches, f.pieces.batches
	f.mu.Unlock()
	want := map[string][2]bool{"kernel": {true, false}, "auto": {true, false}, "batch": {false, true}, "copies": {false, false}}[mode]
	if (launches > 0) != want[0] || (batches > 0) != want[1] {
		t.Errorf("%s: %d launches, %d batches", mode, launches, batches)
	}
	if mode == "kernel" && launches != 4 {
		t.Errorf("300 pieces each way took %d launches, want 2+2", launches)
	}
	method := map[string]string{"auto": "kernel"}[mode]
	if method == "" {
		method = mode
	}
	if r := c.ScatterReport(); !strings.Contains(r, method+" 2") {
		t.Errorf("report %q does not count two %s moves", r, method)
	}
}

// TestFakeScatterChecks covers the errors: pieces outside the host buffer,
// a kernel the driver would not load, returned by the enqueue and by no
// fence after it.
func TestFakeScatterChecks(t *testing.T) {
	c, f := withFake(t)
	f.mu.Lock()
	f.pieces.badPTX = true
	f.mu.Unlock()
	if err := c.SetScatter("kernel"); err != nil {
		t.Fatal(err)
	}
	m, s := fakeMemAndStream(t, c, 1<<20)
	buf := make([]byte, 4096)
	for _, p := range []connector.Piece{{Off: 4000, Len: 100, Dev: m.Addr()}, {Off: -1, Len: 1, Dev: m.Addr()}, {Len: 0, Dev: m.Addr()}} {
		if err := s.ScatterToDevice(buf, []connector.Piece{p}); !errors.Is(err, unix.EINVAL) {
			t.Errorf("piece %+v: %v, want EINVAL", p, err)
		}
	}
	two := []connector.Piece{{Len: 16, Dev: m.Addr()}, {Off: 16, Len: 16, Dev: m.Addr() + 64}}
	err := s.ScatterToDevice(buf, two)
	if err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_218") {
		t.Fatalf("kernel forced but not loadable: %v", err)
	}
	if r := c.ScatterReport(); !strings.Contains(r, "device 0: no kernel") {
		t.Errorf("report does not say the kernel is missing: %q", r)
	}
	bad, err := s.Fence()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetScatter("copies"); err != nil {
		t.Fatal(err)
	}
	if err := s.ScatterToDevice(buf, two); err != nil {
		t.Fatal(err)
	}
	good, err := s.Fence()
	if err != nil {
		t.Fatal(err)
	}
	if err := good.Wait(); err != nil {
		t.Errorf("the later fence reports %v", err)
	}
	// The failed move's error was its enqueue's, returned to it: no fence
	// reports it again.
	if err := bad.Wait(); err != nil {
		t.Errorf("the fence after a failed enqueue reports %v", err)
	}
}

// TestGPUScatterGather is TestFakeScatterGather on the real driver: the
// hand-written kernel, cuMemcpyBatchAsync and plain copies each land every
// byte and bring it back.
func TestGPUScatterGather(t *testing.T) {
	c := gpu(t)
	n := 300
	m := devMem(t, c, int64(n)*8192)
	ps, hostLen, devLen := scatterPieces(n, m.Addr())
	src, back := pinned(t, c, hostLen), pinned(t, c, hostLen)
	copy(src.Bytes(), pattern(int(hostLen), 0x3c))
	s := stream(t, c)
	for _, mode := range []string{"kernel", "batch", "copies", "auto"} {
		if mode == "batch" && c.d.cuMemcpyBatchAsync.addr == 0 {
			t.Logf("batch: skipped, the driver has no cuMemcpyBatchAsync (CUDA 12.8+)")
			continue
		}
		if err := c.SetScatter(mode); err != nil {
			t.Fatal(err)
		}
		if err := c.Memset(0, m.Addr(), 0, devLen); err != nil {
			t.Fatal(err)
		}
		waitFence(t, s, s.ScatterToDevice(src.Bytes(), ps))
		dev := make([]byte, devLen)
		if err := c.CopyToHost(dev, m.Addr(), 0); err != nil {
			t.Fatal(err)
		}
		clear(back.Bytes())
		waitFence(t, s, s.GatherFromDevice(back.Bytes(), ps))
		for i, p := range ps {
			at := p.Dev - m.Addr()
			want := src.Bytes()[p.Off : p.Off+p.Len]
			if !bytes.Equal(dev[at:at+uint64(p.Len)], want) || !bytes.Equal(back.Bytes()[p.Off:p.Off+p.Len], want) {
				t.Fatalf("%s: piece %d (%d bytes) differs", mode, i, p.Len)
			}
		}
	}
	t.Log(c.ScatterReport())
}

// TestScatterModeChecked: PHX_SCATTER takes auto, kernel, batch or copies,
// or nothing; anything else stops Open and CheckEnv.
func TestScatterModeChecked(t *testing.T) {
	for v, want := range map[string]string{"": "auto", "auto": "auto", "kernel": "kernel", "batch": "batch", "copies": "copies"} {
		if got, err := ParseScatterMode(v); err != nil || got != want {
			t.Errorf("ParseScatterMode(%q) = %q, %v", v, got, err)
		}
	}
	t.Setenv(EnvScatter, "Kernel")
	if err := CheckEnv(); !errors.Is(err, unix.EINVAL) {
		t.Errorf("CheckEnv with %s=Kernel: %v, want EINVAL", EnvScatter, err)
	}
	if _, err := Open(); !errors.Is(err, unix.EINVAL) {
		t.Errorf("Open with %s=Kernel: %v, want EINVAL", EnvScatter, err)
	}
}

// TestFakeEnqueueErrorStaysWithItsTransfer: a scatter whose enqueue fails
// part way (its first copy queued, then a call refused) returns the error
// to its caller alone; the next transfer on the same stream, which may be
// another client's, gets a clean fence and every byte (issue 18, item 6).
func TestFakeEnqueueErrorStaysWithItsTransfer(t *testing.T) {
	// The kernel's copy into staging is queued before its launch fails;
	// so is the first piece's copy before the second's.
	fails := map[string]struct {
		call string
		skip int
	}{"kernel": {"cuLaunchKernel", 0}, "batch": {"cuMemcpyBatchAsync_v2", 0}, "copies": {"cuMemcpyHtoDAsync_v2", 1}}
	for mode, fail := range fails {
		t.Run(mode, func(t *testing.T) {
			c, f := withFake(t)
			if err := c.SetScatter(mode); err != nil {
				t.Fatal(err)
			}
			const n = 40
			m, s := fakeMemAndStream(t, c, n*8192)
			ps, hostLen, devLen := scatterPieces(n, m.Addr())
			f.mu.Lock()
			f.pieces.failCall, f.pieces.failSkip, f.pieces.failCode = fail.call, fail.skip, cudaErrorInvalidValue
			f.mu.Unlock()
			if err := s.ScatterToDevice(pattern(int(hostLen), 0x11), ps); !errors.Is(err, unix.EINVAL) {
				t.Fatalf("the failing scatter: %v, want EINVAL", err)
			}
			src := pattern(int(hostLen), 0x22)
			waitFence(t, s, s.ScatterToDevice(src, ps))
			if err := s.Synchronize(); err != nil {
				t.Fatalf("Synchronize after the failed enqueue: %v", err)
			}
			checkLanded(t, c, m, ps, src, devLen)
		})
	}
}

// TestFakeStickyErrorReachesEveryone: a broken context (a sticky error)
// fails every wait after it, whoever queued the copies.
func TestFakeStickyErrorReachesEveryone(t *testing.T) {
	c, f := withFake(t)
	m, s := fakeMemAndStream(t, c, 1<<20)
	src := pattern(4096, 0x33)
	var fences []connector.Fence
	for range 2 {
		if err := s.CopyToDevice(m.Addr(), src); err != nil {
			t.Fatal(err)
		}
		fe, err := s.Fence()
		if err != nil {
			t.Fatal(err)
		}
		fences = append(fences, fe)
	}
	f.mu.Lock()
	f.pieces.sticky = 700 // CUDA_ERROR_ILLEGAL_ADDRESS
	f.mu.Unlock()
	for i, fe := range fences {
		if err := fe.Wait(); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_700") {
			t.Errorf("fence %d after the context broke: %v", i, err)
		}
	}
	if err := s.Synchronize(); err == nil {
		t.Error("Synchronize after the context broke reports nothing")
	}
	f.mu.Lock()
	f.pieces.sticky = 0 // so that the stream closes
	f.mu.Unlock()
}

// TestFakeKernelPiecesPast4GiB: the kernel's parameter block carries
// offsets and lengths of 4 GiB and more whole (issue 18, item 11:
// PHX_SCATTER=kernel truncated them to 32 bits). The fake decodes the
// block at the offsets copy_pieces.ptx documents and moves nothing.
func TestFakeKernelPiecesPast4GiB(t *testing.T) {
	c, f := withFake(t)
	_, s := fakeMemAndStream(t, c, 1<<20)
	fn, err := c.kernel(0)
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.pieces.record = true
	f.mu.Unlock()
	const lo = 4096
	ps := []connector.Piece{
		{Off: lo, Len: 16, Dev: 0x7f0000000000},
		{Off: lo + 5<<30 + 48, Len: 4<<30 + 32, Dev: 0x7f0100000000},
		{Off: lo + 9<<30 + 4096, Len: 8<<30 + 7, Dev: 0x7f0200000000},
	}
	st := s.(*Stream)
	st.mu.Lock()
	err = st.c.onDev(0, func() error { return st.launch(fn, ps, lo, false) })
	st.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	got := f.pieces.decoded
	f.mu.Unlock()
	if len(got) != len(ps) {
		t.Fatalf("%d pieces decoded, want %d", len(got), len(ps))
	}
	for i, p := range ps {
		want := decodedPiece{dev: p.Dev, off: uint64(p.Off - lo), len: uint64(p.Len)}
		if got[i] != want {
			t.Errorf("piece %d: the kernel reads %+v, want %+v", i, got[i], want)
		}
	}
}

// TestKernelParamBlockMatchesPTX: the Go parameter block is as large as
// the kernel's declared parameter, which stays within the 4 KiB every
// driver takes.
func TestKernelParamBlockMatchesPTX(t *testing.T) {
	m := regexp.MustCompile(`phx_copy_pieces_param_0\[(\d+)\]`).FindStringSubmatch(copyPiecesPTX)
	if m == nil {
		t.Fatal("no parameter declaration in copy_pieces.ptx")
	}
	declared, _ := strconv.Atoi(m[1])
	if size := int(unsafe.Sizeof(kernelArgs{})); size != declared || size > 4096 {
		t.Fatalf("kernelArgs is %d bytes, the PTX declares %d (limit 4096)", size, declared)
	}
}

// TestFakeDriverCallsPerShare counts the driver calls of one worker's
// share of a KV-cache batch as phxfs moves it: one scatter of a slot's
// blocks, its fence, and the fence's wait, for 58 blocks (a share of a
// 409-block batch over 7 workers) and 205 (over 2). With the kernel: a
// context switch-in per call (3), one copy, a launch per 169 blocks, an
// event record and an event wait; the batch method one batched copy
// instead of the copy and launches. Every block lands.
func TestFakeDriverCallsPerShare(t *testing.T) {
	for _, mode := range []string{"kernel", "batch"} {
		for _, n := range []int{58, 205} {
			t.Run(mode+"/"+strconv.Itoa(n), func(t *testing.T) {
				c, _ := withFake(t)
				if err := c.SetScatter(mode); err != nil {
					t.Fatal(err)
				}
				const bs = 16 << 10
				m, s := fakeMemAndStream(t, c, int64(n)*bs)
				src := pattern(n*bs, byte(n))
				ps := make([]connector.Piece, n)
				for i := range ps {
					ps[i] = connector.Piece{Off: int64(i) * bs, Dev: m.Addr() + uint64(n-1-i)*bs, Len: bs}
				}
				share := func() {
					waitFence(t, s, s.ScatterToDevice(src, ps))
				}
				share() // the staging buffer and the event are made once per stream
				calls := map[string]int{}
				countCall = func(name string) { calls[name]++ }
				share()
				countCall = nil
				checkLanded(t, c, m, ps, src, int64(n)*bs)
				launches := (n + kernelMaxPieces - 1) / kernelMaxPieces
				want := map[string]int{"cuCtxSetCurrent": 3, "cuEventRecord": 1, "cuEventSynchronize": 1}
				if mode == "kernel" {
					want["cuMemcpyHtoDAsync"], want["cuLaunchKernel"] = 1, launches
				} else {
					want["cuMemcpyBatchAsync"] = 1
				}
				total := 0
				for name, k := range calls {
					total += k
					name, _, _ = strings.Cut(name, "_") // cuMemcpyHtoDAsync_v2: the symbol bound
					if want[name] != k {
						t.Errorf("%s: %d calls, want %d (all: %v)", name, k, want[name], calls)
					}
				}
				t.Logf("%s, %d blocks of 16 KiB: %d driver calls a share: %v", mode, n, total, calls)
			})
		}
	}
}

package phxfs

import (
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/emu"
	"github.com/phxmount/phxmount/ioengine"
)

const mib = 1 << 20

func TestOpenCloseReferenceCounts(t *testing.T) {
	forEach(t, func(t *testing.T, s setup) {
		l, c := newLib(t, s, 1)
		wantErrno(t, l.OpenDevice(7), unix.ENODEV)
		if err := l.OpenDevice(0); err != nil { // second reference
			t.Fatal(err)
		}
		m := alloc(t, c, 0, 256<<10)
		register(t, l, m)
		if err := l.CloseDevice(0); err != nil {
			t.Fatal(err)
		}
		// One reference left: the registration is still usable.
		if tr, err := l.Transport(0, m.Addr()); err != nil || tr != s.transport {
			t.Fatalf("transport %q, %v; want %q", tr, err, s.transport)
		}
		if err := l.CloseDevice(0); err != nil {
			t.Fatal(err)
		}
		// The last close removed every registration and the device.
		_, err := l.Transport(0, m.Addr())
		wantErrno(t, err, unix.ENODEV)
		wantErrno(t, l.CloseDevice(0), unix.ENODEV)
		if err := l.OpenDevice(0); err != nil {
			t.Fatal(err)
		}
		_, err = l.Transport(0, m.Addr())
		wantErrno(t, err, unix.EFAULT)
	})
}

// blockedRead submits a read of n bytes into addr that stays in flight
// (its registration held) until feed is called: every pool worker is kept
// busy first, so the batch waits for them.
func blockedRead(t *testing.T, l *Lib, dev int, addr uint64, n int64) (b *Batch, feed func()) {
	t.Helper()
	fd := openFile(t, patternFile(t, n), unix.O_RDONLY)
	gate := make(chan struct{})
	busy := make(chan struct{}, l.pool.Workers())
	go l.pool.Each(func(int, ioengine.Engine) {
		busy <- struct{}{}
		<-gate
	})
	for range l.pool.Workers() {
		<-busy
	}
	var once sync.Once
	feed = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(feed)
	before := l.Stats().Batches
	b, err := l.SubmitRead([]Request{{Fd: fd, Device: dev, DevAddr: addr, Len: n}})
	if err != nil {
		t.Fatal(err)
	}
	// In flight means taken off the queue by the dispatcher, not merely
	// queued: callers count the queue's free slots after this.
	for deadline := time.Now().Add(10 * time.Second); l.Stats().Batches == before; {
		if time.Now().After(deadline) {
			t.Fatal("the dispatcher never took the blocked batch off the queue")
		}
		time.Sleep(time.Millisecond)
	}
	return b, feed
}

// readInFlight makes a library for s with one device, registers a 256 KiB
// buffer and leaves a blockedRead of n bytes into it in flight.
func readInFlight(t *testing.T, s setup, n int64) (l *Lib, m connector.Memory, b *Batch, feed func()) {
	t.Helper()
	l, c := newLib(t, s, 1)
	m = alloc(t, c, 0, 256<<10)
	register(t, l, m)
	b, feed = blockedRead(t, l, 0, m.Addr(), n)
	return l, m, b, feed
}

// stillWaiting fails the test if done, the end of an operation that must
// wait for a batch in flight, comes within 100 ms.
func stillWaiting(t *testing.T, what string, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s returned %v with a batch in flight", what, err)
	case <-time.After(100 * time.Millisecond):
	}
}

// release feeds the batch b in flight; then the operation that waited for
// it (done) and b itself must succeed.
func release(t *testing.T, feed func(), done <-chan error, b *Batch) {
	t.Helper()
	feed()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if failed, err := b.Wait(); err != nil || failed != 0 {
		t.Fatalf("batch: %d failed, %v", failed, err)
	}
}

// draining says whether device dev's last close waits for its I/O now.
func draining(l *Lib, dev int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.devices[dev]
	return d != nil && d.io.closing
}

func TestCloseDrainsAndOpenGetsEBUSY(t *testing.T) {
	forEach(t, func(t *testing.T, s setup) {
		l, _, b, feed := readInFlight(t, s, 64<<10)

		closed := make(chan error, 1)
		go func() { closed <- l.CloseDevice(0) }()
		// The close must wait for the in-flight read; meanwhile an open is
		// refused with EBUSY (retryable). The test waits for the drain to
		// begin rather than probing with an open and a close of its own:
		// those are a reference taken and dropped, and when the close
		// above ran between them, the test's own close was the last one
		// and waited for the read that only the test releases.
		for deadline := time.Now().Add(5 * time.Second); !draining(l, 0); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("close never started draining")
			}
		}
		wantErrno(t, l.OpenDevice(0), unix.EBUSY)
		stillWaiting(t, "close", closed)
		release(t, feed, closed, b)
		if err := l.OpenDevice(0); err != nil {
			t.Fatalf("open after the drain: %v", err)
		}
	})
}

func TestRegMemRules(t *testing.T) {
	forEach(t, func(t *testing.T, s setup) {
		l, c := newLib(t, s, 2)
		m := alloc(t, c, 0, 1*mib)
		a := m.Addr()
		for _, bad := range []struct {
			addr uint64
			size int64
		}{{0, 64 << 10}, {a, 0}, {a + 4096, 64 << 10}, {a, 64<<10 + 4096}, {a, -65536}} {
			_, err := l.RegMem(0, bad.addr, bad.size)
			wantErrno(t, err, unix.EINVAL)
		}
		_, err := l.RegMem(3, a, 64<<10)
		wantErrno(t, err, unix.ENODEV)
		// Memory of another device, or no device memory at all.
		_, err = l.RegMem(1, a, 64<<10)
		wantErrno(t, err, unix.EFAULT)

		r1, err := l.RegMem(0, a+64<<10, 256<<10)
		if err != nil {
			t.Fatal(err)
		}
		if r1.Transport() != s.transport || r1.Addr() != a+64<<10 || r1.Size() != 256<<10 {
			t.Fatalf("registration %+v", r1)
		}
		// Exact duplicates are counted; overlaps are refused.
		if _, err := l.RegMem(0, a+64<<10, 256<<10); err != nil {
			t.Fatal(err)
		}
		for _, ov := range [][2]uint64{{a, 128 << 10}, {a + 128<<10, 64 << 10}, {a + 256<<10, 128 << 10}, {a, 1 * mib}} {
			_, err := l.RegMem(0, ov[0], int64(ov[1]))
			wantErrno(t, err, unix.EINVAL)
		}
		// Neighbours are fine.
		if _, err := l.RegMem(0, a, 64<<10); err != nil {
			t.Fatal(err)
		}
		if _, err := l.RegMem(0, a+320<<10, 64<<10); err != nil {
			t.Fatal(err)
		}
		wantErrno(t, l.DeregMem(0, a+64<<10, 128<<10), unix.EINVAL) // not the registered length
		for i := 0; i < 2; i++ {
			if err := l.DeregMem(0, a+64<<10, 256<<10); err != nil {
				t.Fatalf("deregister %d: %v", i, err)
			}
		}
		wantErrno(t, l.DeregMem(0, a+64<<10, 256<<10), unix.EINVAL)
		// The range is free again and may be registered with another shape.
		if _, err := l.RegMem(0, a+64<<10, 128<<10); err != nil {
			t.Fatal(err)
		}
		if d, err := l.Device(0); err != nil || d.Registrations != 3 {
			t.Fatalf("device info %+v, %v", d, err)
		}
	})
}

func TestDeregMemWaitsForInflightIO(t *testing.T) {
	forEach(t, func(t *testing.T, s setup) {
		l, m, b, feed := readInFlight(t, s, 128<<10)
		done := make(chan error)
		go func() { done <- l.DeregMem(0, m.Addr(), m.Size()) }()
		stillWaiting(t, "deregister", done)
		// New I/O on the dying registration is refused at once.
		n, err := l.Read(0, 0, m.Addr(), 0, 4096, 0)
		wantErrno(t, err, unix.EFAULT)
		if n != 0 {
			t.Fatalf("read %d bytes", n)
		}
		release(t, feed, done, b)
	})
}

func TestReadWriteSingle(t *testing.T) {
	forEach(t, func(t *testing.T, s setup) {
		l, c := newLib(t, s, 1)
		const fsize = 3*mib + 4096
		name := patternFile(t, fsize)
		m := alloc(t, c, 0, 4*mib)
		register(t, l, m)
		for _, flags := range []int{unix.O_RDONLY, unix.O_RDONLY | unix.O_DIRECT} {
			fd := openFile(t, name, flags)
			// buf in the middle of the registration plus an offset.
			buf := m.Addr() + 64<<10
			n, err := l.Read(fd, 0, buf, 4096, 2*mib, 8192)
			if err != nil || n != 2*mib {
				t.Fatalf("read: %d, %v", n, err)
			}
			checkPattern(t, deviceBytes(t, c, m, 64<<10+4096, 2*mib), 8192)
			// Short at end of file, zero at and past it.
			n, err = l.Read(fd, 0, m.Addr(), 0, 1*mib, fsize-4096)
			if err != nil || n != 4096 {
				t.Fatalf("read at the end: %d, %v", n, err)
			}
			checkPattern(t, deviceBytes(t, c, m, 0, 4096), fsize-4096)
			if n, err := l.Read(fd, 0, m.Addr(), 0, 4096, fsize); err != nil || n != 0 {
				t.Fatalf("read past the end: %d, %v", n, err)
			}
		}
		fd := openFile(t, name, unix.O_RDONLY)
		// Past the registration: refused before any I/O.
		fillDevice(t, c, m, 4*mib-4096, make([]byte, 4096))
		_, err := l.Read(fd, 0, m.Addr(), 4*mib-4096, 8192, 0)
		wantErrno(t, err, unix.EFAULT)
		if b := deviceBytes(t, c, m, 4*mib-4096, 4096); b[8] != 0 {
			t.Fatal("a refused read moved bytes")
		}
		_, err = l.Read(fd, 0, m.Addr()+8*mib, 0, 4096, 0)
		wantErrno(t, err, unix.EFAULT)
		_, err = l.Read(-1, 0, m.Addr(), 0, 4096, 0)
		wantErrno(t, err, unix.EBADF)
		_, err = l.Read(fd, 0, m.Addr(), 0, -1, 0)
		wantErrno(t, err, unix.EINVAL)

		// Write from device memory to a new file and read it back.
		out := name + ".out"
		wfd := openFile(t, out, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC)
		src := make([]byte, 1*mib)
		fillPattern(src, 5*mib)
		fillDevice(t, c, m, 128<<10, src)
		n, err := l.Write(wfd, 0, m.Addr(), 128<<10, 1*mib, 4096)
		if err != nil || n != 1*mib {
			t.Fatalf("write: %d, %v", n, err)
		}
		got := make([]byte, 1*mib)
		if _, err := unix.Pread(wfd, got, 4096); err != nil {
			t.Fatal(err)
		}
		checkPattern(t, got, 5*mib)

		// A host buffer (device < 0).
		host, err := c.AllocHost(64 << 10)
		if err != nil {
			t.Fatal(err)
		}
		defer host.Close()
		n, err = l.Read(fd, -1, uint64(addrOf(host.Bytes())), 0, 64<<10, 1*mib)
		if err != nil || n != 64<<10 {
			t.Fatalf("host read: %d, %v", n, err)
		}
		checkPattern(t, host.Bytes(), 1*mib)
	})
}

// TestChunking checks that a transfer is cut at ChunkSize without moving
// any byte (a multi-GiB transfer is too large for a unit test).
func TestChunking(t *testing.T) {
	s := setup{"sync", Host}
	l, _ := newLib(t, s, 1, func(c *Config) { c.SplitSize = -1 })
	reqs := []Request{{Fd: 0, Device: -1, HostAddr: 1 << 40, Len: 2*ChunkSize + 12345, FileOffset: 4096}}
	p, err := l.prepare(false, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.xfers) != 3 {
		t.Fatalf("%d transfers, want 3", len(p.xfers))
	}
	for i, x := range p.xfers {
		want := int64(ChunkSize)
		if i == 2 {
			want = 12345
		}
		if x.len != want || x.off != 4096+int64(i)*ChunkSize || x.host != uintptr(1<<40+i*ChunkSize) {
			t.Fatalf("transfer %d: %+v", i, x)
		}
	}
	// The first chunk short at end of file ends the request there.
	p.xfers[0].result, p.xfers[1].result, p.xfers[2].result = ChunkSize, 100, 0
	l.finish(p)
	if reqs[0].Result != ChunkSize+100 {
		t.Fatalf("result %d", reqs[0].Result)
	}
}

// TestUnrunTransferIsAnError: a transfer that no path ran fails its
// request with EIO; it never reads as a short count, which the ABI
// promises only at end of file (issue 18, item 2). Requests whose
// transfers all ran keep their counts.
func TestUnrunTransferIsAnError(t *testing.T) {
	l, _ := newLib(t, setup{"sync", Host}, 0) // planning only: host buffers
	reqs := []Request{
		{Fd: 7, Device: -1, HostAddr: 1 << 40, Len: 3 * mib, FileOffset: 0},
		{Fd: 8, Device: -1, HostAddr: 1 << 41, Len: 4096, FileOffset: 0},
		{Fd: 9, Device: -1, HostAddr: 1 << 42, Len: 4096, FileOffset: 0},
	}
	p, err := l.prepare(false, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.segs[0]) < 2 {
		t.Fatalf("the first request is %d transfers, want several", len(p.segs[0]))
	}
	// Every transfer of the first request ran but its second; the second
	// request's ran short (end of file); the third's never ran.
	for k, s := range p.segs[0] {
		if k != 1 {
			p.xfers[s.x].result = s.n
		}
	}
	p.xfers[p.segs[1][0].x].result = 100
	l.finish(p)
	if reqs[0].Result != errnoResult(unix.EIO) {
		t.Fatalf("a request with an unrun transfer after its first: result %d, want -EIO", reqs[0].Result)
	}
	if reqs[1].Result != 100 {
		t.Fatalf("a request that ran short: result %d, want 100", reqs[1].Result)
	}
	if reqs[2].Result != errnoResult(unix.EIO) {
		t.Fatalf("a request whose transfer never ran: result %d, want -EIO", reqs[2].Result)
	}
}

func TestBatchMixedDevicesAndHostBuffers(t *testing.T) {
	forEach(t, func(t *testing.T, s setup) {
		l, c := newLib(t, s, 2)
		nameA := patternFile(t, 2*mib)
		nameB := patternFile(t, 1*mib)
		fdA := openFile(t, nameA, unix.O_RDONLY|unix.O_DIRECT)
		fdB := openFile(t, nameB, unix.O_RDONLY)
		m0 := alloc(t, c, 0, 1*mib)
		m1 := alloc(t, c, 1, 1*mib)
		register(t, l, m0)
		register(t, l, m1)
		host, err := c.AllocHost(256 << 10)
		if err != nil {
			t.Fatal(err)
		}
		defer host.Close()
		unreg := alloc(t, c, 0, 64<<10)
		before := l.Stats()
		reqs := []Request{
			{Fd: fdA, Device: 0, DevAddr: m0.Addr(), BufOffset: 0, Len: 512 << 10, FileOffset: 1 * mib},
			{Fd: fdB, Device: 1, DevAddr: m1.Addr(), BufOffset: 8, Len: 100000, FileOffset: 16}, // unaligned, buffered
			{Fd: fdA, Device: -1, HostAddr: addrOf(host.Bytes()), Len: 256 << 10, FileOffset: 4096},
			{Fd: fdA, Device: 0, DevAddr: unreg.Addr(), Len: 4096},                                                  // not registered
			{Fd: fdA, Device: 1, DevAddr: m1.Addr(), BufOffset: 1*mib - 4096, Len: 8192},                            // past the end
			{Fd: fdB, Device: 0, DevAddr: m0.Addr(), BufOffset: 768 << 10, Len: 64 << 10, FileOffset: 1*mib - 4096}, // short
			{Fd: 12345, Device: 0, DevAddr: m0.Addr(), BufOffset: 512 << 10, Len: 4096},                             // bad fd
			{Fd: fdB, Device: 0, DevAddr: m0.Addr(), Len: 0},                                                        // empty
		}
		failed, err := l.ReadBatch(reqs)
		if err != nil {
			t.Fatal(err)
		}
		want := []int64{512 << 10, 100000, 256 << 10, errnoResult(unix.EFAULT), errnoResult(unix.EFAULT), 4096, errnoResult(unix.EBADF), 0}
		for i := range want {
			if reqs[i].Result != want[i] {
				t.Fatalf("request %d: result %d, want %d (%s)", i, reqs[i].Result, want[i], describe(reqs))
			}
		}
		if failed != 4 {
			t.Fatalf("%d failed, want 4", failed)
		}
		// Unresolvable buffers never reached the engine.
		if got := l.Stats().Requests - before.Requests; got != 5 {
			t.Fatalf("%d requests reached the engine, want 5", got)
		}
		checkPattern(t, deviceBytes(t, c, m0, 0, 512<<10), 1*mib)
		checkPattern(t, deviceBytes(t, c, m1, 8, 100000-8), 16)
		checkPattern(t, host.Bytes(), 4096)
		checkPattern(t, deviceBytes(t, c, m0, 768<<10, 4096), 1*mib-4096)
	})
}

// TestCoalescing reads KV-cache-style blocks: 2·nkv per-head requests whose
// file ranges and buffer ranges follow on become one engine operation.
func TestCoalescing(t *testing.T) {
	forEach(t, func(t *testing.T, s setup) {
		l, c := newLib(t, s, 1)
		const head = 16 << 10
		const nkv = 4
		const blocks = 6
		name := patternFile(t, blocks*2*nkv*head)
		fd := openFile(t, name, unix.O_RDONLY|unix.O_DIRECT)
		m := alloc(t, c, 0, 2*mib)
		register(t, l, m)
		var reqs []Request
		// Blocks land in reverse slot order, heads in interleaved K,V order,
		// the way the consumer emits them.
		for b := 0; b < blocks; b++ {
			slot := int64(blocks - 1 - b)
			for kh := int64(0); kh < nkv; kh++ {
				for _, v := range []int64{0, nkv} {
					i := int64(b)*2*nkv + v + kh
					reqs = append(reqs, Request{Fd: fd, Device: 0, DevAddr: m.Addr(), BufOffset: slot*2*nkv*head + (v+kh)*head, Len: head, FileOffset: i * head})
				}
			}
		}
		before := l.Stats()
		failed, err := l.ReadBatch(reqs)
		if err != nil || failed != 0 {
			t.Fatalf("%d failed, %v: %s", failed, err, describe(reqs))
		}
		st := l.Stats()
		if ops := st.Ops - before.Ops; ops != blocks {
			t.Fatalf("%d engine operations for %d blocks", ops, blocks)
		}
		if co := st.Coalesced - before.Coalesced; co != int64(len(reqs)-blocks) {
			t.Fatalf("%d coalesced, want %d", co, len(reqs)-blocks)
		}
		for b := 0; b < blocks; b++ {
			slot := int64(blocks - 1 - b)
			checkPattern(t, deviceBytes(t, c, m, slot*2*nkv*head, 2*nkv*head), int64(b)*2*nkv*head)
		}
		// A merged run cut by the end of file gives each request its share.
		short := []Request{
			{Fd: fd, Device: 0, DevAddr: m.Addr(), Len: head, FileOffset: blocks*2*nkv*head - head},
			{Fd: fd, Device: 0, DevAddr: m.Addr(), BufOffset: head, Len: head, FileOffset: blocks * 2 * nkv * head},
		}
		failed, err = l.ReadBatch(short)
		if err != nil || failed != 1 || short[0].Result != head || short[1].Result != 0 {
			t.Fatalf("%d failed, %v: %s", failed, err, describe(short))
		}
	})
}

func TestAsyncBatches(t *testing.T) {
	forEach(t, func(t *testing.T, s setup) {
		l, c := newLib(t, s, 1, func(c *Config) { c.MaxQueuedBatches = 2 })
		name := patternFile(t, 1*mib)
		fd := openFile(t, name, unix.O_RDONLY)
		m := alloc(t, c, 0, 1*mib)
		register(t, l, m)

		// An empty batch is valid and waits to zero.
		e, err := l.SubmitRead(nil)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := e.Wait(); n != 0 || err != nil {
			t.Fatalf("empty batch: %d, %v", n, err)
		}
		_, err = e.Wait()
		wantErrno(t, err, unix.EINVAL)

		// One batch runs (blocked on a pipe), two wait in the FIFO, the
		// next is refused with EBUSY.
		first, feed := blockedRead(t, l, 0, m.Addr(), 64<<10)
		reqs := [][]Request{
			{{Fd: fd, Device: 0, DevAddr: m.Addr(), BufOffset: 128 << 10, Len: 128 << 10, FileOffset: 0}},
			{{Fd: fd, Device: 0, DevAddr: m.Addr(), BufOffset: 256 << 10, Len: 128 << 10, FileOffset: 128 << 10}},
		}
		var queued []*Batch
		for _, r := range reqs {
			b, err := l.SubmitRead(r)
			if err != nil {
				t.Fatal(err)
			}
			queued = append(queued, b)
		}
		extra := []Request{{Fd: fd, Device: 0, DevAddr: m.Addr(), Len: 4096}}
		_, err = l.SubmitRead(extra)
		wantErrno(t, err, unix.EBUSY)
		if reqs[0][0].Result != 0 {
			t.Fatal("results were written before Wait")
		}
		feed()
		if n, err := first.Wait(); n != 0 || err != nil {
			t.Fatalf("first: %d, %v", n, err)
		}
		for i, b := range queued {
			if n, err := b.Wait(); n != 0 || err != nil || reqs[i][0].Result != 128<<10 {
				t.Fatalf("batch %d: %d, %v, %s", i, n, err, describe(reqs[i]))
			}
		}
		checkPattern(t, deviceBytes(t, c, m, 128<<10, 256<<10), 0)

		// Destroy abandons a batch and waits for it to quiesce.
		d, err := l.SubmitRead([]Request{{Fd: fd, Device: 0, DevAddr: m.Addr(), Len: 64 << 10}})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Destroy(); err != nil {
			t.Fatal(err)
		}
		wantErrno(t, d.Destroy(), unix.EINVAL)
		// Deregistration does not wait for a destroyed batch.
		if err := l.DeregMem(0, m.Addr(), m.Size()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestAsyncWrites(t *testing.T) {
	forEach(t, func(t *testing.T, s setup) {
		l, c := newLib(t, s, 1)
		m := alloc(t, c, 0, 2*mib)
		register(t, l, m)
		src := make([]byte, 2*mib)
		fillPattern(src, 0)
		fillDevice(t, c, m, 0, src)
		name := patternFile(t, 0) + ".w"
		fd := openFile(t, name, unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT)
		var reqs []Request
		for i := int64(0); i < 16; i++ {
			// Write the 128 KiB pieces of the buffer in reverse file order.
			reqs = append(reqs, Request{Fd: fd, Device: 0, DevAddr: m.Addr(), BufOffset: i * 128 << 10, Len: 128 << 10, FileOffset: (15 - i) * 128 << 10})
		}
		b, err := l.SubmitWrite(reqs)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := b.Wait(); n != 0 || err != nil {
			t.Fatalf("%d failed, %v: %s", n, err, describe(reqs))
		}
		got := make([]byte, 128<<10)
		for i := int64(0); i < 16; i++ {
			if _, err := unix.Pread(fd, got, (15-i)*128<<10); err != nil {
				t.Fatal(err)
			}
			checkPattern(t, got, i*128<<10)
		}
	})
}

func TestLargeReadSpreadsOverWorkers(t *testing.T) {
	forEach(t, func(t *testing.T, s setup) {
		l, c := newLib(t, s, 1)
		name := patternFile(t, 6*mib)
		fd := openFile(t, name, unix.O_RDONLY|unix.O_DIRECT)
		m := alloc(t, c, 0, 8*mib)
		register(t, l, m)
		before := l.Stats()
		n, err := l.Read(fd, 0, m.Addr(), 1*mib, 6*mib, 0)
		if err != nil || n != 6*mib {
			t.Fatalf("read: %d, %v", n, err)
		}
		if ops := l.Stats().Ops - before.Ops; ops < 6 {
			t.Fatalf("a 6 MiB read ran as %d operations", ops)
		}
		checkPattern(t, deviceBytes(t, c, m, 1*mib, 6*mib), 0)
	})
}

func TestTransportChoice(t *testing.T) {
	c, _ := emu.New(emu.Config{Staged: true})
	_, err := New(Config{Connector: c, Transport: "carrier-pigeon"})
	wantErrno(t, err, unix.EINVAL)
	l, err := New(Config{Connector: c, Transport: Host, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.OpenDevice(0); err != nil {
		t.Fatal(err)
	}
	m, _ := c.Alloc(0, 64<<10)
	defer m.Close()
	_, err = l.RegMem(0, m.Addr(), m.Size())
	wantErrno(t, err, unix.EINVAL) // staged memory cannot take the host transport
	_, err = New(Config{})
	wantErrno(t, err, unix.EINVAL)

	d, err := New(Config{Connector: c, Transport: Kmod, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := openKernelDevice(c.Vendor(), connectorDevice(t, c, 0)); err == nil {
		t.Skip("the phxfs kernel module is loaded here: the refusal below cannot be tested")
	}
	wantErrno(t, d.OpenDevice(0), unix.ENODEV)
}

func TestLibCloseDrainsEverything(t *testing.T) {
	l, _, b, feed := readInFlight(t, setup{"io_uring", Host}, 64<<10)
	closed := make(chan error)
	go func() { closed <- l.Close() }()
	stillWaiting(t, "library close", closed)
	release(t, feed, closed, b)
	_, err := l.SubmitRead([]Request{{Fd: 0, Device: -1, HostAddr: 1, Len: 1}})
	wantErrno(t, err, unix.EINVAL)
	wantErrno(t, l.Close(), unix.EINVAL)
}

// TestDevicesShareThePoolFairly runs a large batch on device 0 and, while it
// runs, a small one on device 1: the small one must not wait for the large
// one to finish.
func TestDevicesShareThePoolFairly(t *testing.T) {
	forEach(t, func(t *testing.T, s setup) {
		l, c := newLib(t, s, 2)
		name := patternFile(t, 4*mib)
		fd := openFile(t, name, unix.O_RDONLY)
		m0 := alloc(t, c, 0, 1*mib)
		m1 := alloc(t, c, 1, 1*mib)
		register(t, l, m0)
		register(t, l, m1)
		var big []Request
		for i := int64(0); i < 8192; i++ {
			big = append(big, Request{Fd: fd, Device: 0, DevAddr: m0.Addr(), BufOffset: (i % 16) * 64 << 10, Len: 64 << 10, FileOffset: ((i * 7) % 64) * 64 << 10})
		}
		bigDone := make(chan struct{})
		started := l.Stats().Ops
		t0 := time.Now()
		var bigTook time.Duration
		go func() {
			defer close(bigDone)
			defer func() { bigTook = time.Since(t0) }()
			if n, err := l.ReadBatch(big); n != 0 || err != nil {
				t.Errorf("big batch: %d failed, %v", n, err)
			}
		}()
		for l.Stats().Ops == started {
			time.Sleep(time.Millisecond)
		}
		small := []Request{{Fd: fd, Device: 1, DevAddr: m1.Addr(), Len: 64 << 10, FileOffset: 128 << 10}}
		t1 := time.Now()
		if n, err := l.ReadBatch(small); n != 0 || err != nil {
			t.Fatalf("small batch: %d failed, %v", n, err)
		}
		smallTook := time.Since(t1)
		checkPattern(t, deviceBytes(t, c, m1, 0, 64<<10), 128<<10)
		<-bigDone
		if smallTook > bigTook/4 {
			t.Fatalf("the small batch on device 1 took %v of the big batch's %v on device 0: it waited for it", smallTook, bigTook)
		}
	})
}

// TestSharedRegistrationCloseWaitsForItsOwnHolds: two registrations of
// the same range share the memory; closing one waits for the holds taken
// through it (its owner's I/O), not for the other's, and refuses new holds
// through it while the other still works.
func TestSharedRegistrationCloseWaitsForItsOwnHolds(t *testing.T) {
	forEach(t, func(t *testing.T, s setup) {
		l, c := newLib(t, s, 1)
		m := alloc(t, c, 0, 256<<10)
		a, b := register(t, l, m), register(t, l, m)
		if err := a.Hold(); err != nil {
			t.Fatal(err)
		}
		held := true // until a.Release below: let a failing test end (the library's close drains holds)
		t.Cleanup(func() {
			if held {
				a.Release()
			}
		})
		done := make(chan error, 1)
		go func() { done <- a.Close() }()
		stillWaiting(t, "closing a registration held through it", done)
		wantErrno(t, a.Hold(), unix.ENOENT)
		if err := b.Hold(); err != nil {
			t.Fatalf("a hold through the other registration: %v", err)
		}
		b.Release()
		fd := openFile(t, patternFile(t, 64<<10), unix.O_RDONLY)
		if n, err := l.Read(fd, 0, m.Addr(), 0, 64<<10, 0); err != nil || n != 64<<10 {
			t.Fatalf("a read while one registration closes: %d, %v", n, err)
		}
		checkPattern(t, deviceBytes(t, c, m, 0, 64<<10), 0)
		a.Release()
		held = false
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if d, err := l.Device(0); err != nil || d.Registrations != 1 {
			t.Fatalf("after one of two closed: %+v, %v", d, err)
		}
		// The other's holds do not keep this one open either.
		if err := b.Hold(); err != nil {
			t.Fatal(err)
		}
		c2 := register(t, l, m)
		if err := c2.Close(); err != nil {
			t.Fatalf("closing an unheld registration beside a held one: %v", err)
		}
		b.Release()
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if d, _ := l.Device(0); d.Registrations != 0 {
			t.Fatalf("%d registrations left", d.Registrations)
		}
		wantErrno(t, b.Close(), unix.EINVAL)
	})
}

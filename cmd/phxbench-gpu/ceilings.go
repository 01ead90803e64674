package main

import (
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
)

// The ceilings: what the hardware does without phxfs, measured side by side
// with the loads. pinnedCeiling copies from pinned host memory to the
// device; the read ceilings read the data section with -threads threads
// into pinned buffers, from the page cache (hot) and, after dropping the
// caches, with O_DIRECT and buffered (cold).

// pinnedCeiling measures pinned host-to-device copies, allocated before
// timing: whole-buffer copies on one stream, then threads streams.
func pinnedCeiling(rep *report, conn connector.Connector, mem connector.Memory, threads int) error {
	// One 1 GiB pinned buffer, one stream, whole-buffer copies.
	block := min(int64(gib), mem.Size()/(64<<10)*(64<<10))
	h, s, done, err := hostAndStream(conn, block)
	if err != nil {
		return err
	}
	defer done()
	n := min(mem.Size()/block, 8)
	copyAll := func() (time.Duration, error) {
		t0 := time.Now()
		for i := range n {
			if err := s.CopyToDevice(mem.Addr()+uint64(i*block), h.Bytes()); err != nil {
				return 0, err
			}
		}
		err := s.Synchronize()
		return time.Since(t0), err
	}
	if _, err := copyAll(); err != nil {
		return err
	}
	best, err := bestOf(2, copyAll)
	if err != nil {
		return err
	}
	rep.add(fmt.Sprintf("ceiling pinned H2D %dMiB copies", block/mib), n*block, best, "one stream")
	return pinnedStreams(rep, conn, mem, h, block, n*block, threads)
}

// pinnedStreams copies total bytes with threads streams, 4 MiB copies from
// per-thread slices of h, block bytes of pinned memory (the staged
// transport's shape without the reads).
func pinnedStreams(rep *report, conn connector.Connector, mem connector.Memory, h connector.HostMemory, block, total int64, threads int) error {
	lanes := make([]lane, threads)
	for i := range lanes {
		st, err := conn.NewStream(0)
		if err != nil {
			return err
		}
		defer st.Close()
		lanes[i] = lane{st, h.Bytes()[int64(i)*4*mib%(block-4*mib+1):][:4*mib]}
	}
	run := func() (time.Duration, error) {
		t0 := time.Now()
		var wg sync.WaitGroup
		errc := make(chan error, threads)
		for w := range lanes {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				if err := lanes[w].copyShare(mem, w, threads, total); err != nil {
					errc <- err
				}
			}(w)
		}
		wg.Wait()
		return time.Since(t0), firstErr(errc)
	}
	if _, err := run(); err != nil {
		return err
	}
	best, err := bestOf(2, run)
	if err != nil {
		return err
	}
	rep.add(fmt.Sprintf("ceiling pinned H2D %d streams x 4MiB", threads), total, best, "")
	return nil
}

// lane is one stream of pinnedStreams and the 4 MiB of pinned memory it
// copies from.
type lane struct {
	s connector.Stream
	b []byte
}

// copyShare copies lane w's share of total bytes (every threads-th 4 MiB,
// the last one cut at total) into mem and waits for it; a copy that fails fails the ceiling, which
// would otherwise count bytes that never moved.
func (ln lane) copyShare(mem connector.Memory, w, threads int, total int64) error {
	for off := int64(w) * 4 * mib; off < total; off += int64(threads) * 4 * mib {
		if err := ln.s.CopyToDevice(mem.Addr()+uint64(off), ln.b[:min(4*mib, total-off)]); err != nil {
			return fmt.Errorf("copy of 4 MiB to device offset %d: %w", off, err)
		}
	}
	if err := ln.s.Synchronize(); err != nil {
		return fmt.Errorf("stream of lane %d: %w", w, err)
	}
	return nil
}

// hostAndStream allocates a pinned host buffer and a copy stream on device
// 0; done releases both.
func hostAndStream(conn connector.Connector, size int64) (connector.HostMemory, connector.Stream, func(), error) {
	h, err := conn.AllocHost(size)
	if err != nil {
		return nil, nil, nil, err
	}
	s, err := conn.NewStream(0)
	if err != nil {
		h.Close()
		return nil, nil, nil, err
	}
	return h, s, func() { s.Close(); h.Close() }, nil
}

// openFile opens the file, buffered (the loads and the page-cache reads)
// and O_DIRECT, and allocates the read ceilings' pinned buffers.
func (b *bench) openFile() error {
	fd, err := unix.Open(b.o.file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	b.fd = fd
	b.onClose(func() { unix.Close(fd) })
	dfd, err := unix.Open(b.o.file, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	b.dfd = dfd
	b.onClose(func() { unix.Close(dfd) })
	b.bufs = make([][]byte, b.o.threads)
	for i := range b.bufs {
		h, err := b.conn.AllocHost(16*mib + 8192)
		if err != nil {
			return err
		}
		b.onClose(func() { h.Close() })
		b.bufs[i] = h.Bytes()
	}
	return nil
}

// read reads the data section of fd in chunks of cs (stripedRead).
func (b *bench) read(fd int, cs int64) error {
	return stripedRead(fd, b.start, b.dataLen, b.o.threads, cs, b.bufs)
}

// pageCacheCeiling reads the data section from the page cache (warmed
// first), the best of two per chunk size.
func (b *bench) pageCacheCeiling() error {
	if err := b.read(b.fd, 4*mib); err != nil {
		return err
	}
	for _, cs := range []int64{4 * mib, 16 * mib} {
		best, err := bestOf(2, func() (time.Duration, error) {
			return timed(func() error { return b.read(b.fd, cs) })
		})
		if err != nil {
			return err
		}
		b.rep.add(fmt.Sprintf("ceiling page-cache read %dx%dMiB", b.o.threads, cs/mib), b.dataLen, best, "hot, pread into pinned memory, no copy")
	}
	return nil
}

// coldCeilings reads the data section cold, O_DIRECT and buffered, same
// thread count.
func (b *bench) coldCeilings() error {
	for _, cs := range []int64{4 * mib, 16 * mib} {
		if err := b.coldRead(b.dfd, cs, fmt.Sprintf("ceiling cold O_DIRECT read %dx%dMiB", b.o.threads, cs/mib)); err != nil {
			return err
		}
	}
	return b.coldRead(b.fd, 4*mib, fmt.Sprintf("ceiling cold buffered read %dx4MiB", b.o.threads))
}

// coldRead drops the caches and times one read of the data section, once
// it is known cold (makeCold); the row is "not run" otherwise.
func (b *bench) coldRead(fd int, cs int64, name string) error {
	if why := makeCold(b.fd, b.start, b.dataLen); why != "" {
		b.rep.notRun(name, why)
		return nil
	}
	d, err := timed(func() error { return b.read(fd, cs) })
	if err != nil {
		return err
	}
	b.rep.add(name, b.dataLen, d, "")
	return nil
}

// stripedRead reads [start, start+n) of fd with threads goroutines, each
// reading chunks of size cs into its own buffer (round robin).
func stripedRead(fd int, start, n int64, threads int, cs int64, bufs [][]byte) error {
	var wg sync.WaitGroup
	errc := make(chan error, threads)
	for w := range threads {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			buf := bufs[w]
			for off := int64(w) * cs; off < n; off += int64(threads) * cs {
				l := min(cs, n-off)
				at, head, ln := alignedRead(start+off, l)
				got, err := unix.Pread(fd, buf[:ln], at)
				if err != nil {
					errc <- fmt.Errorf("pread %d at %d: %v", ln, at, err)
					return
				}
				if short(got, head, l) {
					errc <- fmt.Errorf("pread %d at %d: %d bytes, %d wanted from %d", ln, at, got, l, start+off)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	return firstErr(errc)
}

// alignedRead is how stripedRead reads l bytes at pos, so that O_DIRECT
// takes it: from pos rounded down to 4096 (head bytes before pos), ln
// bytes, a multiple of 4096.
func alignedRead(pos, l int64) (at, head, ln int64) {
	head = pos % 4096
	return pos - head, head, (head + l + 4095) / 4096 * 4096
}

// short says whether a read of got bytes from an aligned start missed
// some of the l bytes wanted after its head: the head bytes it also read
// count for nothing.
func short(got int, head, l int64) bool { return int64(got) < head+l }

// firstErr is the first error sent on errc; nil when none was.
func firstErr(errc <-chan error) error {
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

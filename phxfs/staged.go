package phxfs

import (
	"slices"
	"unsafe"

	"phxmount/connector"
	"phxmount/internal/errs"
	"phxmount/ioengine"
)

// stagedWorker is one pool worker's staged-transport state: bounce buffers
// (two by default, Config.StagedBuffers), so the storage read of one overlaps the
// device copies of the others, and a copy stream per bounce buffer per
// device. A bounce buffer is exactly BounceSize bytes: staged transfers are
// cut at file offsets that are multiples of it, so an O_DIRECT read widened
// to the file's alignment still fits (policy.go) without slack.
type stagedWorker struct {
	bounce  []connector.HostMemory
	streams map[int][]connector.Stream
}

func (w *stagedWorker) close() {
	for _, ss := range w.streams {
		for _, s := range ss {
			s.Close()
		}
	}
	for _, b := range w.bounce {
		if b != nil {
			b.Close()
		}
	}
}

// stagedWorkerFor returns worker w's state, creating it on first use. Only
// worker w's goroutine calls it with w.
func (l *Lib) stagedWorkerFor(w, dev int) (*stagedWorker, []connector.Stream, error) {
	sw := l.staged[w]
	if sw == nil {
		sw = &stagedWorker{streams: map[int][]connector.Stream{}, bounce: make([]connector.HostMemory, l.cfg.StagedBuffers)}
		for i := range sw.bounce {
			b, err := l.conn.AllocHost(l.cfg.BounceSize)
			if err != nil {
				sw.close()
				return nil, nil, errs.Wrapf(err, "phxfs: allocate bounce buffer")
			}
			sw.bounce[i] = b
		}
		l.staged[w] = sw
	}
	s := sw.streams[dev]
	if s == nil {
		s = make([]connector.Stream, len(sw.bounce))
		for i := range s {
			st, err := l.conn.NewStream(dev)
			if err != nil {
				for _, o := range s[:i] {
					o.Close()
				}
				return nil, nil, errs.Wrapf(err, "phxfs: create copy stream on device %d", dev)
			}
			s[i] = st
		}
		sw.streams[dev] = s
	}
	return sw, s, nil
}

// runStriped runs a plan that has staged transfers: xfers are striped
// round-robin across the workers; each runs its host transfers through its
// engine in one go and its staged ones through its bounce pipeline.
func (l *Lib) runStriped(p *plan) {
	workers := l.pool.Workers()
	mode := l.ODirectPolicy()
	tw := newODirectFiles(p, mode)
	defer tw.close()
	err := l.pool.Each(func(w int, eng ioengine.Engine) {
		var host []ioengine.Op
		var hostIdx, staged []int
		for i := w; i < len(p.xfers); i += workers {
			x := &p.xfers[i]
			if x.staged {
				staged = append(staged, i)
				continue
			}
			host = append(host, ioengine.Op{Fd: x.fd, Write: p.write, Addr: x.host, Len: x.len, Off: x.off})
			hostIdx = append(hostIdx, i)
		}
		if len(host) > 0 {
			if err := eng.Run(host); err != nil {
				for _, i := range hostIdx {
					p.xfers[i].result = -int64(errs.Errno(err))
				}
			} else {
				for k, i := range hostIdx {
					p.xfers[i].result = host[k].Result
				}
			}
		}
		if p.write {
			l.stagedWrite(w, eng, p.xfers, staged)
		} else {
			l.stagedRead(w, eng, p.xfers, staged, tw, mode)
		}
	})
	if err != nil {
		for i := range p.xfers {
			p.xfers[i].result = -int64(errs.Errno(err))
		}
	}
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// stagedRead reads each xfer into a bounce buffer and copies it to the
// device. The bounce buffers form two halves: the reads of one half are in
// flight together (one engine run) while the copies of the other half run,
// so a worker keeps half its buffers' worth of storage reads queued. Each
// read goes through the page cache or around it as policy.go decides.
func (l *Lib) stagedRead(w int, eng ioengine.Engine, xfers []xfer, idx []int, odf odirectFiles, mode ODirect) {
	r := stagedReader{l: l, w: w, eng: eng, xfers: xfers, odf: odf, mode: mode}
	for k := 0; k < len(idx); {
		k = r.group(idx, k)
	}
	r.settleAll()
}

// stagedReader is one worker's staged read of a plan's share.
type stagedReader struct {
	l     *Lib
	w     int
	eng   ioengine.Engine
	xfers []xfer
	odf   odirectFiles
	mode  ODirect

	sw      *stagedWorker
	streams []connector.Stream
	pending []int // xfer whose copy is in flight from each bounce buffer, -1 none
	half    int
	reads   []stagedRead
	ops     []ioengine.Op
}

// stagedRead is one read of a group: the xfer, its bounce buffer, and how
// it is read.
type stagedRead struct {
	x      *xfer
	i      int
	slot   int
	odf    *odirectFile // O_DIRECT: the descriptor, and x's bytes at head of span
	head   int64
	span   int64
	direct bool
}

// settle waits for the copy in flight from a bounce buffer.
func (r *stagedReader) settle(slot int) {
	if r.pending[slot] < 0 {
		return
	}
	if err := r.streams[slot].Synchronize(); err != nil {
		r.xfers[r.pending[slot]].result = -int64(errs.Errno(err))
	}
	r.pending[slot] = -1
}

func (r *stagedReader) settleAll() {
	for slot := range r.pending {
		r.settle(slot)
	}
}

// group reads the next group from idx[k]: up to half the bounce buffers'
// worth of xfers of one device, at once, then copies each to the device.
// It returns where the next group starts.
func (r *stagedReader) group(idx []int, k int) int {
	x := &r.xfers[idx[k]]
	sw, s, err := r.l.stagedWorkerFor(r.w, x.dev)
	if err != nil {
		x.result = -int64(errs.Errno(err))
		return k + 1
	}
	if r.streams != nil && &r.streams[0] != &s[0] {
		r.settleAll() // another device: let the previous device's copies finish
	}
	if r.pending == nil {
		r.pending = slices.Repeat([]int{-1}, len(s))
	}
	r.sw, r.streams = sw, s
	k = r.plan(idx, k, x.dev)
	r.half ^= 1
	runErr := r.eng.Run(r.ops)
	for n, rd := range r.reads {
		r.land(rd, r.ops[n].Result, runErr)
	}
	return k
}

// plan lays out the group's reads into this half's bounce buffers.
func (r *stagedReader) plan(idx []int, k, dev int) int {
	g := max(len(r.streams)/2, 1)
	r.reads, r.ops = r.reads[:0], r.ops[:0]
	for ; k < len(idx) && len(r.reads) < g && r.xfers[idx[k]].dev == dev; k++ {
		y := &r.xfers[idx[k]]
		slot := (r.half*g + len(r.reads)) % len(r.streams)
		r.settle(slot)
		buf := r.sw.bounce[slot].Bytes()
		rd := stagedRead{x: y, i: idx[k], slot: slot}
		if t, start, head, span, ok := r.odf.directSpan(y, r.mode, addrOf(buf), int64(len(buf))); ok {
			rd.odf, rd.head, rd.span, rd.direct = t, head, span, true
			r.ops = append(r.ops, ioengine.Op{Fd: t.fd, Addr: addrOf(buf), Len: span, Off: start})
		} else {
			r.ops = append(r.ops, ioengine.Op{Fd: y.fd, Addr: addrOf(buf), Len: y.len, Off: y.off})
		}
		r.reads = append(r.reads, rd)
	}
	return k
}

// land takes a read's result (got bytes, or the run's error), redoes a
// failed or short O_DIRECT read through the page cache, and starts the copy
// of the bytes to the device.
func (r *stagedReader) land(rd stagedRead, got int64, runErr error) {
	l := r.l
	buf := r.sw.bounce[rd.slot].Bytes()
	data := buf
	switch {
	case runErr != nil:
		got = -int64(errs.Errno(runErr))
	case rd.direct && got == rd.span:
		l.stagedStats.directReads.Add(1)
		l.stagedStats.directBytes.Add(rd.x.len)
		data, got = buf[rd.head:], rd.x.len
	case rd.direct:
		// Failed or short (the file shrank, the file system changed its
		// mind): redo it buffered, and stop trying on an error.
		if got < 0 {
			rd.odf.broken.Store(true)
		}
		l.stagedStats.fallback(rd.x.off, rd.span, got)
		data, got = l.readBuffered(r.eng, rd.x, buf)
	case got > 0:
		l.stagedStats.bufferedReads.Add(1)
		l.stagedStats.bufferedBytes.Add(got)
	}
	rd.x.result = got
	if got <= 0 {
		return
	}
	if err := r.streams[rd.slot].CopyToDevice(rd.x.devAddr, data[:got]); err != nil {
		rd.x.result = -int64(errs.Errno(err))
		return
	}
	r.pending[rd.slot] = rd.i
}

// readBuffered reads x through the page cache into buf.
func (l *Lib) readBuffered(eng ioengine.Engine, x *xfer, buf []byte) ([]byte, int64) {
	op := []ioengine.Op{{Fd: x.fd, Addr: addrOf(buf), Len: x.len, Off: x.off}}
	if err := eng.Run(op); err != nil {
		return buf, -int64(errs.Errno(err))
	}
	if op[0].Result > 0 {
		l.stagedStats.bufferedReads.Add(1)
		l.stagedStats.bufferedBytes.Add(op[0].Result)
	}
	return buf, op[0].Result
}

// stagedWrite copies each xfer from the device into a bounce buffer and
// writes it to the file; the copy of the next runs while one is written.
func (l *Lib) stagedWrite(w int, eng ioengine.Engine, xfers []xfer, idx []int) {
	fetch := func(k int) (*stagedWorker, connector.Stream, error) {
		x := &xfers[idx[k]]
		sw, s, err := l.stagedWorkerFor(w, x.dev)
		if err != nil {
			return nil, nil, err
		}
		st := s[k%2]
		return sw, st, st.CopyFromDevice(sw.bounce[k%2].Bytes()[:x.len], x.devAddr)
	}
	type fetched struct {
		sw  *stagedWorker
		st  connector.Stream
		err error
	}
	var next fetched
	if len(idx) > 0 {
		next.sw, next.st, next.err = fetch(0)
	}
	for k, i := range idx {
		x := &xfers[i]
		cur := next
		if k+1 < len(idx) {
			next.sw, next.st, next.err = fetch(k + 1)
		}
		if cur.err == nil {
			cur.err = cur.st.Synchronize()
		}
		if cur.err != nil {
			x.result = -int64(errs.Errno(cur.err))
			continue
		}
		buf := cur.sw.bounce[k%2].Bytes()
		op := []ioengine.Op{{Fd: x.fd, Write: true, Addr: addrOf(buf), Len: x.len, Off: x.off}}
		if err := eng.Run(op); err != nil {
			x.result = -int64(errs.Errno(err))
			continue
		}
		x.result = op[0].Result
	}
}

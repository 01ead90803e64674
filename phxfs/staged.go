package phxfs

import (
	"unsafe"

	"phxmount/connector"
	"phxmount/internal/errs"
	"phxmount/ioengine"
)

// stagedWorker is one pool worker's staged-transport state: bounce buffers
// (two by default, Config.StagedBuffers), so the storage read of one overlaps the
// device copies of the others, and a copy stream per bounce buffer per
// device. Each bounce buffer
// has dioSlack bytes past BounceSize so that an O_DIRECT read widened to
// the file's alignment fits (see policy.go).
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
			b, err := l.conn.AllocHost(l.cfg.BounceSize + dioSlack)
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
func (l *Lib) stagedRead(w int, eng ioengine.Engine, xfers []xfer, idx []int, tw odirectFiles, mode ODirect) {
	var pending []int // xfer whose copy is in flight from each bounce buffer, -1 none
	var streams []connector.Stream
	settle := func(slot int) {
		if pending[slot] < 0 {
			return
		}
		if err := streams[slot].Synchronize(); err != nil {
			xfers[pending[slot]].result = -int64(errs.Errno(err))
		}
		pending[slot] = -1
	}
	settleAll := func() {
		for slot := range pending {
			settle(slot)
		}
	}
	type read struct {
		x           *xfer
		i           int
		slot        int
		odirectFile *odirectFile
		head        int64
		span        int64
		direct      bool
	}
	var group []read
	var ops []ioengine.Op
	half := 0
	for k := 0; k < len(idx); {
		x := &xfers[idx[k]]
		sw, s, err := l.stagedWorkerFor(w, x.dev)
		if err != nil {
			x.result = -int64(errs.Errno(err))
			k++
			continue
		}
		if streams != nil && &streams[0] != &s[0] {
			settleAll() // another device: let the previous device's copies finish
		}
		if pending == nil {
			pending = make([]int, len(s))
			for i := range pending {
				pending[i] = -1
			}
		}
		streams = s
		g := max(len(s)/2, 1)
		// The next group: up to g xfers of this device, into this half.
		group, ops = group[:0], ops[:0]
		for ; k < len(idx) && len(group) < g && xfers[idx[k]].dev == x.dev; k++ {
			y := &xfers[idx[k]]
			slot := (half*g + len(group)) % len(s)
			settle(slot)
			buf := sw.bounce[slot].Bytes()
			r := read{x: y, i: idx[k], slot: slot}
			if t, start, head, span, ok := tw.directSpan(y, mode, addrOf(buf), int64(len(buf))); ok {
				r.odirectFile, r.head, r.span, r.direct = t, head, span, true
				ops = append(ops, ioengine.Op{Fd: t.fd, Addr: addrOf(buf), Len: span, Off: start})
			} else {
				ops = append(ops, ioengine.Op{Fd: y.fd, Addr: addrOf(buf), Len: y.len, Off: y.off})
			}
			group = append(group, r)
		}
		half ^= 1
		runErr := eng.Run(ops)
		for n, r := range group {
			buf := sw.bounce[r.slot].Bytes()
			data, got := buf, ops[n].Result
			switch {
			case runErr != nil:
				got = -int64(errs.Errno(runErr))
			case r.direct && got == r.span:
				l.stagedStats.directReads.Add(1)
				l.stagedStats.directBytes.Add(r.x.len)
				data, got = buf[r.head:], r.x.len
			case r.direct:
				// Failed or short (the file shrank, the file system changed
				// its mind): redo it buffered, and stop trying on an error.
				if got < 0 {
					r.odirectFile.broken.Store(true)
				}
				l.stagedStats.fallback(r.x.off, r.span, got)
				data, got = l.readBuffered(eng, r.x, buf)
			case got > 0:
				l.stagedStats.bufferedReads.Add(1)
				l.stagedStats.bufferedBytes.Add(got)
			}
			r.x.result = got
			if got <= 0 {
				continue
			}
			if err := s[r.slot].CopyToDevice(r.x.devAddr, data[:got]); err != nil {
				r.x.result = -int64(errs.Errno(err))
				continue
			}
			pending[r.slot] = r.i
		}
	}
	if pending != nil {
		settleAll()
	}
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

package phxfs

import (
	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/ioengine"
)

// stagedWrite writes the xfers idx (worker w's share) through w's slots:
// each slot gathers the device bytes of several xfers with one gather and
// a fence, then writes them in one engine run. While one slot is written,
// the gathers of the others run.
func (l *Lib) stagedWrite(w int, eng ioengine.Engine, xfers []xfer, idx []int) {
	if len(idx) == 0 {
		return
	}
	slots := l.staged.slots[w]
	wr := stagedWriter{l: l, w: w, eng: eng, xfers: xfers, slots: slots, sf: make(slotFences, len(slots))}
	// wbf is made on the first kick: release what it holds by then.
	defer func() { wr.wbf.release() }()
	var pending []int // slots gathered, oldest first
	next := 0
	for k := 0; k < len(idx) || len(pending) > 0; {
		for len(pending) < len(slots) && k < len(idx) {
			k = wr.gather(next, idx, k)
			pending = append(pending, next)
			next = (next + 1) % len(slots)
		}
		wr.flush(pending[0])
		pending = pending[1:]
	}
}

// stagedWriter is one worker's staged write of its share of a plan.
type stagedWriter struct {
	l     *Lib
	w     int
	eng   ioengine.Engine
	xfers []xfer
	slots [][]byte
	sf    slotFences
	fill  [][]slotWrite // per slot: the xfers it carries
	wbf   wbFiles       // the files this worker started writeback of
}

// slotWrite is one xfer in a slot.
type slotWrite struct {
	i  int
	at int64
}

// gather packs the next xfers of one device into slot and queues their
// gather and the slot's fence. It returns the first xfer left out.
func (wr *stagedWriter) gather(slot int, idx []int, k int) int {
	if wr.fill == nil {
		wr.fill = make([][]slotWrite, len(wr.slots))
	}
	dev := wr.xfers[idx[k]].dev
	size := int64(len(wr.slots[slot]))
	fill := wr.fill[slot][:0]
	var pieces []connector.Piece
	var carried []int
	var pos int64
	for ; k < len(idx) && wr.xfers[idx[k]].dev == dev; k++ {
		x := &wr.xfers[idx[k]]
		at := alignUp(pos, packAlign)
		if at+x.len > size && len(fill) > 0 {
			break
		}
		fill = append(fill, slotWrite{i: idx[k], at: at})
		pieces = append(pieces, connector.Piece{Off: at, Dev: x.devAddr, Len: x.len})
		carried = append(carried, idx[k])
		pos = at + x.len
	}
	wr.fill[slot] = fill
	ss, err := wr.l.stagedStreams(dev)
	if err != nil {
		fail(wr.xfers, carried, err)
		return k
	}
	wr.sf.start(slot, ss[wr.w], wr.slots[slot], pieces, carried, true, wr.xfers)
	return k
}

// flush waits for slot's gather and writes, in one engine run, the xfers
// whose bytes arrived (a failed gather gave the others their result).
func (wr *stagedWriter) flush(slot int) {
	buf := wr.slots[slot]
	wr.sf.await(slot, buf, wr.xfers)
	var ops []ioengine.Op
	var idx []int
	for _, sw := range wr.fill[slot] {
		x := &wr.xfers[sw.i]
		if x.result != notRun {
			continue
		}
		ops = append(ops, ioengine.Op{Fd: x.fd, Write: true, Addr: addrOf(buf[sw.at:]), Len: x.len, Off: x.off})
		idx = append(idx, sw.i)
	}
	wr.l.runOps(wr.eng, wr.xfers, ops, idx)
	wr.startWriteback(idx)
}

// startWriteback queues the start of writeback of every xfer of idx
// large enough to call for it (writeback.go), once it is written.
func (wr *stagedWriter) startWriteback(idx []int) {
	wb := &wr.l.wb
	for _, i := range idx {
		x := &wr.xfers[i]
		if !wb.wants(x.result) {
			continue
		}
		if wr.wbf == nil {
			wr.wbf = wbFiles{}
		}
		wr.wbf.kick(wb, x.fd, x.off, x.result)
	}
}

package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/nvidia"
	"github.com/phxmount/phxmount/phxfs"
)

// The phxfs loads: the library called in-process (no mount) loads the
// whole data section into the device buffer with the staged transport. A
// sweep over workers, bounce size, engine, bounce buffers and round size
// runs hot; the configuration fastest at the daemon's shape (-workers,
// -bounce) then loads the file hot and cold.

// plan is the loader's request list: every tensor cut at 128 MiB, the data
// section laid out in the buffer as in the file.
func plan(ts []tensor, fd int, start int64, mem connector.Memory) []phxfs.Request {
	var rs []phxfs.Request
	for _, t := range ts {
		for o := t.Begin; o < t.End; o += chunk {
			n := min(chunk, t.End-o)
			rs = append(rs, phxfs.Request{Fd: fd, Device: 0, DevAddr: mem.Addr(), BufOffset: o, Len: n, FileOffset: start + o})
		}
	}
	return rs
}

// load times one load of the data section by a new library with w workers
// and bounce size bs, in the configuration b holds (engine, buffers, round,
// policy). The buffer is registered before the clock starts, as the
// reference pipelines allocate theirs: registering makes the library's
// bounce buffers and copy streams.
func (b *bench) load(w int, bs int64) (time.Duration, error) {
	l, err := phxfs.New(phxfs.Config{Connector: b.conn, Engine: b.engine, Workers: w, BounceSize: bs, Transport: phxfs.Staged,
		RoundBytes: b.round * mib, StagedBuffers: b.buffers, ODirect: b.policy})
	if err != nil {
		return 0, err
	}
	defer l.Close()
	defer func() { b.last = l.StagedStats() }()
	if err := l.OpenDevice(0); err != nil {
		return 0, err
	}
	if _, err := l.RegMem(0, b.mem.Addr(), b.size); err != nil {
		return 0, err
	}
	rs := append([]phxfs.Request(nil), b.reqs...)
	t0 := time.Now()
	n, err := l.ReadBatch(rs)
	if err != nil || n != 0 {
		return 0, fmt.Errorf("phxfs batch: %d failed, %v", n, err)
	}
	d := time.Since(t0)
	return d, l.DeregMem(0, b.mem.Addr(), b.size)
}

// point is one configuration of the sweep.
type point struct {
	engine  string
	buffers int   // bounce buffers per worker
	round   int64 // MiB per worker
	workers int
	bounce  int64 // bytes
}

// sweepPoints is the sweep's grid (-sweep-*), in the order it runs.
func sweepPoints(o benchOpts) []point {
	es, ss, rs := parseList(o.sweepE, nonEmpty), parseList(o.sweepS, strconv.Atoi), parseList(o.sweepR, parseInt64)
	ws, bs := parseList(o.sweepW, strconv.Atoi), parseList(o.sweepB, parseMiB)
	var ps []point
	for _, e := range es {
		for _, nb := range ss {
			for _, r := range rs {
				for _, w := range ws {
					for _, b := range bs {
						ps = append(ps, point{e, nb, r, w, b})
					}
				}
			}
		}
	}
	return ps
}

// parseList is the elements of the comma-separated s that conv accepts;
// the others are left out.
func parseList[T any](s string, conv func(string) (T, error)) []T {
	var xs []T
	for _, x := range strings.Split(s, ",") {
		if v, err := conv(x); err == nil {
			xs = append(xs, v)
		}
	}
	return xs
}

func nonEmpty(s string) (string, error) {
	if s == "" {
		return "", errors.New("empty")
	}
	return s, nil
}

func parseInt64(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }

func parseMiB(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mib, err
}

// sweep runs the hot sweep (profiled with -cpuprofile) and leaves in b,
// for the hot and cold loads, the engine, buffers and round fastest at the
// daemon's shape.
func (b *bench) sweep() error {
	b.reqs = plan(b.ts, b.fd, b.start, b.mem)
	b.engine, b.buffers, b.round, b.policy = "io_uring", 2, 64, phxfs.ODirectAuto
	ps := sweepPoints(b.o)
	if b.o.cpuprofile != "" {
		pf, err := os.Create(b.o.cpuprofile)
		if err != nil {
			return err
		}
		pprof.StartCPUProfile(pf)
		defer pf.Close()
	}
	chosen, err := b.runSweep(ps)
	if err != nil {
		return err
	}
	if b.o.cpuprofile != "" {
		pprof.StopCPUProfile()
	}
	b.engine, b.buffers, b.round = chosen.engine, chosen.buffers, chosen.round
	b.rep.Chosen["workers"], b.rep.Chosen["bounce"], b.rep.Chosen["buffers"] = int64(b.o.workers), b.o.bounce*mib, int64(b.buffers)
	b.rep.Env["engine"] = b.engine
	return nil
}

// runSweep measures every point, best of two hot loads each, records the
// fastest anywhere in the report and returns the fastest at the daemon's
// shape (workers, bounce): its engine, buffers and round.
func (b *bench) runSweep(ps []point) (point, error) {
	bestRate, bestAt := 0.0, 0.0
	chosen := point{engine: "io_uring", buffers: 2, round: 64}
	for _, p := range ps {
		b.engine, b.buffers, b.round = p.engine, p.buffers, p.round
		best, err := bestOf(2, func() (time.Duration, error) { return b.load(p.workers, p.bounce) })
		if err != nil {
			return chosen, err
		}
		x := newResult(fmt.Sprintf("phxfs hot %s %d workers x %d MiB x %d buffers, round %d MiB, sync %s",
			p.engine, p.workers, p.bounce/mib, p.buffers, p.round, os.Getenv(nvidia.EnvSync)), b.dataLen, best, "")
		b.rep.addSweep(x)
		if x.GBps > bestRate {
			bestRate = x.GBps
			b.rep.Chosen["sweep_best_workers"], b.rep.Chosen["sweep_best_bounce"], b.rep.Chosen["sweep_best_buffers"] = int64(p.workers), p.bounce, int64(p.buffers)
			b.rep.Env["sweep_best_engine"] = p.engine
		}
		if p.workers == b.o.workers && p.bounce == b.o.bounce*mib && x.GBps > bestAt {
			bestAt, chosen = x.GBps, p
		}
	}
	return chosen, nil
}

// hotLoad loads the file hot in the chosen configuration, the best of
// three, and checks the bytes.
func (b *bench) hotLoad() error {
	if err := zero(b.conn, b.mem); err != nil {
		return err
	}
	best, err := bestOf(3, func() (time.Duration, error) { return b.load(b.o.workers, b.o.bounce*mib) })
	if err != nil {
		return err
	}
	b.rep.add("phxfs in-process library (Go) hot", b.dataLen, best,
		fmt.Sprintf("%s, %d workers x %d MiB x %d buffers, registered before the clock", b.engine, b.o.workers, b.o.bounce, b.buffers))
	if err := verify(b.conn, b.mem, b.o.file, b.start, b.ts); err != nil {
		return fmt.Errorf("phxfs hot load: %v", err)
	}
	fmt.Println("verify: phxfs hot load equals the file (sampled ranges and every tensor's ends)")
	return nil
}

// coldLoads loads the file cold under each O_DIRECT policy, checking the
// bytes, and reports the last load's staged counters. A load whose file
// could not be made cold (makeCold) is a "not run" row.
func (b *bench) coldLoads() error {
	ran := 0
	for _, mode := range []phxfs.ODirect{phxfs.ODirectAuto, phxfs.ODirectNever} {
		b.policy = mode
		name := "phxfs in-process library (Go) cold, policy " + mode.String()
		if err := zero(b.conn, b.mem); err != nil {
			return err
		}
		if why := makeCold(b.fd, b.start, b.dataLen); why != "" {
			b.rep.notRun(name, why)
			continue
		}
		d, err := b.load(b.o.workers, b.o.bounce*mib)
		if err != nil {
			return err
		}
		s := b.last
		b.rep.add(name, b.dataLen, d, fmt.Sprintf("%d O_DIRECT reads, %d buffered, %d fallbacks", s.DirectReads, s.BufferedReads, s.Fallbacks))
		if err := verify(b.conn, b.mem, b.o.file, b.start, b.ts); err != nil {
			return fmt.Errorf("phxfs cold load (%v): %v", mode, err)
		}
		ran++
	}
	if ran == 0 {
		return nil
	}
	s := b.last
	b.rep.Staged = map[string]any{"direct_reads": s.DirectReads, "buffered_reads": s.BufferedReads, "fallbacks": s.Fallbacks, "cachestat": s.Cachestat}
	fmt.Println("verify: phxfs cold loads equal the file")
	return nil
}

// zero clears device memory through the copy engine (64 MiB at a time).
func zero(conn connector.Connector, mem connector.Memory) error {
	h, s, done, err := hostAndStream(conn, 64*mib)
	if err != nil {
		return err
	}
	defer done()
	clear(h.Bytes())
	for off := int64(0); off < mem.Size(); off += 64 * mib {
		if err := s.CopyToDevice(mem.Addr()+uint64(off), h.Bytes()[:min(64*mib, mem.Size()-off)]); err != nil {
			return err
		}
	}
	return s.Synchronize()
}

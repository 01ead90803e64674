package phxfs

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// Writeback: a large staged write (a checkpoint being saved) starts the
// kernel's writeback of what it wrote at once, with
// sync_file_range(SYNC_FILE_RANGE_WRITE), rather than leaving the pages
// dirty until the flusher's timer or the caller's fsync. The disk then
// writes while the save is still copying, and an fsync at the end has
// little left to do. Nothing waits for that writeback and nothing is
// skipped: what an fsync promises is the kernel's business, unchanged.
//
// A write qualifies by its size: an engine operation of at least
// Config.WritebackMin bytes (or of a whole bounce buffer, when that is
// smaller). A save's tensors are cut into bounce-sized operations; KV-cache
// blocks, scattered and rewritten often, are smaller and stay in the page
// cache as written.
//
// The kicks run in order on a goroutine of their own, fed by a bounded
// queue, so that a busy disk never holds up a worker; a kick that finds the
// queue full is dropped (the flusher or an fsync writes those pages
// anyway). They use a descriptor of their own, the regular file reopened
// read-only: it keeps the file open for them whatever its owner closes
// meanwhile and shares nothing with it (no lock, no open file
// description). Anything but a regular file is left alone.

// DefaultWritebackMin is the least size of a staged write operation that
// starts writeback by default (Config.WritebackMin).
const DefaultWritebackMin = 2 << 20

// EnvWriteback names the variable that sets the size (bytes, or with a
// KiB, MiB or GiB suffix), turns writeback kicks off (off) or keeps the
// default (auto, or unset) when Config.WritebackMin is 0.
const EnvWriteback = "PHX_WRITEBACK"

// writebackQueue bounds the kicks waiting for the kicker: 256 bounce
// buffers' worth (1 GiB of 4 MiB operations).
const writebackQueue = 256

// writebackMinFrom resolves Config.WritebackMin: the config's, else
// PHX_WRITEBACK's, else the default; -1 after this means never.
func writebackMinFrom(n int64) (int64, error) {
	if n != 0 {
		return max(n, -1), nil
	}
	v := os.Getenv(EnvWriteback)
	switch v {
	case "", "auto", "on":
		return DefaultWritebackMin, nil
	case "off", "never":
		return -1, nil
	}
	size, ok := parseBytes(v)
	if !ok {
		return 0, errs.New(unix.EINVAL, "phxfs: %s=%q: want auto, off or a size in bytes (KiB, MiB, GiB suffixes)", EnvWriteback, v)
	}
	return size, nil
}

// parseBytes reads a positive byte count: digits, then KiB, MiB or GiB
// or nothing.
func parseBytes(s string) (int64, bool) {
	mult := int64(1)
	for i, suffix := range []string{"KiB", "MiB", "GiB"} {
		if t, ok := strings.CutSuffix(s, suffix); ok {
			s, mult = t, 1<<(10*(i+1))
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, false
	}
	return n * mult, true
}

// writeback is the library's writeback kicker.
type writeback struct {
	min     int64 // least bytes of one operation that starts writeback; -1: never
	queue   chan wbKick
	stopped chan struct{}
	stop    sync.Once
	pending sync.WaitGroup // kicks queued and not yet issued

	kicks, bytes, dropped, failed atomic.Int64
}

// wbKick is one range of a file to start writing back.
type wbKick struct {
	f      *wbFile
	off, n int64
}

// wbFile is a file being written back: a read-only descriptor of its own,
// closed when the worker that opened it and every kick queued on it are
// done with it.
type wbFile struct {
	fd   int
	refs atomic.Int32
}

func (f *wbFile) release() {
	if f.refs.Add(-1) == 0 {
		unix.Close(f.fd)
	}
}

// start makes the kicker (none when min is -1).
func (wb *writeback) start(min int64) {
	wb.min = min
	if min < 0 {
		return
	}
	wb.queue = make(chan wbKick, writebackQueue)
	wb.stopped = make(chan struct{})
	go wb.run()
}

func (wb *writeback) run() {
	defer close(wb.stopped)
	for k := range wb.queue {
		if err := unix.SyncFileRange(k.f.fd, k.off, k.n, unix.SYNC_FILE_RANGE_WRITE); err != nil {
			wb.failed.Add(1)
		} else {
			wb.kicks.Add(1)
			wb.bytes.Add(k.n)
		}
		k.f.release()
		wb.pending.Done()
	}
}

// close ends the kicker once the kicks queued are issued; no worker may
// queue one any more (the library's devices are closed).
func (wb *writeback) close() {
	if wb.queue == nil {
		return
	}
	wb.stop.Do(func() { close(wb.queue) })
	<-wb.stopped
}

// wants reports whether a write of n bytes starts writeback.
func (wb *writeback) wants(n int64) bool { return wb.min > 0 && n >= wb.min }

// open returns a descriptor of the regular file fd reaches, for kicks;
// nil for anything else (a device's open may do things of its own) or
// when the file cannot be reopened (then it gets none).
func (wb *writeback) open(fd int) *wbFile {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	kfd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(fd), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		wb.failed.Add(1)
		return nil
	}
	f := &wbFile{fd: kfd}
	f.refs.Store(1)
	return f
}

// push queues the start of writeback of [off, off+n) of f, or drops it
// when the queue is full.
func (wb *writeback) push(f *wbFile, off, n int64) {
	f.refs.Add(1)
	wb.pending.Add(1)
	select {
	case wb.queue <- wbKick{f: f, off: off, n: n}:
	default:
		f.refs.Add(-1) // the caller still holds its own reference
		wb.pending.Done()
		wb.dropped.Add(1)
	}
}

// wbFiles are the files one worker has kicks for, by the descriptor the
// plan writes through; released when the worker's share is written.
type wbFiles map[int]*wbFile

// kick queues the start of writeback of n bytes at off of fd, which the
// worker has just written.
func (fs wbFiles) kick(wb *writeback, fd int, off, n int64) {
	f, seen := fs[fd]
	if !seen {
		f = wb.open(fd)
		fs[fd] = f
	}
	if f != nil {
		wb.push(f, off, n)
	}
}

func (fs wbFiles) release() {
	for _, f := range fs {
		if f != nil {
			f.release()
		}
	}
}

// WritebackStats are the writeback kicker's figures since New.
type WritebackStats struct {
	// Min is the least size of a staged write operation that starts
	// writeback (-1: never).
	Min     int64
	Kicks   int64 // ranges whose writeback was started
	Bytes   int64 // their bytes
	Dropped int64 // kicks dropped because the queue was full
	Failed  int64 // files that could not be reopened, or sync_file_range errors
}

// WritebackStats returns the writeback kicker's figures.
func (l *Lib) WritebackStats() WritebackStats {
	wb := &l.wb
	return WritebackStats{Min: wb.min, Kicks: wb.kicks.Load(), Bytes: wb.bytes.Load(), Dropped: wb.dropped.Load(),
		Failed: wb.failed.Load()}
}

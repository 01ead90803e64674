package phxfs

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/ioengine"
)

// This file is the staged transport's read policy: per transfer, read
// through the page cache or around it with O_DIRECT.
//
//   - A range the page cache holds (any page of it cached, dirty or under
//     writeback) is read buffered: the copy from the cache is the fastest
//     path there is, and the cache is never thrown away.
//   - A cold range is read with O_DIRECT on a second descriptor of the same
//     file, widened to the file's O_DIRECT alignment inside the bounce buffer
//     (so unaligned requests qualify too): no page-cache fill, no extra copy.
//   - The last, partial block of a file, a file system without O_DIRECT, a
//     descriptor already opened O_DIRECT and a kernel without cachestat(2)
//     (Linux < 6.5) all read buffered. A failed or short O_DIRECT read is
//     retried buffered, so the policy never changes a result.
//
// Residency comes from cachestat(2). The O_DIRECT descriptor is opened once
// per file per batch (by reopening /proc/self/fd/N), only when a cold range
// is found.
//
// The O_DIRECT policy is Config.ODirect (or PHX_DIRECT_IO=auto|never|always when
// the config leaves it at auto), changeable with Lib.SetODirect; the
// counters are Lib.StagedStats.

// ODirect is the staged transport's O_DIRECT policy: when its reads go
// around the page cache.
type ODirect int32

const (
	// ODirectAuto reads cold ranges with O_DIRECT and resident ones
	// buffered (the default).
	ODirectAuto ODirect = iota
	// ODirectNever reads everything buffered.
	ODirectNever
	// ODirectAlways reads with O_DIRECT wherever the file allows it, cached
	// or not (for tests and measurements).
	ODirectAlways
)

// EnvODirect names the environment variable read at start.
const EnvODirect = "PHX_DIRECT_IO"

func (d ODirect) String() string {
	switch d {
	case ODirectAuto:
		return "auto"
	case ODirectNever:
		return "never"
	case ODirectAlways:
		return "always"
	}
	return "ODirect(" + strconv.Itoa(int(d)) + ")"
}

// ParseODirect parses "auto" (or ""), "never" or "always".
func ParseODirect(s string) (ODirect, error) {
	switch s {
	case "", "auto":
		return ODirectAuto, nil
	case "never", "off":
		return ODirectNever, nil
	case "always", "on":
		return ODirectAlways, nil
	}
	return ODirectAuto, errs.New(unix.EINVAL, "phxfs: direct I/O policy %q: want auto, never or always", s)
}

// EnvStagedBuffers names the environment variable New reads when
// Config.StagedBuffers is 0 (2 to 32).
const EnvStagedBuffers = "PHX_STAGED_BUFFERS"

// stagedBuffersFrom resolves the bounce buffers per staged worker: the
// config's, else the environment's, else 2. A value outside 2 to 32, or an
// environment value that is not a number, is an error, not clamped.
func stagedBuffersFrom(n int) (int, error) {
	what := "Config.StagedBuffers"
	if n == 0 {
		v := os.Getenv(EnvStagedBuffers)
		if v == "" {
			return 2, nil
		}
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			return 0, errs.New(unix.EINVAL, "phxfs: %s=%q is not a number (2 to 32)", EnvStagedBuffers, v)
		}
		what = EnvStagedBuffers
	}
	if n < 2 || n > 32 {
		return 0, errs.New(unix.EINVAL, "phxfs: %s=%d: bounce buffers per worker must be 2 to 32", what, n)
	}
	return n, nil
}

// odirectFrom resolves the read policy: the config's, or the environment's
// where the config leaves the default.
func odirectFrom(d ODirect) (ODirect, error) {
	if d != ODirectAuto {
		return d, nil
	}
	v := os.Getenv(EnvODirect)
	d, err := ParseODirect(v)
	if err != nil {
		return d, errs.New(unix.EINVAL, "phxfs: %s=%q: want auto, never or always", EnvODirect, v)
	}
	return d, nil
}

// SetODirect changes the staged read policy and returns the previous one.
// Batches already running keep the old one.
func (l *Lib) SetODirect(d ODirect) ODirect { return ODirect(l.directIO.Swap(int32(d))) }

// ODirectPolicy returns the staged read policy.
func (l *Lib) ODirectPolicy() ODirect { return ODirect(l.directIO.Load()) }

// StagedStats counts the staged transport's storage reads.
type StagedStats struct {
	DirectReads   int64 // reads done with O_DIRECT
	DirectBytes   int64 // bytes they delivered to the device
	BufferedReads int64 // reads through the page cache
	BufferedBytes int64
	GatheredReads int64 // transfers copied from a mapping of the file (gather.go)
	GatheredBytes int64
	Fallbacks     int64 // O_DIRECT reads that failed or came up short and were redone buffered
	// FallbackWhy describes the first fallback ("" before one happened).
	FallbackWhy string
	Cachestat   bool // cachestat(2) works on this kernel (as far as seen)
}

type stagedCounters struct {
	directReads, directBytes, bufferedReads, bufferedBytes, fallbacks atomic.Int64
	gatheredReads, gatheredBytes                                      atomic.Int64
	fallbackWhy                                                       atomic.Pointer[string]
}

// fallback counts an O_DIRECT read of span bytes at off that got got
// (bytes or -errno) and was redone buffered; the first one's reason stays.
func (c *stagedCounters) fallback(off, span, got int64) {
	c.fallbacks.Add(1)
	if c.fallbackWhy.Load() != nil {
		return
	}
	why := fmt.Sprintf("an O_DIRECT read of %d bytes at %d returned %d bytes", span, off, got)
	if got < 0 {
		why = fmt.Sprintf("an O_DIRECT read of %d bytes at %d failed: %v (O_DIRECT stays off for that file in that batch)", span, off, unix.Errno(-got))
	}
	c.fallbackWhy.CompareAndSwap(nil, &why)
}

// noCachestat records that this kernel has no cachestat(2): a fact about the
// machine, not the library instance, probed once (probeCachestat).
var (
	noCachestat    atomic.Bool
	cachestatProbe sync.Once
)

// probeCachestat asks the kernel once whether it has cachestat(2), on a
// memfd of its own, so that StagedStats says so before the first read.
func probeCachestat() {
	cachestatProbe.Do(func() {
		fd, err := unix.MemfdCreate("phxfs-cachestat-probe", unix.MFD_CLOEXEC)
		if err != nil {
			return
		}
		defer unix.Close(fd)
		resident(fd, 0, 4096)
	})
}

// CachestatSupported reports whether this kernel has cachestat(2), which
// the staged read policy needs to read cold ranges with O_DIRECT.
func CachestatSupported() bool {
	probeCachestat()
	return !noCachestat.Load()
}

// CheckEnv checks the environment variables New reads (PHX_ENGINE,
// PHX_STAGED_BUFFERS, PHX_DIRECT_IO, PHX_GATHER, PHX_WRITEBACK, PHX_STAGED_SHARE):
// New fails on the first bad one.
func CheckEnv() error {
	if err := ioengine.CheckKind(ioengine.KindFromEnv()); err != nil {
		return errs.Wrapf(err, "phxfs: %s=%q", ioengine.EnvEngine, os.Getenv(ioengine.EnvEngine))
	}
	if _, err := stagedBuffersFrom(0); err != nil {
		return err
	}
	if _, err := gatherMaxFrom(0); err != nil {
		return err
	}
	if _, err := stagedShareFrom(&Config{}); err != nil {
		return err
	}
	if _, err := writebackMinFrom(0); err != nil {
		return err
	}
	_, err := odirectFrom(ODirectAuto)
	return err
}

// StagedStats returns a snapshot of the staged transport's counters.
func (l *Lib) StagedStats() StagedStats {
	probeCachestat()
	c := &l.stagedStats
	s := StagedStats{
		DirectReads: c.directReads.Load(), DirectBytes: c.directBytes.Load(),
		BufferedReads: c.bufferedReads.Load(), BufferedBytes: c.bufferedBytes.Load(),
		GatheredReads: c.gatheredReads.Load(), GatheredBytes: c.gatheredBytes.Load(),
		Fallbacks: c.fallbacks.Load(), Cachestat: !noCachestat.Load(),
	}
	if why := c.fallbackWhy.Load(); why != nil {
		s.FallbackWhy = *why
	}
	return s
}

// sysCachestat is cachestat(2)'s number on x86-64 and arm64 (Linux 6.5).
const sysCachestat = 451

type cachestatRange struct{ off, len uint64 }

type cachestatResult struct {
	nrCache, nrDirty, nrWriteback, nrEvicted, nrRecentlyEvicted uint64
}

// resident reports whether any page of [off, off+n) of fd is in the page
// cache (cached, dirty or under writeback). ok is false when the kernel
// cannot tell (no cachestat, or a file it does not support).
func resident(fd int, off, n int64) (res, ok bool) {
	if noCachestat.Load() || n <= 0 {
		return false, false
	}
	r := cachestatRange{off: uint64(off), len: uint64(n)}
	var cs cachestatResult
	_, _, e := unix.Syscall6(sysCachestat, uintptr(fd), uintptr(unsafe.Pointer(&r)), uintptr(unsafe.Pointer(&cs)), 0, 0, 0)
	switch e {
	case 0:
		return cs.nrCache+cs.nrDirty+cs.nrWriteback > 0, true
	case unix.ENOSYS:
		noCachestat.Store(true)
	}
	return false, false
}

// batchFile is one file of a staged read batch: its O_DIRECT descriptor,
// opened on first need; its mapping for gathers (gather.go), acquired on
// first need and released when the batch ends; and a range of it the batch
// found wholly in the page cache.
type batchFile struct {
	src  int // the request's descriptor
	once sync.Once

	fd       int   // O_DIRECT descriptor; -1 when there is none
	size     int64 // file size when opened
	memAlign int64
	offAlign int64
	broken   atomic.Bool // an O_DIRECT read failed: read buffered from now on

	maps    *fileMaps
	mapOnce sync.Once
	mapping *fileMap // nil: none (yet, or the file cannot be mapped)

	// What the batch reads of the file: [lo, hi) holds every transfer,
	// and dense says they lie close enough together that asking the page
	// cache by chunk costs less than asking by transfer (resident).
	lo, hi int64
	n      int64 // pieces of the batch's transfers (a run's count each)
	dense  bool
	// dense: what the batch found of each residentProbe-aligned chunk
	// that [lo, hi) touches, from chunk lo/residentProbe on (chunkUnknown,
	// chunkResident: wholly in the page cache, chunkNot); read by every
	// worker for every transfer, so without a lock.
	chunks []atomic.Uint32
}

const (
	chunkUnknown = iota
	chunkResident
	chunkNot
)

// batchFiles maps a batch's descriptors to their batchFiles.
type batchFiles map[int]*batchFile

// newBatchFiles prepares (without opening anything) a batchFile for every
// descriptor of the plan's staged reads; nil for writes.
func newBatchFiles(p *plan, maps *fileMaps) batchFiles {
	if p.write {
		return nil
	}
	t := batchFiles{}
	var f *batchFile // the last xfer's: a plan is sorted by file
	for i := range p.xfers {
		x := &p.xfers[i]
		if !x.staged {
			continue
		}
		if f == nil || f.src != x.fd {
			if f = t[x.fd]; f == nil {
				f = &batchFile{src: x.fd, fd: -1, maps: maps, lo: x.off, hi: x.end()}
				t[x.fd] = f
			}
		}
		f.lo, f.hi = min(f.lo, x.off), max(f.hi, x.end())
		f.n += x.pieces()
	}
	for _, f := range t {
		f.dense = (f.hi-f.lo)/f.n <= residentDense
		if f.dense {
			f.chunks = make([]atomic.Uint32, (f.hi-1)/residentProbe-f.lo/residentProbe+1)
		}
	}
	return t
}

func (ts batchFiles) close() {
	for _, t := range ts {
		if t.fd >= 0 {
			unix.Close(t.fd)
		}
		if t.mapping != nil {
			t.maps.release(t.mapping)
		}
	}
}

// open opens the batchFile's O_DIRECT descriptor: a regular file, not
// already O_DIRECT, on a file system that reports its O_DIRECT alignment
// and accepts O_DIRECT opens.
func (t *batchFile) open() {
	fl, err := unix.FcntlInt(uintptr(t.src), unix.F_GETFL, 0)
	if err != nil || fl&unix.O_DIRECT != 0 || fl&unix.O_ACCMODE == unix.O_WRONLY {
		return
	}
	var st unix.Statx_t
	if err := unix.Statx(t.src, "", unix.AT_EMPTY_PATH, unix.STATX_TYPE|unix.STATX_SIZE|unix.STATX_DIOALIGN, &st); err != nil {
		return
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mask&unix.STATX_DIOALIGN == 0 || st.Dio_offset_align == 0 || st.Dio_mem_align == 0 {
		return
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(t.src), unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	t.fd, t.size = fd, int64(st.Size)
	t.memAlign, t.offAlign = int64(st.Dio_mem_align), int64(st.Dio_offset_align)
}

// How the batch asks the page cache what it holds: a cachestat costs
// about 0.3 us plus 15 ns a page here. Transfers scattered over a file
// (KV blocks) are asked about one by one, each its own pages; transfers
// packed close together (a column slice of every row of a tensor) by
// chunk: one cachestat of up to residentProbe bytes answers for every
// transfer inside the chunk. Packed means residentDense bytes of the file
// or fewer a transfer, where a chunk's pages cost no more than the calls
// it saves.
const (
	residentProbe = 64 << 20
	residentDense = 64 << 10
)

// resident reports whether any page of x's range is in the page cache,
// and whether the kernel could tell.
func (t *batchFile) resident(x *xfer) (res, ok bool) {
	if t.dense && t.chunksResident(x) {
		return true, true
	}
	if x.pieces() > 1 {
		// A run is gathered only if all of it is cached: its pieces
		// spread over many pages, and a cold read's readahead leaves
		// some of them cached ahead of the rest.
		return wholeResident(x.fd, x.off, x.end()-x.off), !noCachestat.Load()
	}
	return resident(x.fd, x.off, x.end()-x.off)
}

// chunksResident reports whether every chunk x touches was wholly in the
// page cache when the batch first asked; the batch asks once per chunk
// (two workers meeting an unknown chunk may both ask), about the part of
// it the batch reads.
func (t *batchFile) chunksResident(x *xfer) bool {
	first := t.lo / residentProbe
	for c := x.off / residentProbe; c*residentProbe < x.end(); c++ {
		if c < first || c-first >= int64(len(t.chunks)) {
			return false // not a transfer of the batch: ask about its own pages
		}
		s := &t.chunks[c-first]
		v := s.Load()
		if v == chunkUnknown {
			lo, hi := max(c*residentProbe, t.lo), min((c+1)*residentProbe, t.hi)
			v = chunkNot
			if wholeResident(t.src, lo, hi-lo) {
				v = chunkResident
			}
			s.Store(v)
		}
		if v != chunkResident {
			return false
		}
	}
	return true
}

// wholeResident reports whether every page of [off, off+n) that lies in
// the file is in the page cache (false when the kernel cannot tell, or
// the range lies past the end).
func wholeResident(fd int, off, n int64) bool {
	var st unix.Stat_t
	if noCachestat.Load() || unix.Fstat(fd, &st) != nil || off >= st.Size {
		return false
	}
	hi := min(off+n, st.Size)
	ps := int64(os.Getpagesize())
	pages := (hi+ps-1)/ps - off/ps
	r := cachestatRange{off: uint64(off), len: uint64(hi - off)}
	var cs cachestatResult
	if _, _, e := unix.Syscall6(sysCachestat, uintptr(fd), uintptr(unsafe.Pointer(&r)), uintptr(unsafe.Pointer(&cs)), 0, 0, 0); e != 0 {
		return false
	}
	return int64(cs.nrCache) >= pages
}

// resident reports whether any page of x's range is in the page cache,
// and whether the kernel could tell (false, false for a descriptor the
// batch has no batchFile for).
func (ts batchFiles) resident(x *xfer) (res, ok bool) {
	if t := ts[x.fd]; t != nil {
		return t.resident(x)
	}
	return false, false
}

// directSpan decides how xfer x is read, given whether the page cache
// may hold any of it (cached: resident, or the kernel could not tell). ok:
// read [start, start+span) from the batchFile into a bounce buffer of
// capacity bytes at addr, x's bytes begin at head inside it. Otherwise
// read x buffered.
func (ts batchFiles) directSpan(x *xfer, mode ODirect, cached bool, addr uintptr, capacity int64) (t *batchFile, start, head, span int64, ok bool) {
	t = ts[x.fd]
	if t == nil || x.pieces() > 1 || t.broken.Load() || mode == ODirectNever || mode == ODirectAuto && cached {
		return nil, 0, 0, 0, false // a run's pieces are gathered, or read through the page cache
	}
	t.once.Do(t.open)
	if t.fd < 0 || int64(addr)%t.memAlign != 0 {
		return nil, 0, 0, 0, false
	}
	a := t.offAlign
	start = x.off / a * a
	end := (x.off + x.len + a - 1) / a * a
	if end > t.size || end-start > capacity {
		// The file's last partial block, or no room to widen: buffered.
		return nil, 0, 0, 0, false
	}
	return t, start, x.off - start, end - start, true
}

// gatherable returns x's batchFile when x is to be copied from the file's
// mapping: no longer than limit, and its pages known to be in the page
// cache (resident: a gather of pages that are not would fault them in one
// by one).
func (ts batchFiles) gatherable(x *xfer, resident bool, limit int64) *batchFile {
	t := ts[x.fd]
	if t == nil || x.pieceLen() > limit || !resident {
		return nil
	}
	t.mapOnce.Do(func() { t.mapping, _ = t.maps.acquire(t.src) })
	if t.mapping == nil {
		return nil
	}
	return t
}

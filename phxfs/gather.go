package phxfs

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/internal/faultsafe"
)

// Gathering: many small transfers out of pages the page cache holds (a
// rank's column slice of every row, KV-cache blocks) are copied by the
// worker from a read-only mapping of the file into its slot, one memcpy
// each, rather than read one engine operation each. The reference
// (col_shard.cu) measured a gather from the page cache at 23-47 GB/s of
// slice bytes where a pread of each slice gave 4-42.
//
// A file's mapping lives as long as the library (or until the file's size
// changes), shared by reference count; one that is replaced or evicted is
// unmapped when its last user is done. Its page-table entries serve the
// batches that follow (each would fault every page in again, under the
// page-table locks every worker shares), and are dropped once no batch has
// used it for gatherIdle (MADV_DONTNEED; the pages stay in the page cache):
// the kernel neither evicts mapped pages on FADV_DONTNEED nor drops them on
// drop_caches, and a user who empties the cache after a load must find it
// empty. A file
// that shrinks under a mapping makes a copy fault (SIGBUS): the gather of
// that group is redone with the engine, never a crash (internal/faultsafe).

// DefaultGatherMax is the largest transfer gathered by default
// (Config.GatherMax).
const DefaultGatherMax = 1 << 20

// EnvGather names the variable that turns gathers off (off) or leaves
// them on (auto, or unset) when Config.GatherMax keeps the default.
const EnvGather = "PHX_GATHER"

// gatherMaxFrom resolves Config.GatherMax: the config's, else the
// default unless PHX_GATHER=off; negative: never gather (-1 after this).
func gatherMaxFrom(n int64) (int64, error) {
	if n != 0 {
		return max(n, -1), nil
	}
	switch v := os.Getenv(EnvGather); v {
	case "", "auto", "on":
		return DefaultGatherMax, nil
	case "off", "never":
		return -1, nil
	default:
		return 0, errs.New(unix.EINVAL, "phxfs: %s=%q: want auto or off", EnvGather, v)
	}
}

// GatherMax reports the largest transfer gathered from a file's mapping
// (-1: gathers are off).
func (l *Lib) GatherMax() int64 { return l.cfg.GatherMax }

// maxMappings bounds the files mapped at once; the least recently used
// unused one goes first.
const maxMappings = 1024

// gatherIdle is how long an unused mapping keeps its page-table entries.
const gatherIdle = 500 * time.Millisecond

// fileKey names a file whatever descriptor reaches it.
type fileKey struct{ dev, ino uint64 }

// fileMap is one file's read-only shared mapping.
type fileMap struct {
	key    fileKey
	b      []byte
	size   int64 // the file's size when mapped
	refs   int
	stale  bool // replaced or evicted: unmapped at the last release
	used   uint64
	idle   time.Time // when the last user let go (refs 0, page tables kept)
	mapped bool      // page-table entries may exist (not dropped since last used)
}

// fileMaps is the library's mappings.
type fileMaps struct {
	mu    sync.Mutex
	m     map[fileKey]*fileMap
	clock uint64
	idle  time.Duration // gatherIdle; tests shorten it
	sweep *time.Timer   // drops idle mappings' page tables
}

// acquire returns a mapping of the file fd refers to, of its current
// size, holding it until release; nil for an empty file or one that cannot
// be mapped (the caller then reads with the engine).
func (fm *fileMaps) acquire(fd int) (*fileMap, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, errs.Wrapf(err, "phxfs: gather: stat descriptor %d", fd)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size <= 0 {
		return nil, nil
	}
	key := fileKey{uint64(st.Dev), st.Ino}
	fm.mu.Lock()
	defer fm.mu.Unlock()
	if fm.m == nil {
		fm.m = map[fileKey]*fileMap{}
	}
	fm.clock++
	if m := fm.m[key]; m != nil {
		if m.size == st.Size {
			m.refs++
			m.used, m.mapped = fm.clock, true
			return m, nil
		}
		fm.retire(m)
	}
	b, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil // a file system without mmap: the engine reads it
	}
	m := &fileMap{key: key, b: b, size: st.Size, refs: 1, used: fm.clock, mapped: true}
	fm.m[key] = m
	fm.evict()
	return m, nil
}

// release drops a hold taken by acquire.
func (fm *fileMaps) release(m *fileMap) {
	fm.mu.Lock()
	defer fm.mu.Unlock()
	m.refs--
	switch {
	case m.refs > 0:
	case m.stale:
		unix.Munmap(m.b)
	default:
		m.idle = time.Now()
		if fm.sweep == nil {
			fm.sweep = time.AfterFunc(fm.idleFor(), fm.dropIdle)
		}
	}
}

func (fm *fileMaps) idleFor() time.Duration {
	if fm.idle > 0 {
		return fm.idle
	}
	return gatherIdle
}

// dropIdle drops the page-table entries of the mappings unused for the
// idle time, and comes back for those not idle long enough yet.
func (fm *fileMaps) dropIdle() {
	fm.mu.Lock()
	defer fm.mu.Unlock()
	fm.sweep = nil
	next := time.Duration(0)
	for _, m := range fm.m {
		if m.refs > 0 || !m.mapped {
			continue
		}
		if wait := fm.idleFor() - time.Since(m.idle); wait > 0 {
			next = max(next, wait)
			continue
		}
		unix.Madvise(m.b, unix.MADV_DONTNEED)
		m.mapped = false
	}
	if next > 0 {
		fm.sweep = time.AfterFunc(next, fm.dropIdle)
	}
}

// retire takes m out of the table; it is unmapped once unused. Caller
// holds mu.
func (fm *fileMaps) retire(m *fileMap) {
	delete(fm.m, m.key)
	m.stale = true
	if m.refs == 0 {
		unix.Munmap(m.b)
	}
}

// evict retires the least recently used unused mappings past maxMappings.
// Caller holds mu.
func (fm *fileMaps) evict() {
	for len(fm.m) > maxMappings {
		var old *fileMap
		for _, m := range fm.m {
			if m.refs == 0 && (old == nil || m.used < old.used) {
				old = m
			}
		}
		if old == nil {
			return
		}
		fm.retire(old)
	}
}

// close unmaps every mapping; no transfer runs.
func (fm *fileMaps) close() {
	fm.mu.Lock()
	defer fm.mu.Unlock()
	if fm.sweep != nil {
		fm.sweep.Stop()
		fm.sweep = nil
	}
	for _, m := range fm.m {
		fm.retire(m)
	}
}

// gatherGroup copies every gathered read of a group from its file's
// mapping into its slot and sets its result (bytes, short at the end of
// the mapped file). One fault guard covers a run of reads from one
// mapping; a read that faults (the file shrank) is redone with the engine.
func (r *stagedReader) gatherGroup() {
	if r.gathers == 0 {
		return
	}
	var n, bytes int64
	for j := 0; j < len(r.reads); {
		if !r.reads[j].gather {
			j++
			continue
		}
		m, k := r.reads[j].bf.mapping, j
		err := faultsafe.Run("phxfs: gather from a file's mapping", m.b, func() {
			for ; k < len(r.reads); k++ {
				rd := &r.reads[k]
				if !rd.gather {
					continue
				}
				if rd.bf.mapping != m {
					return
				}
				rd.res = gatherPieces(r.slots[rd.slot][rd.at:], m, &r.xfers[rd.i])
				n++
				bytes += rd.res
			}
		})
		if err != nil {
			rd := &r.reads[k]
			rd.res = r.l.readBuffered(r.eng, &r.xfers[rd.i], r.slots[rd.slot][rd.at:])
			k++
		}
		j = k
	}
	r.l.stagedStats.gatheredReads.Add(n)
	r.l.stagedStats.gatheredBytes.Add(bytes)
}

// gatherPieces copies x's pieces from the mapping m one after the other
// into dst, up to the end of the mapped file, and returns the bytes copied:
// a run of a column slice is one tight loop of copies.
func gatherPieces(dst []byte, m *fileMap, x *xfer) int64 {
	n := x.pieceLen()
	var got int64
	for j := range x.pieces() {
		off := x.pieceOff(j)
		c := int64(copy(dst[j*n:(j+1)*n], m.b[min(off, m.size):min(off+n, m.size)]))
		got += c
		if c < n {
			break
		}
	}
	return got
}

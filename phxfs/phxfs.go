package phxfs

import (
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/defaults"
	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/ioengine"
)

// ChunkSize bounds one engine operation, below the kernel's MAX_RW_COUNT.
const ChunkSize = 1 << 30

// Transport is the path bytes take between storage and device memory.
type Transport string

const (
	// Kmod: the phxfs kernel module maps device pages into a VMA and
	// O_DIRECT I/O lands there by DMA.
	Kmod Transport = "kmod"
	// Host: device memory is host-addressable; I/O lands there directly.
	Host Transport = "host"
	// Staged: I/O lands in pinned bounce buffers and the connector copies
	// it to device memory, overlapped with the next read.
	Staged Transport = "staged"
)

// Config configures a Lib. Zero values pick the defaults.
type Config struct {
	Connector connector.Connector
	// Engine is "auto", "io_uring" or "sync"; "" reads PHX_ENGINE.
	Engine string
	// Workers is the size of the worker pool (default: CPUs, 2 to 16).
	Workers int
	// QueueDepth is each io_uring worker's ring depth (default 1024).
	QueueDepth int
	// MaxQueuedBatches bounds the FIFO of submitted batches (default 16).
	MaxQueuedBatches int
	// BounceSize is the size of each staged bounce buffer (default 4 MiB:
	// with the slots made before the first load, 16 workers x 4 MiB beat
	// 2 MiB on an H200, docs/gpu-notes.md run 10).
	BounceSize int64
	// SplitSize cuts large host and direct operations so that one big
	// request keeps every worker busy (default 8 MiB; 0 keeps the default,
	// negative disables).
	SplitSize int64
	// StagedBuffers is the number of bounce buffers (slots) per staged
	// worker, 2 to 32; a worker fills half of them in one engine run while
	// the other half's copies run (0: PHX_STAGED_BUFFERS, else 2).
	StagedBuffers int
	// StagedShare is the least a worker is given of a staged batch (0:
	// the bounce size with PHX_STAGED_SHARE=slot, else 1 MiB): a small batch (a few KV-cache blocks, one tensor) runs on a
	// few workers, which keeps the copy engine's driver calls few and lets
	// concurrent batches from other client threads run beside it.
	// StagedByLoad may give a batch more than this a worker.
	StagedShare int64
	// StagedByLoad splits a staged batch among workers by what runs
	// beside it: beside other plans of its device a batch gets no more
	// than its fair part of the pool, down to a slot's worth a worker
	// (stagedWorkers; PHX_STAGED_SHARE=load too; Lib.SetStagedByLoad).
	StagedByLoad bool
	// Writer: a root process's writes of file data run as fscred.Writer,
	// not as root (ioengine.PoolConfig.Writer): a daemon writing for its
	// callers takes no block a file system reserves for root.
	Writer bool
	// ODirect is the staged transport's read policy (policy.go); ODirectAuto
	// lets PHX_DIRECT_IO choose.
	ODirect ODirect
	// RoundBytes bounds the bytes each worker gets in one round of a large
	// batch (default 1 GiB: a 16 GiB load on 16 workers is one round; every
	// round ends with every worker's copies drained, and on an H200 64 MiB
	// rounds cost 5-15 % of a hot staged load against one round; negative:
	// always one round). Smaller rounds let other batches in sooner.
	RoundBytes int64
	// Transport forces a transport for every registration; "" chooses the
	// fastest the machine offers (direct, then host, then staged).
	Transport Transport
	// NoKernelModule ignores /dev/phxfs_devN even where it exists.
	NoKernelModule bool
	// GatherMax is the largest staged transfer of resident pages that a
	// worker copies from a mapping of the file rather than reads with the
	// engine (gather.go; default DefaultGatherMax, 0 keeps it, negative
	// never gathers; PHX_GATHER=off too).
	GatherMax int64
	// WritebackMin is the least size of a staged write operation (a
	// bounce buffer's worth of a save) that starts the kernel's writeback
	// of what it wrote at once (writeback.go; default
	// DefaultWritebackMin, 0 keeps it or PHX_WRITEBACK's, negative never;
	// a whole bounce buffer always qualifies).
	WritebackMin int64
}

// Lib is one instance of the library: its devices, registrations, worker
// pool and batch queue.
type Lib struct {
	cfg  Config
	conn connector.Connector
	pool *ioengine.Pool

	mu      sync.Mutex
	changed *sync.Cond // signalled when a hold or a device reference drops
	devices map[int]*device
	closed  bool

	queue   chan *Batch
	stopped chan struct{}

	staged  stagedState   // the staged transport's slots and streams (staged.go)
	rotor   atomic.Uint64 // where the next staged plan starts on the pool
	loading loading       // devices with staged plans running (placement.go)
	offers  offers        // staged reads whose chunks a finished worker may take (steal.go)

	maps        fileMaps  // the files gathers copy from (gather.go)
	wb          writeback // starts writeback of large writes (writeback.go)
	stats       counters
	stagedStats stagedCounters
	xportStats  transportCounters // bytes per transport (stats.go)
	directIO    atomic.Int32
	byLoad      atomic.Bool // Config.StagedByLoad, SetStagedByLoad
	shareBySize bool        // a worker's share follows the pieces' size (blockShare)
}

// New creates a library instance and starts its worker pool.
func New(cfg Config) (*Lib, error) {
	if cfg.Connector == nil {
		return nil, errs.New(unix.EINVAL, "phxfs: no connector")
	}
	if cfg.Engine == "" {
		cfg.Engine = ioengine.KindFromEnv()
	}
	defaults.Set(&cfg.Workers, min(max(runtime.NumCPU(), 2), 16))
	defaults.Set(&cfg.QueueDepth, 1024)
	defaults.Set(&cfg.MaxQueuedBatches, 16)
	defaults.Set(&cfg.BounceSize, 4<<20)
	bySize, err := stagedShareFrom(&cfg)
	if err != nil {
		return nil, err
	}
	defaults.Set(&cfg.StagedShare, 1<<20)
	if cfg.BounceSize%4096 != 0 {
		return nil, errs.New(unix.EINVAL, "phxfs: bounce size %d is not a multiple of 4096", cfg.BounceSize)
	}
	sb, err := stagedBuffersFrom(cfg.StagedBuffers)
	if err != nil {
		return nil, err
	}
	cfg.StagedBuffers = sb
	dio, err := odirectFrom(cfg.ODirect)
	if err != nil {
		return nil, err
	}
	if cfg.RoundBytes == 0 {
		cfg.RoundBytes = 1 << 30
	}
	if cfg.SplitSize == 0 {
		cfg.SplitSize = 8 << 20
	}
	if cfg.GatherMax, err = gatherMaxFrom(cfg.GatherMax); err != nil {
		return nil, err
	}
	if cfg.WritebackMin, err = writebackMinFrom(cfg.WritebackMin); err != nil {
		return nil, err
	}
	if cfg.WritebackMin > 0 {
		cfg.WritebackMin = min(cfg.WritebackMin, cfg.BounceSize)
	}
	switch cfg.Transport {
	case "", Kmod, Host, Staged:
	default:
		return nil, errs.New(unix.EINVAL, "phxfs: unknown transport %q", cfg.Transport)
	}
	pool, err := ioengine.NewPool(ioengine.PoolConfig{Kind: cfg.Engine, Workers: cfg.Workers, QueueDepth: cfg.QueueDepth, Writer: cfg.Writer})
	if err != nil {
		return nil, errs.Wrapf(err, "phxfs: start worker pool")
	}
	l := &Lib{
		cfg:     cfg,
		conn:    cfg.Connector,
		pool:    pool,
		devices: map[int]*device{},
		queue:   make(chan *Batch, cfg.MaxQueuedBatches),
		stopped: make(chan struct{}),
	}
	l.changed = sync.NewCond(&l.mu)
	l.directIO.Store(int32(dio))
	l.byLoad.Store(cfg.StagedByLoad)
	l.shareBySize = bySize
	l.wb.start(cfg.WritebackMin)
	go l.dispatch()
	return l, nil
}

// EngineName reports the active I/O engine ("io_uring" or "sync", or
// "io_uring (k of n workers on sync)").
func (l *Lib) EngineName() string { return l.pool.Name() }

// EngineFallback is why workers run the sync engine although io_uring
// was wanted (their ring could not be created), nil when none does.
func (l *Lib) EngineFallback() error {
	if l.cfg.Engine == ioengine.KindSync || l.pool.RingError() == nil {
		return nil
	}
	return l.pool.RingError()
}

// Workers reports the size of the worker pool.
func (l *Lib) Workers() int { return l.pool.Workers() }

// BounceSize reports the staged transport's bounce buffer size.
func (l *Lib) BounceSize() int64 { return l.cfg.BounceSize }

// Connector returns the connector the library was built on.
func (l *Lib) Connector() connector.Connector { return l.conn }

// Close closes every device still open (draining its I/O), stops the batch
// queue and the worker pool. Queued batches finish first.
func (l *Lib) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return errs.New(unix.EINVAL, "phxfs: library already closed")
	}
	l.closed = true
	var open []int
	for idx := range l.devices {
		open = append(open, idx)
	}
	l.mu.Unlock()

	close(l.queue)
	<-l.stopped
	var first error
	for _, idx := range open {
		if err := l.closeDevice(idx, true); err != nil && first == nil {
			first = err
		}
	}
	l.wb.close() // after the devices: no staged write runs any more
	// The pool's last jobs may be reads' workers that started after their
	// plan was done (placement.go: claimer): they end before the slots,
	// streams and mappings they would look at go.
	if err := l.pool.Close(); err != nil && first == nil {
		first = err
	}
	if err := l.closeStaged(); err != nil && first == nil {
		first = err
	}
	l.maps.close()
	return first
}

// Stats are the library's counters since New.
type Stats struct {
	BytesRead    int64
	BytesWritten int64
	Requests     int64 // requests that reached the engine
	Ops          int64 // engine operations after coalescing and chunking
	Coalesced    int64 // requests merged into a neighbour's operation
	Failed       int64 // requests that ended with an error
	Batches      int64
}

type counters struct {
	bytesRead, bytesWritten, requests, ops, coalesced, failed, batches atomic.Int64
}

// Stats returns a snapshot of the counters.
func (l *Lib) Stats() Stats {
	c := &l.stats
	return Stats{
		BytesRead: c.bytesRead.Load(), BytesWritten: c.bytesWritten.Load(),
		Requests: c.requests.Load(), Ops: c.ops.Load(), Coalesced: c.coalesced.Load(),
		Failed: c.failed.Load(), Batches: c.batches.Load(),
	}
}

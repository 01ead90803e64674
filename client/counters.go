package client

import (
	"fmt"
	"strings"
)

// Counters are the daemon's counters since mount: INFO carries them from
// offset 312, one little-endian u64 each, in the order of counterTable, and
// user.phx.info under its names. Each is read atomically, but the set is
// not one snapshot: counters move while INFO gathers them.
type Counters struct {
	BuffersLive         uint64
	BuffersRegistered   uint64
	ReleasedDeregister  uint64
	ReleasedClose       uint64
	ReleasedDeath       uint64
	IoctlBytesRead      uint64
	IoctlBytesWritten   uint64
	IoctlExtents        uint64
	IoctlFailedExtents  uint64
	IoctlRejected       uint64
	IoctlCalls          uint64
	LibBytesRead        uint64
	LibBytesWritten     uint64
	LibRequests         uint64
	LibOps              uint64
	LibCoalesced        uint64
	LibFailed           uint64
	LibBatches          uint64
	XattrLoads          uint64
	StagedDirectReads   uint64
	StagedDirectBytes   uint64
	StagedBufferedReads uint64
	StagedBufferedBytes uint64
	StagedFallbacks     uint64
}

// counterTable is the one list of the counters: wire order, the
// user.phx.info key, what it counts (docs/abi.md's table is generated from
// it) and its field. Append only: the order is the ABI.
var counterTable = [...]struct {
	name, doc string
	field     func(*Counters) *uint64
}{
	{"buffers_live", "buffers registered now", func(c *Counters) *uint64 { return &c.BuffersLive }},
	{"buffers_registered", "REGISTERs that succeeded", func(c *Counters) *uint64 { return &c.BuffersRegistered }},
	{"released_deregister", "buffers released by DEREGISTER", func(c *Counters) *uint64 { return &c.ReleasedDeregister }},
	{"released_close", "buffers released by the last close of their file", func(c *Counters) *uint64 { return &c.ReleasedClose }},
	{"released_death", "buffers released by their owner's death", func(c *Counters) *uint64 { return &c.ReleasedDeath }},
	{"ioctl_bytes_read", "bytes READ, batches and `user.phx.load` moved into buffers", func(c *Counters) *uint64 { return &c.IoctlBytesRead }},
	{"ioctl_bytes_written", "bytes WRITE and batches moved out of buffers", func(c *Counters) *uint64 { return &c.IoctlBytesWritten }},
	{"ioctl_extents", "extents of READ, WRITE and batches", func(c *Counters) *uint64 { return &c.IoctlExtents }},
	{"ioctl_failed_extents", "extents that did not move exactly their length", func(c *Counters) *uint64 { return &c.IoctlFailedExtents }},
	{"ioctl_rejected", "ioctls refused as a whole", func(c *Counters) *uint64 { return &c.IoctlRejected }},
	{"ioctl_calls", "ioctls of this ABI", func(c *Counters) *uint64 { return &c.IoctlCalls }},
	{"lib_bytes_read", "bytes the library read into device memory", func(c *Counters) *uint64 { return &c.LibBytesRead }},
	{"lib_bytes_written", "bytes the library wrote from device memory", func(c *Counters) *uint64 { return &c.LibBytesWritten }},
	{"lib_requests", "requests that reached the library's engine", func(c *Counters) *uint64 { return &c.LibRequests }},
	{"lib_ops", "engine operations after coalescing and cutting", func(c *Counters) *uint64 { return &c.LibOps }},
	{"lib_coalesced", "requests merged into a neighbour's operation", func(c *Counters) *uint64 { return &c.LibCoalesced }},
	{"lib_failed", "library requests that ended with an error", func(c *Counters) *uint64 { return &c.LibFailed }},
	{"lib_batches", "library batches", func(c *Counters) *uint64 { return &c.LibBatches }},
	{"xattr_loads", "`user.phx.load` sets that loaded a file", func(c *Counters) *uint64 { return &c.XattrLoads }},
	{"staged_direct_reads", "staged reads of cold ranges done with O_DIRECT", func(c *Counters) *uint64 { return &c.StagedDirectReads }},
	{"staged_direct_bytes", "bytes those reads delivered", func(c *Counters) *uint64 { return &c.StagedDirectBytes }},
	{"staged_buffered_reads", "staged reads through the page cache", func(c *Counters) *uint64 { return &c.StagedBufferedReads }},
	{"staged_buffered_bytes", "bytes those reads delivered", func(c *Counters) *uint64 { return &c.StagedBufferedBytes }},
	{"staged_fallbacks", "O_DIRECT reads that failed or came up short and were redone through the page cache", func(c *Counters) *uint64 { return &c.StagedFallbacks }},
}

// CountersOffset is where INFO's counters begin.
const CountersOffset = 312

// numCounters u64s from CountersOffset fit the INFO struct.
const numCounters = len(counterTable)

var _ [InfoSize - CountersOffset - 8*numCounters]byte

func (c *Counters) fields() []*uint64 {
	out := make([]*uint64, numCounters)
	for i, e := range counterTable {
		out[i] = e.field(c)
	}
	return out
}

// Each calls fn with every counter's user.phx.info name and value, in wire
// order.
func (c *Counters) Each(fn func(name string, v uint64)) {
	for _, e := range counterTable {
		fn(e.name, *e.field(c))
	}
}

// Set sets the counter named name (its user.phx.info name); false when no
// counter has that name.
func (c *Counters) Set(name string, v uint64) bool {
	for _, e := range counterTable {
		if e.name == name {
			*e.field(c) = v
			return true
		}
	}
	return false
}

// CounterNames lists the counters' user.phx.info names in wire order.
func CounterNames() []string {
	out := make([]string, numCounters)
	for i, e := range counterTable {
		out[i] = e.name
	}
	return out
}

// gauges are the counters that say how many things there are now; every
// other counter only grows (a total of events since mount).
var gauges = map[string]bool{"buffers_live": true}

// CounterDesc describes one counter to an exporter (the daemon's metrics
// endpoint): its user.phx.info name, what it counts, and whether it is a
// gauge rather than a growing total.
type CounterDesc struct {
	Name, Doc string
	Gauge     bool
}

// CounterDescs describes the counters in wire order.
func CounterDescs() []CounterDesc {
	out := make([]CounterDesc, numCounters)
	for i, e := range counterTable {
		out[i] = CounterDesc{Name: e.name, Doc: e.doc, Gauge: gauges[e.name]}
	}
	return out
}

// CounterDoc is the Markdown table of the counters that docs/abi.md
// carries between its "counters" markers.
func CounterDoc() string {
	var b strings.Builder
	b.WriteString("| offset | `user.phx.info` key | counts |\n| --- | --- | --- |\n")
	for i, e := range counterTable {
		fmt.Fprintf(&b, "| %d | `%s` | %s |\n", CountersOffset+8*i, e.name, e.doc)
	}
	return b.String()
}

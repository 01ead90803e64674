package client

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// The daemon runs as root and serves every local user, so each number a
// request carries is bounded before it sizes anything the daemon
// allocates. The limits are defined here, once; the daemon (package
// fusefs) enforces them, and docs/abi.md's table of limits is generated
// from limitTable.

// MaxPieces is the most pieces one ioctl may move: the counts of a strided
// batch's extents, summed (a plain extent is one piece, so plain batches
// are always below it). A strided batch past it fails as a whole with
// E2BIG, before any extent is looked at.
//
// Why 65,536: the daemon keeps per piece, for the length of the ioctl, a
// plain extent (a strided write is its caller's write(2) of each piece,
// checked against RLIMIT_FSIZE piece by piece) and the library's plan of
// it, an engine transfer and a segment: under 1 KiB a piece (measured,
// fusefs TestStridedLargestBatchBounded: a staged write about 850 bytes,
// a host read about 150), so under 64 MiB for one ioctl whatever its
// numbers. The engines need far less: a tensor-parallel
// rank's column slice is one extent of a few thousand rows (16,384 for
// the widest models), and KV-cache blocks come a few hundred a batch. A
// client with more pieces sends more ioctls (the Go and Python clients
// split by it).
const MaxPieces = 1 << 16

// MaxDevice is the largest device index REGISTER and INFO accept: a larger
// one is ENODEV before the connector is asked.
const MaxDevice = 1 << 16

// MaxLoadValue is the longest user.phx.load value, in bytes (EINVAL past
// it): four keys and their numbers fit in well under it.
const MaxLoadValue = 512

// The registration limits' defaults; a mount changes each with -o NAME=N
// (limitTable names them).
const (
	DefaultMaxBuffersPerProcess = 4096
	// DefaultMaxBuffersPerUser is half of what the daemon holds under the
	// kernel's default vm.max_map_count (a quarter of 65,530): one user,
	// however many processes it runs, leaves the other half to the others.
	DefaultMaxBuffersPerUser = 8192
	DefaultMaxBuffers        = 65536
	// DefaultMaxRegisteredBytes is an eighth of the daemon's 128 TiB of
	// address space, where imports are mapped.
	DefaultMaxRegisteredBytes = 16 << 40
	// DefaultMaxRegisteredBytesPerUser is a quarter of the mount's: the
	// same memory registered again counts again, so without it one user
	// holding 1 GiB could take the mount's bytes in 16,384 REGISTERs.
	DefaultMaxRegisteredBytesPerUser = 4 << 40
	// DefaultMaxPiecesInFlightPerUser is eight full strided batches of one
	// user served at once (about 120 MiB of the daemon's memory; a
	// tensor-parallel rank's column slice of a 14,336-wide matrix is 4,096
	// pieces), and DefaultMaxPiecesInFlight sixteen of everyone's.
	DefaultMaxPiecesInFlightPerUser = 1 << 19
	DefaultMaxPiecesInFlight        = 1 << 20
)

// Limit is one bound on what a request may make the daemon do: its name
// (a mount option's, where one sets it), its value (the default, for an
// option), what it bounds, and the errno a request past it gets (0: it
// waits for others to end instead, and gets EINTR where a signal ends the
// wait).
type Limit struct {
	Name   string
	Value  uint64
	Option bool // set per mount with -o Name=N; Value is the default
	Bounds string
	Errno  unix.Errno
}

// limitTable is the one list of the limits, in the order docs/abi.md shows
// them.
var limitTable = [...]Limit{
	{"max_ioctl_size", MaxIoctlSize, false, "bytes of one ioctl's struct (the kernel's restricted-ioctl size); a batch's capacity k follows from it", unix.EINVAL},
	{"max_extents", MaxExtents, false, "extents of one BATCH_READ or BATCH_WRITE (k)", unix.EINVAL},
	{"max_strided_extents", MaxStridedExtents, false, "extents of one BATCH_READ_STRIDED or BATCH_WRITE_STRIDED (k)", unix.EINVAL},
	{"max_pieces", MaxPieces, false, "pieces one strided batch moves: its extents' `count`s summed (the whole ioctl fails, nothing moves)", unix.E2BIG},
	{"max_offset", MaxOffset, false, "every offset and length, and where an extent's last piece ends in the file (that extent, or the READ or WRITE, fails)", unix.EINVAL},
	{"max_device", MaxDevice, false, "the device index of REGISTER and INFO", unix.ENODEV},
	{"max_load_value", MaxLoadValue, false, "bytes of a `user.phx.load` value as set (a trailing NUL or newline included)", unix.EINVAL},
	{"max_buffers_per_process", DefaultMaxBuffersPerProcess, true, "live buffers of one process", unix.EMFILE},
	{"max_buffers_per_user", DefaultMaxBuffersPerUser, true, "live buffers of one user (the caller's uid), in all its processes; root's count only towards the mount's limits", unix.EDQUOT},
	{"max_buffers", DefaultMaxBuffers, true, "live buffers of the mount, never more than a quarter of the daemon's `RLIMIT_NOFILE` or of `vm.max_map_count` (16,382 by the kernel's default)", unix.ENFILE},
	{"max_registered_bytes_per_user", DefaultMaxRegisteredBytesPerUser, true, "bytes one user's live buffers register (root's: see `max_buffers_per_user`)", unix.EDQUOT},
	{"max_registered_bytes", DefaultMaxRegisteredBytes, true, "bytes the mount's live buffers register", unix.ENOMEM},
	{"max_pieces_in_flight_per_user", DefaultMaxPiecesInFlightPerUser, true, "pieces of one user's batches served at once: a strided extent's `count`, a plain batch's extents (the daemon holds about 230 bytes a piece while it serves it); root's count only towards the mount's", 0},
	{"max_pieces_in_flight", DefaultMaxPiecesInFlight, true, "pieces of all batches served at once; a batch larger than either limit runs when nothing else counts against it", 0},
}

// Limits lists the limits, in the order docs/abi.md shows them.
func Limits() []Limit { return append([]Limit(nil), limitTable[:]...) }

// LimitDoc is the Markdown table of the limits that docs/abi.md carries
// between its "limits" markers.
func LimitDoc() string {
	var b strings.Builder
	b.WriteString("| limit | value | bounds | past it |\n| --- | --- | --- | --- |\n")
	for _, l := range limitTable {
		v := groupDigits(l.Value)
		if l.Option {
			v = fmt.Sprintf("%s (default; `-o %s=N`)", v, l.Name)
		}
		past := ErrnoName(l.Errno)
		if l.Errno == 0 {
			past = "the ioctl waits until others end; EINTR if a signal ends the wait"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", l.Name, v, l.Bounds, past)
	}
	return b.String()
}

// groupDigits writes n in decimal with commas between groups of three, as
// docs/abi.md writes numbers; 2^63 - 1 and powers of two of 2^40 and more
// are written as such.
func groupDigits(n uint64) string {
	switch {
	case n == MaxOffset:
		return "2^63 − 1"
	case n >= 1<<40 && n&(n-1) == 0:
		return fmt.Sprintf("%d TiB", n>>40)
	}
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// ErrnoName is the C name of an errno ("E2BIG").
func ErrnoName(e unix.Errno) string {
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return fmt.Sprintf("errno %d", int(e))
}

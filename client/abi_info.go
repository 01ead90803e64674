package client

// INFO (docs/abi.md); its counters are in counters.go.

// Info is INFO's output: what a GPU-direct read through this mount would
// do, and the daemon's counters.
type Info struct {
	Device         int32 // the device described (input)
	Transport      Transport
	Flags          uint32 // InfoPassthrough, InfoReadOnly, InfoHostAddressable, ...
	Workers        uint32
	PageSize       uint64 // registrations: size and device address alignment
	BounceSize     uint64 // staged transport: bounce buffer size
	DIOMemAlign    uint32 // O_DIRECT alignment of the backing file (0: unknown)
	DIOOffsetAlign uint32
	Devices        uint32 // devices the connector has
	// Cache is how the kernel caches the file the ioctl was issued on
	// (the class of its backing file system under the mount's -o cache
	// mode); CacheUnknown from a daemon older than the field.
	Cache          CacheClass
	Vendor         string // max 15 bytes
	Engine         string // max 15 bytes
	PCIAddress     string // max 31 bytes
	DeviceName     string // max 63 bytes
	PassthroughWhy string // max 127 bytes
	Counters       Counters
}

// Info flags.
const (
	InfoPassthrough     = 1 << 0
	InfoReadOnly        = 1 << 1
	InfoHostAddressable = 1 << 2
	// InfoCachestat: the staged transport can tell cached ranges from cold
	// ones (cachestat(2), Linux >= 6.5); without it every staged read goes
	// through the page cache.
	InfoCachestat = 1 << 3
	// InfoEngineFallback: io_uring was wanted, but some workers could not
	// create a ring and run the sync engine (Engine says how many).
	InfoEngineFallback = 1 << 4
)

// InfoNetworkBacking (an Info flag, bit 5): the file's backing file system
// is shared with other machines (NFS, CephFS, Lustre, another FUSE file
// system): their changes are found by revalidation, not by events.
const InfoNetworkBacking = 1 << 5

// CacheClass is INFO's cache field (offset 52, formerly reserved, so a
// daemon older than it answers CacheUnknown): how the kernel caches names,
// attributes, file data and directory listings of a backing file system.
type CacheClass uint32

const (
	CacheUnknown CacheClass = 0
	// CacheOff: -o cache=off: 1 s entry and attribute timeouts, no
	// negative entries, no kept file data or directory listings.
	CacheOff CacheClass = 1
	// CacheWatch: -o cache=auto on a file system fanotify sees every
	// change of: long timeouts, negative entries, kept data and listings,
	// invalidated by events.
	CacheWatch CacheClass = 2
	// CacheRevalidate: -o cache=auto where events cannot see every change
	// (network file systems, or no fanotify): short timeouts, and file data
	// kept only while mtime, ctime and size are unchanged.
	CacheRevalidate CacheClass = 3
	// CacheExclusive: -o cache=exclusive: only this mount changes the
	// directory (the user's promise): the longest timeouts, no events.
	CacheExclusive CacheClass = 4
)

var cacheNames = [...]string{CacheUnknown: "unknown", CacheOff: "off", CacheWatch: "watch", CacheRevalidate: "revalidate", CacheExclusive: "exclusive"}

func (c CacheClass) String() string { return nameOf(cacheNames[:], uint32(c), "cache") }

// EncodeInfoReq lays out an INFO request for device dev.
func EncodeInfoReq(dev int32) []byte { return encodeOneField(InfoSize, 4, uint64(uint32(dev))) }

// DecodeInfoReq checks an INFO request and returns the device it asks
// about. Everything past offset 12 must be zero.
func DecodeInfoReq(b []byte) (int32, error) {
	dev, err := decodeOneField(b, InfoSize, 4, "info", "output fields must be zero on input")
	return int32(uint32(dev)), err
}

func putString(b []byte, s string) {
	n := copy(b[:len(b)-1], s)
	clear(b[n:])
}

// getString reads a NUL-terminated string field: the last byte is always
// the terminator, whatever it holds.
func getString(b []byte) string {
	b = b[:len(b)-1]
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// EncodeInfo fills out (InfoSize bytes). Strings are cut to fit, always
// NUL-terminated.
func EncodeInfo(out []byte, in Info) {
	clear(out)
	putHeader(out)
	le.PutUint32(out[8:], uint32(in.Device))
	le.PutUint32(out[12:], uint32(in.Transport))
	le.PutUint32(out[16:], in.Flags)
	le.PutUint32(out[20:], in.Workers)
	le.PutUint64(out[24:], in.PageSize)
	le.PutUint64(out[32:], in.BounceSize)
	le.PutUint32(out[40:], in.DIOMemAlign)
	le.PutUint32(out[44:], in.DIOOffsetAlign)
	le.PutUint32(out[48:], in.Devices)
	le.PutUint32(out[52:], uint32(in.Cache))
	putString(out[56:72], in.Vendor)
	putString(out[72:88], in.Engine)
	putString(out[88:120], in.PCIAddress)
	putString(out[120:184], in.DeviceName)
	putString(out[184:312], in.PassthroughWhy)
	for i, p := range in.Counters.fields() {
		le.PutUint64(out[CountersOffset+8*i:], *p)
	}
}

// DecodeInfo reads INFO's output.
func DecodeInfo(b []byte) (Info, error) {
	if err := checkHeader(b, InfoSize, "info reply"); err != nil {
		return Info{}, err
	}
	in := Info{
		Device: int32(le.Uint32(b[8:])), Transport: Transport(le.Uint32(b[12:])), Flags: le.Uint32(b[16:]),
		Workers: le.Uint32(b[20:]), PageSize: le.Uint64(b[24:]), BounceSize: le.Uint64(b[32:]),
		DIOMemAlign: le.Uint32(b[40:]), DIOOffsetAlign: le.Uint32(b[44:]), Devices: le.Uint32(b[48:]),
		Cache: CacheClass(le.Uint32(b[52:])), Vendor: getString(b[56:72]), Engine: getString(b[72:88]), PCIAddress: getString(b[88:120]),
		DeviceName: getString(b[120:184]), PassthroughWhy: getString(b[184:312]),
	}
	for i, p := range in.Counters.fields() {
		*p = le.Uint64(b[CountersOffset+8*i:])
	}
	return in, nil
}

// Passthrough reports whether the mount's opened files use kernel FUSE
// passthrough.
func (in Info) Passthrough() bool { return in.Flags&InfoPassthrough != 0 }

// NetworkBacking reports a file on a network or cluster file system.
func (in Info) NetworkBacking() bool { return in.Flags&InfoNetworkBacking != 0 }

// ReadOnly reports a read-only mount.
func (in Info) ReadOnly() bool { return in.Flags&InfoReadOnly != 0 }

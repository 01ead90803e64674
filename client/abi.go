// Package client is the application side of phxmount's ioctl ABI, and the one
// place where that ABI is defined: command numbers, struct layouts and their
// encoding. The daemon (package fusefs) decodes requests with the same
// functions. docs/abi.md documents the ABI for C and Python programs.
//
// Every struct travels as a restricted FUSE ioctl: the kernel copies exactly
// _IOC_SIZE(cmd) bytes in and (for _IOWR commands) the same number of bytes
// back, and follows no pointer. Every struct starts with a 4-byte magic and a
// 2-byte version; all integers are little-endian.
package client

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// Type is the ioctl type byte of every phxmount command (the kernel module
// uses 0x88; this one is private to the FUSE daemon).
const Type = 0xE5

// Magic opens every struct: the bytes "PHXM" (0x4D584850 little-endian).
const Magic uint32 = 0x4D584850

// Version is the ABI version every struct carries.
const Version uint16 = 1

// Command numbers (_IOC_NR).
const (
	NrRegister   = 0x01
	NrDeregister = 0x02
	NrRead       = 0x03
	NrWrite      = 0x04
	NrBatchRead  = 0x05
	NrBatchWrite = 0x06
	NrInfo       = 0x07
)

// Struct sizes.
const (
	RegisterSize   = 128
	DeregisterSize = 32
	IOSize         = 48
	BatchHeader    = 16
	ExtentSize     = 40
	InfoSize       = 512
	// MaxIoctlSize is the largest payload a restricted FUSE ioctl carries.
	MaxIoctlSize = 16383
	// MaxExtents is the largest batch one ioctl can carry.
	MaxExtents = (MaxIoctlSize - BatchHeader) / ExtentSize // 409
	HandleSize = 64
	TokenSize  = 16
)

// BatchClasses are the batch capacities the Go client uses: a batch is sent
// in the smallest class that holds it, so small batches do not copy 16 KiB
// each way. The daemon accepts any capacity from 1 to MaxExtents.
var BatchClasses = []int{16, 128, 400}

const (
	iocWrite = 1
	iocRead  = 2
)

func ioc(dir, nr, size uint32) uint32 { return dir<<30 | size<<16 | Type<<8 | nr }

// The command values.
var (
	CmdRegister   = ioc(iocRead|iocWrite, NrRegister, RegisterSize) // 0xC080E501
	CmdDeregister = ioc(iocWrite, NrDeregister, DeregisterSize)     // 0x4020E502
	CmdRead       = ioc(iocRead|iocWrite, NrRead, IOSize)           // 0xC030E503
	CmdWrite      = ioc(iocRead|iocWrite, NrWrite, IOSize)          // 0xC030E504
	CmdInfo       = ioc(iocRead|iocWrite, NrInfo, InfoSize)         // 0xC200E507
)

// BatchSize is the payload size of a batch of the given capacity.
func BatchSize(capacity int) int { return BatchHeader + capacity*ExtentSize }

// CmdBatch is the BATCH_READ (write=false) or BATCH_WRITE command of a batch
// of the given capacity (1 to MaxExtents).
func CmdBatch(write bool, capacity int) uint32 {
	nr := uint32(NrBatchRead)
	if write {
		nr = NrBatchWrite
	}
	return ioc(iocRead|iocWrite, nr, uint32(BatchSize(capacity)))
}

// Cmd is a decoded ioctl command number.
type Cmd struct {
	Dir  uint32 // 1 write (in), 2 read (out), 3 both
	Type uint32
	Nr   uint32
	Size int
}

// cmdNames names the commands by number.
var cmdNames = map[uint32]string{
	NrRegister: "REGISTER", NrDeregister: "DEREGISTER", NrRead: "READ", NrWrite: "WRITE",
	NrBatchRead: "BATCH_READ", NrBatchWrite: "BATCH_WRITE", NrInfo: "INFO",
}

// String names the command ("BATCH_READ"), or says what it is not.
func (c Cmd) String() string {
	if c.Type == Type {
		if n, ok := cmdNames[c.Nr]; ok {
			return n
		}
	}
	return fmt.Sprintf("ioctl(type %#x, nr %#x)", c.Type, c.Nr)
}

// ParseCmd splits an ioctl command number.
func ParseCmd(cmd uint32) Cmd {
	return Cmd{Dir: cmd >> 30, Type: (cmd >> 8) & 0xff, Nr: cmd & 0xff, Size: int((cmd >> 16) & 0x3fff)}
}

// Known reports whether cmd is exactly one of the project's commands (right
// type, number, direction and size). A command of the project's type and a
// known number with a wrong direction or size is malformed (EINVAL); any
// other command is not the project's (ENOTTY).
func Known(cmd uint32) (ours bool, err error) {
	c := ParseCmd(cmd)
	if c.Type != Type {
		return false, nil
	}
	want := func(dir uint32, size int) (bool, error) {
		if c.Dir != dir || c.Size != size {
			return true, fmt.Errorf("phx: command %#x: direction %d size %d, want %d and %d: %w", cmd, c.Dir, c.Size, dir, size, unix.EINVAL)
		}
		return true, nil
	}
	switch c.Nr {
	case NrRegister:
		return want(iocRead|iocWrite, RegisterSize)
	case NrDeregister:
		return want(iocWrite, DeregisterSize)
	case NrRead, NrWrite:
		return want(iocRead|iocWrite, IOSize)
	case NrInfo:
		return want(iocRead|iocWrite, InfoSize)
	case NrBatchRead, NrBatchWrite:
		if _, err := batchCapacity(c.Size); err != nil {
			return true, err
		}
		return want(iocRead|iocWrite, c.Size)
	}
	return false, nil
}

func batchCapacity(size int) (int, error) {
	if size < BatchHeader+ExtentSize || (size-BatchHeader)%ExtentSize != 0 || size > MaxIoctlSize {
		return 0, fmt.Errorf("phx: batch payload of %d bytes is not 16 + 40*k (1 <= k <= %d): %w", size, MaxExtents, unix.EINVAL)
	}
	return (size - BatchHeader) / ExtentSize, nil
}

// Vendor names the kind of device memory a handle refers to.
type Vendor uint32

const (
	// VendorAny accepts whatever vendor the mount serves.
	VendorAny    Vendor = 0
	VendorEmu    Vendor = 1
	VendorNvidia Vendor = 2
	VendorPCIBar Vendor = 3
)

// VendorByName maps a connector's vendor name to its code (VendorAny for
// names the ABI does not know).
func VendorByName(name string) Vendor {
	switch name {
	case "emu":
		return VendorEmu
	case "nvidia":
		return VendorNvidia
	case "pcibar":
		return VendorPCIBar
	}
	return VendorAny
}

func (v Vendor) String() string {
	switch v {
	case VendorAny:
		return "any"
	case VendorEmu:
		return "emu"
	case VendorNvidia:
		return "nvidia"
	case VendorPCIBar:
		return "pcibar"
	}
	return fmt.Sprintf("vendor(%d)", uint32(v))
}

// Transport is the path bytes take between storage and device memory.
type Transport uint32

const (
	TransportUnknown Transport = 0
	TransportKmod    Transport = 1
	TransportHost    Transport = 2
	TransportStaged  Transport = 3
)

// TransportByName maps phxfs's transport names to codes.
func TransportByName(name string) Transport {
	switch name {
	case "kmod":
		return TransportKmod
	case "host":
		return TransportHost
	case "staged":
		return TransportStaged
	}
	return TransportUnknown
}

func (t Transport) String() string {
	switch t {
	case TransportKmod:
		return "kmod"
	case TransportHost:
		return "host"
	case TransportStaged:
		return "staged"
	case TransportUnknown:
		return "unknown"
	}
	return fmt.Sprintf("transport(%d)", uint32(t))
}

// Token is a registration's capability: whoever holds it can load files
// into the buffer through the user.phx.load xattr.
type Token [TokenSize]byte

// String is the token in lower-case hex, as user.phx.load takes it.
func (t Token) String() string { return fmt.Sprintf("%x", t[:]) }

var le = binary.LittleEndian

func einval(format string, args ...any) error {
	return fmt.Errorf("phx: "+format+": %w", append(args, unix.EINVAL)...)
}

// checkHeader checks the size, magic and version of a struct; the 2 bytes
// at offset 6 are flags that must be zero in version 1.
func checkHeader(b []byte, size int, what string) error {
	if len(b) != size {
		return einval("%s: %d bytes, want %d", what, len(b), size)
	}
	if m := le.Uint32(b[0:]); m != Magic {
		return einval("%s: magic %#x, want %#x", what, m, Magic)
	}
	if v := le.Uint16(b[4:]); v != Version {
		return einval("%s: version %d, want %d", what, v, Version)
	}
	if f := le.Uint16(b[6:]); f != 0 {
		return einval("%s: flags %#x, want 0", what, f)
	}
	return nil
}

func putHeader(b []byte) {
	le.PutUint32(b[0:], Magic)
	le.PutUint16(b[4:], Version)
	le.PutUint16(b[6:], 0)
}

func zero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// RegisterReq is REGISTER's input.
type RegisterReq struct {
	Vendor Vendor
	Device uint32
	Size   uint64
	Handle [HandleSize]byte
}

// RegisterResp is REGISTER's output.
type RegisterResp struct {
	ID        uint64
	Token     Token
	Transport Transport
}

// EncodeRegister lays out a REGISTER request (outputs zero).
func EncodeRegister(r RegisterReq) []byte {
	b := make([]byte, RegisterSize)
	putHeader(b)
	le.PutUint32(b[8:], uint32(r.Vendor))
	le.PutUint32(b[12:], r.Device)
	le.PutUint64(b[16:], r.Size)
	copy(b[24:88], r.Handle[:])
	return b
}

// DecodeRegister checks and decodes a REGISTER request. The output fields
// (offsets 88 to 127) must be zero.
func DecodeRegister(b []byte) (RegisterReq, error) {
	if err := checkHeader(b, RegisterSize, "register"); err != nil {
		return RegisterReq{}, err
	}
	if !zero(b[88:]) {
		return RegisterReq{}, einval("register: output and reserved fields must be zero")
	}
	r := RegisterReq{Vendor: Vendor(le.Uint32(b[8:])), Device: le.Uint32(b[12:]), Size: le.Uint64(b[16:])}
	copy(r.Handle[:], b[24:88])
	return r, nil
}

// EncodeRegisterResp fills out (RegisterSize bytes) with the request echoed
// and the response.
func EncodeRegisterResp(out []byte, req RegisterReq, resp RegisterResp) {
	copy(out, EncodeRegister(req))
	le.PutUint64(out[88:], resp.ID)
	copy(out[96:112], resp.Token[:])
	le.PutUint32(out[112:], uint32(resp.Transport))
}

// DecodeRegisterResp reads REGISTER's output.
func DecodeRegisterResp(b []byte) (RegisterResp, error) {
	if err := checkHeader(b, RegisterSize, "register reply"); err != nil {
		return RegisterResp{}, err
	}
	r := RegisterResp{ID: le.Uint64(b[88:]), Transport: Transport(le.Uint32(b[112:]))}
	copy(r.Token[:], b[96:112])
	if r.ID == 0 {
		return RegisterResp{}, einval("register reply: buffer id 0")
	}
	return r, nil
}

// EncodeDeregister lays out a DEREGISTER request.
func EncodeDeregister(id uint64) []byte {
	b := make([]byte, DeregisterSize)
	putHeader(b)
	le.PutUint64(b[8:], id)
	return b
}

// DecodeDeregister checks and decodes a DEREGISTER request.
func DecodeDeregister(b []byte) (uint64, error) {
	if err := checkHeader(b, DeregisterSize, "deregister"); err != nil {
		return 0, err
	}
	if !zero(b[16:]) {
		return 0, einval("deregister: reserved fields must be zero")
	}
	return le.Uint64(b[8:]), nil
}

// IOReq is one extent: a READ or WRITE request, or one entry of a batch.
type IOReq struct {
	ID         uint64
	BufOffset  uint64
	Length     uint64
	FileOffset uint64
}

// MaxOffset bounds every offset and length: values of 2^63 and more are
// invalid (EINVAL).
const MaxOffset = 1<<63 - 1

// Valid checks that an extent's numbers are representable (EINVAL
// otherwise); bounds against the buffer are the daemon's business.
func (r IOReq) Valid() error {
	if r.BufOffset > MaxOffset || r.Length > MaxOffset || r.FileOffset > MaxOffset {
		return einval("extent offsets and lengths must be below 2^63")
	}
	if r.FileOffset+r.Length > MaxOffset {
		return einval("extent [%d, +%d) runs past the largest file offset", r.FileOffset, r.Length)
	}
	return nil
}

// EncodeIO lays out a READ or WRITE request (result zero).
func EncodeIO(r IOReq) []byte {
	b := make([]byte, IOSize)
	putHeader(b)
	putExtent(b[8:], r)
	return b
}

func putExtent(b []byte, r IOReq) {
	le.PutUint64(b[0:], r.ID)
	le.PutUint64(b[8:], r.BufOffset)
	le.PutUint64(b[16:], r.Length)
	le.PutUint64(b[24:], r.FileOffset)
}

func getExtent(b []byte) IOReq {
	return IOReq{ID: le.Uint64(b[0:]), BufOffset: le.Uint64(b[8:]), Length: le.Uint64(b[16:]), FileOffset: le.Uint64(b[24:])}
}

// DecodeIO checks and decodes a READ or WRITE request. The result field
// must be zero on input.
func DecodeIO(b []byte) (IOReq, error) {
	if err := checkHeader(b, IOSize, "read/write"); err != nil {
		return IOReq{}, err
	}
	if le.Uint64(b[40:]) != 0 {
		return IOReq{}, einval("read/write: result field must be zero")
	}
	r := getExtent(b[8:])
	if err := r.Valid(); err != nil {
		return IOReq{}, err
	}
	return r, nil
}

// EncodeIOResp fills out (IOSize bytes) with the request and its result.
func EncodeIOResp(out []byte, r IOReq, result int64) {
	copy(out, EncodeIO(r))
	le.PutUint64(out[40:], uint64(result))
}

// DecodeIOResp reads the result of a READ or WRITE.
func DecodeIOResp(b []byte) (int64, error) {
	if err := checkHeader(b, IOSize, "read/write reply"); err != nil {
		return 0, err
	}
	return int64(le.Uint64(b[40:])), nil
}

// EncodeBatch lays out a batch of len(reqs) extents in a payload of the
// given capacity (len(reqs) <= capacity <= MaxExtents).
func EncodeBatch(capacity int, reqs []IOReq) ([]byte, error) {
	if capacity < 1 || capacity > MaxExtents || len(reqs) > capacity {
		return nil, einval("batch of %d extents in capacity %d (1 to %d)", len(reqs), capacity, MaxExtents)
	}
	b := make([]byte, BatchSize(capacity))
	putHeader(b)
	le.PutUint32(b[8:], uint32(len(reqs)))
	for i, r := range reqs {
		putExtent(b[BatchHeader+i*ExtentSize:], r)
	}
	return b, nil
}

// DecodeBatch checks and decodes a batch payload. An extent whose numbers
// are not representable (IOReq.Valid) is returned with its error in bad, so
// that it gets a per-extent -EINVAL while the rest proceed. Slots past the
// count must be zero, as must the failed count and every result.
func DecodeBatch(b []byte) (reqs []IOReq, bad []error, err error) {
	capacity, err := batchCapacity(len(b))
	if err != nil {
		return nil, nil, err
	}
	if err := checkHeader(b, len(b), "batch"); err != nil {
		return nil, nil, err
	}
	n := le.Uint32(b[8:])
	if n > uint32(capacity) {
		return nil, nil, einval("batch: count %d exceeds the capacity %d", n, capacity)
	}
	if le.Uint32(b[12:]) != 0 {
		return nil, nil, einval("batch: failed count must be zero on input")
	}
	if !zero(b[BatchHeader+int(n)*ExtentSize:]) {
		return nil, nil, einval("batch: slots past the count must be zero")
	}
	reqs = make([]IOReq, n)
	bad = make([]error, n)
	for i := range reqs {
		e := b[BatchHeader+i*ExtentSize:]
		if le.Uint64(e[32:]) != 0 {
			return nil, nil, einval("batch: extent %d: result field must be zero on input", i)
		}
		reqs[i] = getExtent(e)
		bad[i] = reqs[i].Valid()
	}
	return reqs, bad, nil
}

// EncodeBatchResp fills out (the request's size) with the request echoed,
// the failed count and a result per extent.
func EncodeBatchResp(out, in []byte, results []int64) {
	copy(out, in)
	failed := uint32(0)
	for i, r := range results {
		e := out[BatchHeader+i*ExtentSize:]
		le.PutUint64(e[32:], uint64(r))
		if r < 0 || uint64(r) != le.Uint64(e[16:]) {
			failed++
		}
	}
	le.PutUint32(out[12:], failed)
}

// DecodeBatchResp reads a batch's results into results (len = count) and
// returns the daemon's failed count.
func DecodeBatchResp(b []byte, results []int64) (int, error) {
	capacity, err := batchCapacity(len(b))
	if err != nil {
		return 0, err
	}
	if err := checkHeader(b, len(b), "batch reply"); err != nil {
		return 0, err
	}
	n := int(le.Uint32(b[8:]))
	if n > capacity || n != len(results) {
		return 0, einval("batch reply: count %d, want %d", n, len(results))
	}
	for i := range results {
		results[i] = int64(le.Uint64(b[BatchHeader+i*ExtentSize+32:]))
	}
	return int(le.Uint32(b[12:])), nil
}

// Info is INFO's output: what a GPU-direct read through this mount would
// do, and the daemon's counters.
type Info struct {
	Device         int32 // the device described (input)
	Transport      Transport
	Flags          uint32 // InfoPassthrough, InfoReadOnly, InfoHostAddressable
	Workers        uint32
	PageSize       uint64 // registrations: size and device address alignment
	BounceSize     uint64 // staged transport: bounce buffer size
	DIOMemAlign    uint32 // O_DIRECT alignment of the backing file (0: unknown)
	DIOOffsetAlign uint32
	Devices        uint32 // devices the connector has
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

// EncodeInfoReq lays out an INFO request for device dev.
func EncodeInfoReq(dev int32) []byte {
	b := make([]byte, InfoSize)
	putHeader(b)
	le.PutUint32(b[8:], uint32(dev))
	return b
}

// DecodeInfoReq checks an INFO request and returns the device it asks
// about. Everything past offset 12 must be zero.
func DecodeInfoReq(b []byte) (int32, error) {
	if err := checkHeader(b, InfoSize, "info"); err != nil {
		return 0, err
	}
	if !zero(b[12:]) {
		return 0, einval("info: output fields must be zero on input")
	}
	return int32(le.Uint32(b[8:])), nil
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
		Vendor: getString(b[56:72]), Engine: getString(b[72:88]), PCIAddress: getString(b[88:120]),
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

// ReadOnly reports a read-only mount.
func (in Info) ReadOnly() bool { return in.Flags&InfoReadOnly != 0 }

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
	// NrBatchReadStrided and NrBatchWriteStrided are batches of strided
	// extents: each moves count pieces at a fixed stride in the file and
	// in the buffer (a tensor-parallel rank's column slice of every row).
	NrBatchReadStrided  = 0x08
	NrBatchWriteStrided = 0x09
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
	// StridedExtentSize is a strided batch's extent: an extent's four
	// fields, count, file_stride, buf_stride, then the result.
	StridedExtentSize = 64
	// MaxStridedExtents is the largest strided batch one ioctl can carry.
	MaxStridedExtents = (MaxIoctlSize - BatchHeader) / StridedExtentSize // 255
	HandleSize        = 64
	TokenSize         = 16
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

// batchLayout is one of the two batch formats: plain extents, or strided
// ones. Both share the header; they differ in their command numbers and in
// the size of an extent, whose result is its last field.
type batchLayout struct {
	what            string
	nrRead, nrWrite uint32
	extent, max     int
}

var (
	plainBatch   = batchLayout{"batch", NrBatchRead, NrBatchWrite, ExtentSize, MaxExtents}
	stridedBatch = batchLayout{"strided batch", NrBatchReadStrided, NrBatchWriteStrided, StridedExtentSize, MaxStridedExtents}
)

func (l batchLayout) size(capacity int) int { return BatchHeader + capacity*l.extent }

func (l batchLayout) cmd(write bool, capacity int) uint32 {
	nr := l.nrRead
	if write {
		nr = l.nrWrite
	}
	return ioc(iocRead|iocWrite, nr, uint32(l.size(capacity)))
}

// capacity is the number of extents a payload of size bytes holds.
func (l batchLayout) capacity(size int) (int, error) {
	if size < BatchHeader+l.extent || (size-BatchHeader)%l.extent != 0 || size > MaxIoctlSize {
		return 0, fmt.Errorf("phx: %s payload of %d bytes is not 16 + %d*k (1 <= k <= %d): %w", l.what, size, l.extent, l.max, unix.EINVAL)
	}
	return (size - BatchHeader) / l.extent, nil
}

// layoutOf is the batch layout of a command number (ok false: not a batch).
func layoutOf(nr uint32) (batchLayout, bool) {
	switch nr {
	case NrBatchRead, NrBatchWrite:
		return plainBatch, true
	case NrBatchReadStrided, NrBatchWriteStrided:
		return stridedBatch, true
	}
	return batchLayout{}, false
}

// BatchSize is the payload size of a batch of the given capacity.
func BatchSize(capacity int) int { return plainBatch.size(capacity) }

// StridedBatchSize is the payload size of a strided batch of the given
// capacity.
func StridedBatchSize(capacity int) int { return stridedBatch.size(capacity) }

// CmdBatch is the BATCH_READ (write=false) or BATCH_WRITE command of a batch
// of the given capacity (1 to MaxExtents).
func CmdBatch(write bool, capacity int) uint32 { return plainBatch.cmd(write, capacity) }

// CmdStridedBatch is the BATCH_READ_STRIDED or BATCH_WRITE_STRIDED command
// of a strided batch of the given capacity (1 to MaxStridedExtents).
func CmdStridedBatch(write bool, capacity int) uint32 { return stridedBatch.cmd(write, capacity) }

// IsBatch reports whether the command number nr is one of the batches,
// and whether it writes.
func IsBatch(nr uint32) (batch, write bool) {
	l, ok := layoutOf(nr)
	return ok, ok && nr == l.nrWrite
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
	NrBatchReadStrided: "BATCH_READ_STRIDED", NrBatchWriteStrided: "BATCH_WRITE_STRIDED",
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
	}
	if l, ok := layoutOf(c.Nr); ok {
		if _, err := l.capacity(c.Size); err != nil {
			return true, err
		}
		return want(iocRead|iocWrite, c.Size)
	}
	return false, nil
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

// vendorNames is the vendors' names, by code.
var vendorNames = [...]string{VendorAny: "any", VendorEmu: "emu", VendorNvidia: "nvidia", VendorPCIBar: "pcibar"}

// VendorByName maps a connector's vendor name to its code (VendorAny for
// names the ABI does not know).
func VendorByName(name string) Vendor { return Vendor(codeOf(vendorNames[:], name)) }

func (v Vendor) String() string { return nameOf(vendorNames[:], uint32(v), "vendor") }

// Transport is the path bytes take between storage and device memory.
type Transport uint32

const (
	TransportUnknown Transport = 0
	TransportKmod    Transport = 1
	TransportHost    Transport = 2
	TransportStaged  Transport = 3
)

// transportNames is the transports' names, by code.
var transportNames = [...]string{TransportUnknown: "unknown", TransportKmod: "kmod", TransportHost: "host", TransportStaged: "staged"}

// TransportByName maps phxfs's transport names to codes.
func TransportByName(name string) Transport {
	return Transport(codeOf(transportNames[:], name))
}

func (t Transport) String() string { return nameOf(transportNames[:], uint32(t), "transport") }

// codeOf is the index of name in names, 0 when it is not there.
func codeOf(names []string, name string) uint32 {
	for i, n := range names {
		if n == name && i > 0 {
			return uint32(i)
		}
	}
	return 0
}

// nameOf is names[code], or kind(code) past the table.
func nameOf(names []string, code uint32, kind string) string {
	if int(code) < len(names) {
		return names[code]
	}
	return fmt.Sprintf("%s(%d)", kind, code)
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

// encodeOneField lays out a request of size bytes whose one input is v,
// an integer of width bytes at offset 8 (INFO, DEREGISTER).
func encodeOneField(size, width int, v uint64) []byte {
	b := make([]byte, size)
	putHeader(b)
	var w [8]byte
	le.PutUint64(w[:], v)
	copy(b[8:8+width], w[:width])
	return b
}

// decodeOneField checks a request that encodeOneField lays out and returns
// its field; everything past it must be zero (else EINVAL saying why).
func decodeOneField(b []byte, size, width int, what, why string) (uint64, error) {
	if err := checkHeader(b, size, what); err != nil {
		return 0, err
	}
	if !zero(b[8+width:]) {
		return 0, einval("%s: %s", what, why)
	}
	var w [8]byte
	copy(w[:], b[8:8+width])
	return le.Uint64(w[:]), nil
}

func zero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

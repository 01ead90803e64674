package fusefs

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/internal/errs"
)

// The virtual xattrs (docs/abi.md, "Virtual xattrs").
const (
	XattrInfo = XattrPrefix + "info"
	XattrLoad = XattrPrefix + "load"
)

// info gathers INFO's answer for device dev; fd (the daemon's descriptor on
// the file asked about, or -1) gives the O_DIRECT alignment.
func (s *ControlServer) info(dev int, fd int, cache func() CacheInfo) (client.Info, unix.Errno) {
	if dev < 0 || dev > client.MaxDevice {
		return client.Info{}, unix.ENODEV
	}
	if err := s.openDevice(dev); err != nil {
		return client.Info{}, errs.Errno(err)
	}
	d, err := s.lib.Device(dev)
	if err != nil {
		return client.Info{}, errs.Errno(err)
	}
	infos, _ := s.conn.Devices()
	in := client.Info{
		Device:     int32(dev),
		Transport:  client.TransportByName(string(d.Transport)),
		Workers:    uint32(s.lib.Workers()),
		PageSize:   uint64(d.PageSize),
		BounceSize: uint64(s.lib.BounceSize()),
		Devices:    uint32(len(infos)),
		Vendor:     s.conn.Vendor(),
		Engine:     s.lib.EngineName(),
		PCIAddress: d.PCIAddress,
		DeviceName: d.Name,
	}
	if known, active, why := s.passthrough(); known {
		if active {
			in.Flags |= client.InfoPassthrough
		}
		in.PassthroughWhy = why
	} else {
		in.PassthroughWhy = "unknown: " + why
	}
	if s.cfg.ReadOnly {
		in.Flags |= client.InfoReadOnly
	}
	if s.conn.HostAddressable() {
		in.Flags |= client.InfoHostAddressable
	}
	if s.lib.StagedStats().Cachestat {
		in.Flags |= client.InfoCachestat
	}
	if s.lib.EngineFallback() != nil {
		in.Flags |= client.InfoEngineFallback
	}
	if fd >= 0 {
		in.DIOMemAlign, in.DIOOffsetAlign = dioAlign(fd)
	}
	if cache != nil {
		ci := cache()
		in.Cache = ci.Class
		if ci.Network {
			in.Flags |= client.InfoNetworkBacking
		}
	}
	in.Counters = s.counters()
	return in, 0
}

// dioAlign is the backing file's O_DIRECT alignment (0, 0 when unknown).
func dioAlign(fd int) (mem, off uint32) {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &stx); err != nil || stx.Mask&unix.STATX_DIOALIGN == 0 {
		return 0, 0
	}
	return stx.Dio_mem_align, stx.Dio_offset_align
}

// Counters returns the counters INFO and user.phx.info carry (the
// metrics endpoint reads them at each scrape).
func (s *ControlServer) Counters() client.Counters { return s.counters() }

func (s *ControlServer) counters() client.Counters {
	s.mu.Lock()
	live := uint64(len(s.bufs))
	s.mu.Unlock()
	ls, ss := s.lib.Stats(), s.lib.StagedStats()
	st := &s.stats
	return client.Counters{
		BuffersLive: live, BuffersRegistered: st.registered.Load(), ReleasedDeregister: st.relDereg.Load(),
		ReleasedClose: st.relClose.Load(), ReleasedDeath: st.relDeath.Load(),
		IoctlBytesRead: st.bytesRead.Load(), IoctlBytesWritten: st.bytesWritten.Load(),
		IoctlExtents: st.extents.Load(), IoctlFailedExtents: st.failedExtents.Load(),
		IoctlRejected: st.rejected.Load(), IoctlCalls: st.calls.Load(),
		LibBytesRead: uint64(ls.BytesRead), LibBytesWritten: uint64(ls.BytesWritten),
		LibRequests: uint64(ls.Requests), LibOps: uint64(ls.Ops), LibCoalesced: uint64(ls.Coalesced),
		LibFailed: uint64(ls.Failed), LibBatches: uint64(ls.Batches), XattrLoads: st.loads.Load(),
		StagedDirectReads: uint64(ss.DirectReads), StagedDirectBytes: uint64(ss.DirectBytes),
		StagedBufferedReads: uint64(ss.BufferedReads), StagedBufferedBytes: uint64(ss.BufferedBytes),
		StagedFallbacks: uint64(ss.Fallbacks),
	}
}

// GetXattr implements Control.
func (s *ControlServer) GetXattr(c Caller, t XattrTarget, name string) ([]byte, syscall.Errno) {
	if name != XattrInfo {
		return nil, unix.ENODATA
	}
	fd := -1
	var st unix.Stat_t
	haveStat := false
	if t.Open != nil && !t.IsDir {
		if f, e := t.Open(unix.O_RDONLY); e == 0 {
			fd = f
			defer unix.Close(fd)
			haveStat = unix.Fstat(fd, &st) == nil
		}
	}
	in, e := s.info(0, fd, t.Cache)
	var b strings.Builder
	kv := func(k string, v any) { fmt.Fprintf(&b, "%s=%v\n", k, v) }
	path := t.Name
	if t.IsRoot || path == "" {
		path = "."
	}
	kv("path", path)
	if haveStat {
		kv("size", st.Size)
	}
	if e != 0 {
		kv("transport", "unavailable")
		kv("transport_why", "device 0: "+e.Error())
	} else {
		d, _ := s.lib.Device(0)
		kv("transport", in.Transport)
		kv("transport_why", d.TransportWhy)
	}
	kv("vendor", s.conn.Vendor())
	if e == 0 {
		kv("device", 0)
		kv("devices", in.Devices)
		kv("device_name", in.DeviceName)
		kv("pci", in.PCIAddress)
		kv("page_size", in.PageSize)
		if fd >= 0 {
			kv("dio_mem_align", in.DIOMemAlign)
			kv("dio_offset_align", in.DIOOffsetAlign)
		}
		kv("engine", in.Engine)
		if err := s.lib.EngineFallback(); err != nil {
			kv("engine_why", "io_uring unavailable to some workers: "+err.Error())
		}
		kv("workers", in.Workers)
		kv("bounce_size", in.BounceSize)
	}
	kv("read_policy", s.lib.ODirectPolicy())
	ss := s.lib.StagedStats()
	kv("cachestat", ss.Cachestat)
	if g := s.lib.GatherMax(); g < 0 {
		kv("gather", "off: small resident transfers are read with the engine")
	} else {
		kv("gather", fmt.Sprintf("transfers of up to %d bytes in the page cache are copied from a mapping of the file", g))
	}
	kv("staged_gathered_reads", ss.GatheredReads)
	kv("staged_gathered_bytes", ss.GatheredBytes)
	writebackKeys(kv, s.lib.WritebackStats())
	if sr, ok := s.conn.(interface{ ScatterReport() string }); ok {
		kv("scatter", sr.ScatterReport())
	}
	known, active, why := s.passthrough()
	switch {
	case !known:
		kv("passthrough", "unknown")
	case active:
		kv("passthrough", "active")
	default:
		kv("passthrough", "inactive")
	}
	kv("passthrough_why", strings.ReplaceAll(why, "\n", " "))
	kv("read_only", s.cfg.ReadOnly)
	if t.Cache != nil {
		cacheKeys(kv, t.Cache())
	}
	ct := s.counters()
	ct.Each(func(name string, v uint64) { kv(name, v) })
	return []byte(b.String()), 0
}

// loadReq is a parsed user.phx.load value.
type loadReq struct {
	token      client.Token
	offset     uint64
	length     uint64
	hasLength  bool
	fileOffset uint64
}

// parseLoad parses "token=<hex>,offset=N[,length=N][,file_offset=N]".
func parseLoad(v []byte) (loadReq, error) {
	var r loadReq
	// max_load_value bounds the value as set; a trailing NUL (a C string
	// set with its terminator) or newline is then ignored.
	s := strings.TrimRight(string(v), "\x00\n")
	if s == "" || len(v) > client.MaxLoadValue {
		return r, errs.New(unix.EINVAL, "user.phx.load: empty or oversized value")
	}
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || val == "" {
			return r, errs.New(unix.EINVAL, "user.phx.load: %q is not key=value", part)
		}
		if seen[k] {
			return r, errs.New(unix.EINVAL, "user.phx.load: %s given twice", k)
		}
		seen[k] = true
		if k == "token" {
			if len(val) != 2*client.TokenSize {
				return r, errs.New(unix.EINVAL, "user.phx.load: token must be %d hex digits", 2*client.TokenSize)
			}
			if _, err := hex.Decode(r.token[:], []byte(val)); err != nil {
				return r, errs.New(unix.EINVAL, "user.phx.load: token: %v", err)
			}
			continue
		}
		n, ok := loadNumber(val)
		if !ok {
			return r, errs.New(unix.EINVAL, "user.phx.load: %s=%q is not a decimal or 0x hex number below 2^63", k, val)
		}
		switch k {
		case "offset":
			r.offset = n
		case "length":
			r.length, r.hasLength = n, true
		case "file_offset":
			r.fileOffset = n
		default:
			return r, errs.New(unix.EINVAL, "user.phx.load: unknown key %q", k)
		}
	}
	if !seen["token"] || !seen["offset"] {
		return r, errs.New(unix.EINVAL, "user.phx.load: token and offset are required")
	}
	return r, nil
}

// loadNumber parses a user.phx.load number: decimal, or hex after 0x
// (docs/abi.md), below 2^63. Not strconv's base 0, which reads a leading
// 0 as octal (offset=010 would be 8) and takes 0b, 0o and underscores.
func loadNumber(s string) (uint64, bool) {
	base := 10
	if h, ok := strings.CutPrefix(s, "0x"); ok {
		base, s = 16, h
	} else if h, ok := strings.CutPrefix(s, "0X"); ok {
		base, s = 16, h
	}
	n, err := strconv.ParseUint(s, base, 63)
	return n, err == nil && n <= client.MaxOffset
}

// SetXattr implements Control.
func (s *ControlServer) SetXattr(c Caller, t XattrTarget, name string, value []byte) syscall.Errno {
	if name != XattrLoad {
		return unix.ENOTSUP
	}
	r, err := parseLoad(value)
	if err != nil {
		return errs.Errno(err)
	}
	if t.IsDir {
		return unix.EISDIR
	}
	b, e := s.holdToken(r.token)
	if e != 0 {
		return e
	}
	defer b.reg.Release()
	if b.reg.ReadOnly() {
		return unix.EACCES // shared read-only: nothing may be loaded into it
	}
	bsize := uint64(b.reg.Size())
	if r.offset > bsize {
		return unix.EFAULT
	}

	if t.Open == nil {
		return unix.EACCES
	}
	fd, e := t.Open(unix.O_RDONLY)
	if e != 0 {
		return e
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return errs.Errno(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return unix.EISDIR
	}
	size := uint64(max(st.Size, 0))
	length := r.length
	if r.hasLength {
		if r.fileOffset > size || length > size-r.fileOffset {
			return unix.EINVAL
		}
	} else {
		if r.fileOffset < size {
			length = size - r.fileOffset
		}
		if length > 0 && r.offset == bsize {
			return unix.EFAULT // the file has bytes and none fits
		}
		length = min(length, bsize-r.offset)
	}
	if length > bsize-r.offset {
		return unix.EFAULT
	}
	n, err := s.lib.Read(fd, b.reg.Device(), b.reg.Addr(), int64(r.offset), int64(length), int64(r.fileOffset))
	if err != nil {
		return errs.Errno(err)
	}
	if uint64(n) != length {
		return unix.EIO
	}
	s.stats.loads.Add(1)
	s.stats.bytesRead.Add(uint64(n))
	s.log.WithFields(logrus.Fields{"id": b.id, "pid": c.Tgid, "uid": c.UID, "file": t.Name}).
		Infof("user.phx.load: %d bytes of %s into buffer %d at %d", n, t.Name, b.id, r.offset)
	return 0
}

// holdToken finds the live buffer a token names and holds its registration
// (the caller releases it): EKEYREJECTED for no live buffer.
func (s *ControlServer) holdToken(tok client.Token) (*buffer, unix.Errno) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.tokens[tok]
	if b == nil || b.reg.Hold() != nil {
		return nil, unix.EKEYREJECTED
	}
	return b, 0
}

package fusefs

import (
	"bytes"
	"encoding/binary"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// Decoding what a fanotify group with FAN_REPORT_DFID_NAME |
// FAN_REPORT_FID reads: struct fanotify_event_metadata, then info records
// (struct fanotify_event_info_header; for the fid types an fsid and a
// struct file_handle, and for DFID_NAME the name after it).

var nativeEndian = binary.NativeEndian

const (
	metaLen = 24 // sizeof(struct fanotify_event_metadata)
	infoLen = 4  // sizeof(struct fanotify_event_info_header)
)

// fevent is one event: the directory and the object by handle key (see
// handleKey), the entry name where there is one.
type fevent struct {
	mask uint64
	pid  int32
	dir  string // DFID_NAME or DFID: the directory
	obj  string // FID: the object itself
	name string
}

// errEventFormat: the kernel writes events in a format this code does not
// know (another metadata version); nothing it reads can be trusted.
var errEventFormat = errs.New(unix.EPROTO, "an event format this daemon does not know")

// parseEvents decodes a read of the fanotify descriptor. An event whose
// info records are malformed is skipped (its length leads to the next)
// and counted; an event length that does not fit ends the decoding with
// an error, keeping the events before it; an unknown metadata version is
// errEventFormat.
func parseEvents(b []byte) (evs []fevent, skipped int, err error) {
	for len(b) > 0 {
		if len(b) < metaLen {
			return evs, skipped, errs.New(unix.EIO, "fanotify: %d bytes left, short of an event", len(b))
		}
		evLen := int(nativeEndian.Uint32(b[0:]))
		vers, mlen := b[4], int(nativeEndian.Uint16(b[6:]))
		if vers != unix.FANOTIFY_METADATA_VERSION {
			return evs, skipped, errs.Wrapf(errEventFormat, "fanotify: event metadata version %d (this daemon reads %d)", vers, unix.FANOTIFY_METADATA_VERSION)
		}
		if evLen < metaLen || evLen > len(b) {
			return evs, skipped, errs.New(unix.EIO, "fanotify: event length %d with %d bytes left", evLen, len(b))
		}
		if fd := int32(nativeEndian.Uint32(b[16:])); fd >= 0 {
			unix.Close(int(fd)) // never with FID reporting; do not leak one
		}
		ev := fevent{mask: nativeEndian.Uint64(b[8:]), pid: int32(nativeEndian.Uint32(b[20:]))}
		if mlen < metaLen || mlen > evLen || ev.parseInfo(b[mlen:evLen]) != nil {
			skipped++
		} else {
			evs = append(evs, ev)
		}
		b = b[evLen:]
	}
	return evs, skipped, nil
}

// parseInfo decodes the info records of one event.
func (ev *fevent) parseInfo(b []byte) error {
	for len(b) >= infoLen {
		typ, n := b[0], int(nativeEndian.Uint16(b[2:]))
		if n < infoLen || n > len(b) {
			return errs.New(unix.EIO, "fanotify: info record of %d bytes with %d left", n, len(b))
		}
		rec := b[infoLen:n]
		b = b[n:]
		switch typ {
		case unix.FAN_EVENT_INFO_TYPE_FID:
			key, _, err := fidRecord(rec)
			if err != nil {
				return err
			}
			ev.obj = key
		case unix.FAN_EVENT_INFO_TYPE_DFID, unix.FAN_EVENT_INFO_TYPE_DFID_NAME:
			key, rest, err := fidRecord(rec)
			if err != nil {
				return err
			}
			ev.dir = key
			if typ == unix.FAN_EVENT_INFO_TYPE_DFID_NAME {
				if i := bytes.IndexByte(rest, 0); i >= 0 {
					rest = rest[:i]
				}
				ev.name = string(rest)
			}
		}
	}
	return nil
}

// fidRecord decodes an fsid and a struct file_handle into a handle key,
// returning what follows the handle.
func fidRecord(b []byte) (key string, rest []byte, err error) {
	if len(b) < 16 {
		return "", nil, errs.New(unix.EIO, "fanotify: fid record of %d bytes", len(b))
	}
	hb := int(nativeEndian.Uint32(b[8:]))
	if 16+hb > len(b) {
		return "", nil, errs.New(unix.EIO, "fanotify: handle of %d bytes in a record of %d", hb, len(b))
	}
	var fsid [8]byte
	copy(fsid[:], b[:8])
	return handleKey(fsid, int32(nativeEndian.Uint32(b[12:])), b[16:16+hb]), b[16+hb:], nil
}

// handleKey identifies an inode as fanotify names it: the file system's
// fsid, the handle type and the handle bytes.
func handleKey(fsid [8]byte, typ int32, h []byte) string {
	k := make([]byte, 0, 12+len(h))
	k = append(k, fsid[:]...)
	k = nativeEndian.AppendUint32(k, uint32(typ))
	return string(append(k, h...))
}

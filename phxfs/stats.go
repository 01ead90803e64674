package phxfs

import "sync/atomic"

// Transports lists the transports in the order TransportStats reports
// them.
var Transports = [...]Transport{Kmod, Host, Staged}

// TransportBytes are the bytes requests moved through one transport since
// New: the results of requests on registrations of that transport (requests
// on plain host memory count under none).
type TransportBytes struct {
	Transport    Transport
	BytesRead    int64
	BytesWritten int64
}

// transportBytes accumulates one batch's bytes per transport, in the order
// of Transports.
type transportBytes [len(Transports)]int64

func (b *transportBytes) add(t Transport, n int64) {
	for i, x := range Transports {
		if x == t {
			b[i] += n
			return
		}
	}
}

// transportCounters are the library's bytes per transport and direction.
type transportCounters struct {
	read, written [len(Transports)]atomic.Int64
}

func (c *transportCounters) add(write bool, b *transportBytes) {
	to := &c.read
	if write {
		to = &c.written
	}
	for i, n := range b {
		if n != 0 {
			to[i].Add(n)
		}
	}
}

// TransportStats returns the bytes moved through each transport, one entry
// per transport in the order of Transports (zero where none moved).
func (l *Lib) TransportStats() []TransportBytes {
	out := make([]TransportBytes, len(Transports))
	for i, t := range Transports {
		out[i] = TransportBytes{Transport: t, BytesRead: l.xportStats.read[i].Load(), BytesWritten: l.xportStats.written[i].Load()}
	}
	return out
}

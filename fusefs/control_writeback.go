package fusefs

import (
	"fmt"

	"github.com/phxmount/phxmount/phxfs"
)

// writebackKeys adds user.phx.info's writeback keys: the policy (large
// staged writes start the kernel's writeback at once, PHX_WRITEBACK) and
// its counters.
func writebackKeys(kv func(string, any), w phxfs.WritebackStats) {
	if w.Min < 0 {
		kv("writeback", "off: written pages wait for the kernel's flusher or an fsync")
	} else {
		kv("writeback", fmt.Sprintf("staged writes of at least %d bytes start the kernel's writeback at once", w.Min))
	}
	kv("writeback_started", w.Kicks)
	kv("writeback_started_bytes", w.Bytes)
	kv("writeback_dropped", w.Dropped)
	kv("writeback_failed", w.Failed)
}

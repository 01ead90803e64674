package fusefs

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// DefaultReadAhead is the readahead of the classic path (Options.MaxReadAhead
// 0): the kernel lets FUSE ask for at most 128 KiB at INIT, which makes a
// sequential read one round trip per 128 KiB; the mount's backing device
// info allows more once it exists.
const DefaultReadAhead = 4 << 20

// tuneReadahead sets the mount's readahead (its bdi's read_ahead_kb) to
// Options.MaxReadAhead or DefaultReadAhead. Needs root; without it the
// kernel's 128 KiB stays, and the log says so.
func (f *FS) tuneReadahead() {
	ra := f.opts.MaxReadAhead
	if ra <= 0 {
		ra = DefaultReadAhead
	}
	var st unix.Stat_t
	if err := unix.Stat(f.mountpoint, &st); err != nil {
		f.log.Debugf("readahead: stat %s: %v", f.mountpoint, err)
		return
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	if err := os.WriteFile(p, []byte(strconv.Itoa(max(ra>>10, 4))), 0); err != nil {
		f.log.Infof("readahead: %s: %v (the kernel's 128 KiB stays)", p, err)
		return
	}
	f.raKB = max(ra>>10, 4)
}

// ReadAheadKB is the readahead set on the mount (0: the kernel's).
func (f *FS) ReadAheadKB() int { return f.raKB }

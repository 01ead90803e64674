package procfs

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// Mount is one line of /proc/self/mountinfo.
type Mount struct {
	ID         int    // the mount's id (a mount made again gets a new one)
	Dev        uint64 // st_dev of the file system mounted
	MountPoint string // unescaped
	FSType     string // "fuse.phxmount", "ext4", ...
	Source     string // unescaped; a FUSE mount's fsname
}

// Mounts lists this process's mount namespace.
func Mounts() ([]Mount, error) {
	f, err := os.Open(Root + "/self/mountinfo")
	if err != nil {
		return nil, errs.Wrapf(err, "procfs: mounts")
	}
	defer f.Close()
	var out []Mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if m, ok := parseMountinfo(sc.Text()); ok {
			out = append(out, m)
		}
	}
	return out, errs.Wrapf(sc.Err(), "procfs: read mountinfo")
}

// MountAt returns the last (topmost) mount whose mount point is dir.
func MountAt(dir string) (Mount, bool) {
	ms, _ := Mounts()
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].MountPoint == dir {
			return ms[i], true
		}
	}
	return Mount{}, false
}

// parseMountinfo reads "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [TAGS...] -
// FSTYPE SOURCE SUPEROPTS".
func parseMountinfo(line string) (Mount, bool) {
	fl := strings.Fields(line)
	if len(fl) < 5 {
		return Mount{}, false
	}
	m := Mount{MountPoint: unescape(fl[4])}
	m.ID, _ = strconv.Atoi(fl[0])
	if maj, min, ok := strings.Cut(fl[2], ":"); ok {
		ma, _ := strconv.ParseUint(maj, 10, 32)
		mi, _ := strconv.ParseUint(min, 10, 32)
		m.Dev = unix.Mkdev(uint32(ma), uint32(mi))
	}
	for i := 5; i < len(fl); i++ {
		if fl[i] == "-" && i+2 < len(fl) {
			m.FSType, m.Source = fl[i+1], unescape(fl[i+2])
			return m, true
		}
	}
	return Mount{}, false
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

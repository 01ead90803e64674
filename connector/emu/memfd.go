package emu

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// shmMount is the mount id of the kernel's internal tmpfs that holds every
// (non-hugetlb) memfd, learnt from a memfd of our own.
var shmMount struct {
	once sync.Once
	id   int
	err  error
}

// checkMemfd checks that fd (an O_PATH descriptor is enough) is an emu
// memfd: named phxemu and on the internal memfd mount. A name alone proves
// nothing: a client in its own mount namespace can bind-mount any file it
// can read at a path that reads "/memfd:phxemu" from here.
func checkMemfd(fd int) error {
	self := fmt.Sprintf("/proc/self/fd/%d", fd)
	target, err := os.Readlink(self)
	if err != nil {
		return errs.Wrapf(err, "emu: readlink %s", self)
	}
	if !strings.HasPrefix(target, "/memfd:"+memfdPrefix) {
		return errs.New(unix.EINVAL, "emu: the exported descriptor now is %q, not an emulated-device buffer", target)
	}
	return onMemfdMount(fd, target)
}

// onMemfdMount checks that fd lies on the kernel's internal memfd mount.
func onMemfdMount(fd int, name string) error {
	shmMount.once.Do(func() {
		probe, err := unix.MemfdCreate(memfdPrefix+"-probe", unix.MFD_CLOEXEC)
		if err != nil {
			shmMount.err = errs.Wrapf(err, "emu: memfd_create")
			return
		}
		shmMount.id, shmMount.err = mountID(probe)
		unix.Close(probe)
	})
	if shmMount.err != nil {
		return shmMount.err
	}
	id, err := mountID(fd)
	if err != nil {
		return err
	}
	if id != shmMount.id {
		return errs.New(unix.EINVAL, "emu: %q is not a memfd (mount %d, memfds are on %d)", name, id, shmMount.id)
	}
	return nil
}

// mountID reads the mount id of this process's descriptor fd.
func mountID(fd int) (int, error) {
	p := fmt.Sprintf("/proc/self/fdinfo/%d", fd)
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, errs.Wrapf(err, "emu: read %s", p)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "mnt_id:"); ok {
			id, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				break
			}
			return id, nil
		}
	}
	return 0, errs.New(unix.EIO, "emu: %s has no mnt_id", p)
}

package emu

import (
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// A registration is memory its exporter holds (Import checks st_blocks),
// but the exporter may free pages of it afterwards (punch holes, shrink
// and grow its memfd). A fault of the daemon on such a page would
// allocate it again, in the daemon's name: charged to the daemon's memory
// cgroup, while the exporter's memfd keeps it. Round after round, a
// client confined to a small cgroup could so hold any amount of memory.
//
// So the daemon's mappings of imported memory are registered with a
// userfaultfd in missing mode with UFFD_FEATURE_SIGBUS: a fault on a page
// the memfd does not hold fails instead of allocating it. The kernel's
// own accesses (a read(2) or O_DIRECT read into the mapping, a write(2)
// out of it) then fail with EFAULT or come up short; a CPU access (the
// staged copy engine's) gets SIGBUS, which faultsafe turns into EFAULT.
// Pages present, or swapped out, are not missing: they work as before.
// One userfaultfd serves the process for its life; no events are ever
// queued on it.

// userfaultfd(2) ABI (linux/userfaultfd.h).
const (
	uffdAPI               = 0xAA
	uffdioAPI             = 0xC018AA3F // _IOWR(0xAA, 0x3F, struct uffdio_api)
	uffdioRegister        = 0xC020AA00 // _IOWR(0xAA, 0x00, struct uffdio_register)
	uffdFeatureSigbus     = 1 << 7
	uffdRegisterModeMiss  = 1 << 0
	uffdFeatureMissingShm = 1 << 5
)

type uffdioAPIArg struct{ api, features, ioctls uint64 }

type uffdioRegisterArg struct{ start, len, mode, ioctls uint64 }

var holeGuard struct {
	once sync.Once
	fd   int
	err  error // why there is no guard
}

// guardFd is the process's userfaultfd, made once.
func guardFd() (int, error) {
	holeGuard.once.Do(func() {
		fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
		if e != 0 {
			holeGuard.fd, holeGuard.err = -1, errs.Wrapf(e, "emu: userfaultfd")
			return
		}
		api := uffdioAPIArg{api: uffdAPI, features: uffdFeatureSigbus}
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, fd, uffdioAPI, uintptr(unsafe.Pointer(&api))); e != 0 {
			unix.Close(int(fd))
			holeGuard.fd, holeGuard.err = -1, errs.Wrapf(e, "emu: userfaultfd UFFDIO_API with UFFD_FEATURE_SIGBUS")
			return
		}
		if api.features&uffdFeatureMissingShm == 0 {
			unix.Close(int(fd))
			holeGuard.fd, holeGuard.err = -1, errs.New(unix.EOPNOTSUPP, "emu: userfaultfd does not serve shared memory")
			return
		}
		holeGuard.fd = int(fd)
	})
	return holeGuard.fd, holeGuard.err
}

// guard makes faults on pages missing from the memory b maps fail rather
// than allocate them; a no-op where the process cannot have a userfaultfd
// (GuardReport says why).
func guard(b []byte) error {
	fd, err := guardFd()
	if err != nil || len(b) == 0 {
		return nil
	}
	reg := uffdioRegisterArg{start: uint64(uintptr(unsafe.Pointer(&b[0]))), len: uint64(len(b)), mode: uffdRegisterModeMiss}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uffdioRegister, uintptr(unsafe.Pointer(&reg))); e != 0 {
		return errs.Wrapf(e, "emu: guard the mapping of imported memory (UFFDIO_REGISTER)")
	}
	return nil
}

// GuardReport says whether pages an exporter frees after registering its
// memory fail the requests that touch them (the daemon never allocates
// them again), or why not.
func (c *Connector) GuardReport() (bool, string) {
	if _, err := guardFd(); err != nil {
		return false, "pages a client frees after registering are allocated again by the requests that touch them, in the daemon's name: " + err.Error()
	}
	return true, "pages a client frees after registering fail the requests that touch them with EFAULT (userfaultfd): the daemon never allocates them"
}

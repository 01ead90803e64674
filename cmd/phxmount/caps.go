package main

import (
	"os"
	"runtime"
	"strings"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/fusefs"
)

// The daemon serves with no capability it does not use. CAP_SYS_RESOURCE
// above all: with it, the daemon's writes for a caller (the WRITE ioctls,
// classic-path WRITEs, and passthrough writes, which run with the daemon's
// credentials of the open) would pass disk quotas and the reserved blocks
// the caller's own write(2) meets. (ext4 also lends root's reserve by
// fsuid: the daemon writes for callers with another, fusefs/writeas.go.)
// The others are administration the daemon never does.
//
// Capabilities are per thread in Linux, and a Go process has many threads
// and makes more at any time: the daemon drops the capabilities from the
// bounding set and its inheritable set on one thread and re-executes
// itself from that thread. The new process image starts with one thread
// whose permitted set is the bounding set, and every thread after it is
// made from that one. This works however the binary was built
// (syscall.AllThreadsSyscall, the other way, fails in a cgo binary).
//
// What the daemon keeps, and for what: CAP_SYS_ADMIN (the mount, fanotify,
// passthrough), CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER,
// CAP_CHOWN, CAP_FSETID, CAP_MKNOD, CAP_LINUX_IMMUTABLE (acting on backing
// files as their owner could), CAP_SETUID, CAP_SETGID (taking a caller's
// credentials), CAP_KILL (SIGXFSZ to a caller), CAP_SYS_PTRACE (/proc of
// callers; a userfaultfd that sees the kernel's own faults, connector/emu's
// guard.go), CAP_IPC_LOCK (pinned memory), CAP_SYS_RAWIO (the pcibar
// connector), CAP_NET_BIND_SERVICE (--metrics on a low port), and the rest
// a file system server may be asked to forward (security xattrs).

// unneededCaps are the capabilities the daemon gives up, by bit and name.
var unneededCaps = []struct {
	bit  int
	name string
}{
	{unix.CAP_SYS_RESOURCE, "CAP_SYS_RESOURCE"},
	{unix.CAP_SYS_MODULE, "CAP_SYS_MODULE"},
	{unix.CAP_SYS_BOOT, "CAP_SYS_BOOT"},
	{unix.CAP_SYS_TIME, "CAP_SYS_TIME"},
	{unix.CAP_SYS_PACCT, "CAP_SYS_PACCT"},
	{unix.CAP_SYS_TTY_CONFIG, "CAP_SYS_TTY_CONFIG"},
	{unix.CAP_NET_ADMIN, "CAP_NET_ADMIN"},
	{unix.CAP_NET_RAW, "CAP_NET_RAW"},
	{unix.CAP_AUDIT_CONTROL, "CAP_AUDIT_CONTROL"},
	{unix.CAP_SYSLOG, "CAP_SYSLOG"},
	{unix.CAP_WAKE_ALARM, "CAP_WAKE_ALARM"},
	{unix.CAP_BLOCK_SUSPEND, "CAP_BLOCK_SUSPEND"},
	{unix.CAP_BPF, "CAP_BPF"},
	{unix.CAP_PERFMON, "CAP_PERFMON"},
	{unix.CAP_CHECKPOINT_RESTORE, "CAP_CHECKPOINT_RESTORE"},
}

// secbitNoroot is SECBIT_NOROOT: root gains no capabilities at execve.
const secbitNoroot = 1

// reexecEnv marks the daemon re-executed without the capabilities, so that
// it never re-executes twice.
const reexecEnv = "PHXMOUNT_CAPS_DROPPED"

// giveUpCapabilities makes the daemon serve without unneededCaps: when
// this thread still holds one (in any set, or in the bounding set of a
// root process, which execve would turn into permitted), it raises
// RLIMIT_NOFILE (which needs CAP_SYS_RESOURCE beyond the hard limit),
// drops them and re-executes the daemon; it returns only where that is
// impossible, having said so. In the re-executed daemon it logs what the
// daemon serves without.
func giveUpCapabilities(log *logrus.Entry) {
	reexecuted := os.Getenv(reexecEnv) == "1"
	os.Unsetenv(reexecEnv)
	held := heldCaps()
	if len(held) == 0 {
		log.Infof("capabilities: serving without %s (mask %#x): quotas, reserved blocks and resource limits apply to the daemon's writes as to the caller's", capNames(allUnneeded()), capMask(allUnneeded()))
		return
	}
	why := cannotReexec()
	if reexecuted {
		why = "still held after re-executing without them"
	}
	if why != "" {
		log.Warnf("capabilities: keeping %s: %s; writes through the mount may pass quotas and reserved blocks", capNames(held), why)
		return
	}
	fusefs.RaiseNoFile(log)
	// The bounding set, the inheritable set and execve are all this
	// thread's: keep the goroutine on it. If the exec fails the thread is
	// left locked, and ends with the goroutine.
	runtime.LockOSThread()
	if err := dropOnThisThread(held); err != nil {
		log.Warnf("capabilities: keeping %s: %v; writes through the mount may pass quotas and reserved blocks", capNames(held), err)
		return
	}
	err := unix.Exec("/proc/self/exe", os.Args, append(os.Environ(), reexecEnv+"=1"))
	log.Warnf("capabilities: re-executing without %s: %v; serving with them: writes through the mount may pass quotas and reserved blocks", capNames(held), err)
}

// heldCaps lists the unneeded capabilities this thread holds or, as root,
// would hold after execve.
func heldCaps() []int {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return allUnneeded() // cannot tell: try to drop them all
	}
	var held []int
	for _, c := range unneededCaps {
		d, bit := data[c.bit/32], uint32(1)<<(c.bit%32)
		inSets := (d.Permitted|d.Effective|d.Inheritable)&bit != 0
		ambient, _ := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, uintptr(c.bit), 0, 0)
		bounding, _ := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c.bit), 0, 0, 0)
		if inSets || ambient == 1 || (bounding == 1 && os.Geteuid() == 0) {
			held = append(held, c.bit)
		}
	}
	return held
}

// cannotReexec says why re-executing would not give the daemon the
// capabilities it keeps ("" when it would).
func cannotReexec() string {
	if os.Geteuid() != 0 {
		return "the daemon is not root, so a re-executed daemon would not get back the capabilities it keeps"
	}
	if bits, err := unix.PrctlRetInt(unix.PR_GET_SECUREBITS, 0, 0, 0, 0); err == nil && bits&secbitNoroot != 0 {
		return "SECBIT_NOROOT is set, so a re-executed daemon would not get back the capabilities it keeps"
	}
	return ""
}

// dropOnThisThread takes caps out of this thread's bounding and
// inheritable sets (which also takes them out of the ambient set).
func dropOnThisThread(caps []int) error {
	for _, c := range caps {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return err
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	for _, c := range caps {
		data[c/32].Inheritable &^= 1 << (c % 32)
	}
	return unix.Capset(&hdr, &data[0])
}

func allUnneeded() []int {
	bits := make([]int, len(unneededCaps))
	for i, c := range unneededCaps {
		bits[i] = c.bit
	}
	return bits
}

// capMask is the capability set of bits, as /proc/PID/status prints one.
func capMask(bits []int) uint64 {
	var m uint64
	for _, b := range bits {
		m |= 1 << b
	}
	return m
}

// capNames names capabilities, comma-separated.
func capNames(bits []int) string {
	var names []string
	for _, b := range bits {
		for _, c := range unneededCaps {
			if c.bit == b {
				names = append(names, c.name)
			}
		}
	}
	return strings.Join(names, ",")
}

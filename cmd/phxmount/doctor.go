package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"phxmount/connector"
	"phxmount/connector/emu"
	"phxmount/connector/nvidia"
	"phxmount/connector/pcibar"
	"phxmount/fusefs"
	"phxmount/internal/procfs"
	"phxmount/ioengine"
	"phxmount/phxfs"
)

// doctor reports what this machine offers, without mounting anything the
// user can see (the passthrough probe mounts a throwaway overlay of an
// empty temporary directory and unmounts it).
func doctor(log *logrus.Entry, args []string) int {
	if len(args) > 0 {
		return fail(2, "doctor takes no arguments")
	}
	out := os.Stdout
	line := func(ok bool, what, detail string) {
		mark := "ok  "
		if !ok {
			mark = "no  "
		}
		fmt.Fprintf(out, "%s %-22s %s\n", mark, what, detail)
	}
	note := func(what, detail string) { fmt.Fprintf(out, "->   %-22s %s\n", what, detail) }

	// FUSE.
	fuseOK := false
	if st, err := os.Stat("/dev/fuse"); err != nil {
		line(false, "/dev/fuse", err.Error())
	} else if st.Mode()&os.ModeCharDevice == 0 {
		line(false, "/dev/fuse", "not a character device")
	} else if fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
		line(false, "/dev/fuse", "cannot open: "+err.Error())
	} else {
		unix.Close(fd)
		fuseOK = true
		line(true, "/dev/fuse", "present and openable")
	}

	// Passthrough.
	rel := kernelRelease()
	maj, min := kernelVersion(rel)
	kernelOK := maj > 6 || (maj == 6 && min >= 9)
	capOK := hasCapSysAdmin()
	line(kernelOK, "kernel", fmt.Sprintf("%s (FUSE passthrough needs >= 6.9)", rel))
	line(capOK, "CAP_SYS_ADMIN", map[bool]string{true: "held (needed to register passthrough files)", false: "missing: passthrough and direct mounts need it"}[capOK])
	switch {
	case !fuseOK:
		line(false, "FUSE passthrough", "no /dev/fuse to probe with")
	case !capOK:
		line(false, "FUSE passthrough", "not without CAP_SYS_ADMIN")
	default:
		ok, why := probeMount(log)
		line(ok, "FUSE passthrough", why)
	}

	// io_uring.
	if e, err := ioengine.New(ioengine.KindIOUring, 8); err != nil {
		line(false, "io_uring", err.Error()+" (the sync engine will be used)")
	} else {
		e.Close()
		line(true, "io_uring", "a ring can be created (engine io_uring)")
	}

	cs := phxfs.CachestatSupported()
	line(cs, "cachestat", map[bool]string{true: "the staged transport reads cold ranges with O_DIRECT, cached ones from the page cache",
		false: "missing (Linux >= 6.5): every staged read goes through the page cache"}[cs])

	// Settings from the environment: a bad one stops the mount.
	envErr := phxfs.CheckEnv()
	if _, err := nvidia.ParseSyncMode(os.Getenv(nvidia.EnvSync)); err != nil && envErr == nil {
		envErr = err
	}
	if envErr != nil {
		line(false, "environment", envErr.Error())
	} else {
		line(true, "environment", "PHX_ENGINE, PHX_STAGED_BUFFERS, PHX_DIRECT_IO, PHX_CUDA_SYNC valid or unset")
	}

	// Kernel module.
	devs, _ := filepath.Glob("/dev/phxfs_dev*")
	_, modErr := os.Stat("/sys/module/phxfs")
	switch {
	case modErr == nil && len(devs) > 0:
		line(true, "phxfs kernel module", "loaded; devices "+strings.Join(devs, " "))
	case modErr == nil:
		line(false, "phxfs kernel module", "loaded but no /dev/phxfs_dev* device")
	case len(devs) > 0:
		line(true, "phxfs kernel module", "devices "+strings.Join(devs, " "))
	default:
		line(false, "phxfs kernel module", "not loaded (no /dev/phxfs_dev*)")
	}

	// libcuda and its GPUs.
	gpus := 0
	if c, err := nvidia.Open(); err != nil {
		line(false, "libcuda", err.Error())
	} else {
		ds, _ := c.Devices()
		gpus = len(ds)
		var names []string
		for _, d := range ds {
			names = append(names, fmt.Sprintf("%d: %s (%s, %d MiB)", d.Index, d.Name, d.PCIAddress, d.MemoryBytes>>20))
		}
		c.Close()
		line(true, "libcuda", fmt.Sprintf("%d GPU(s): %s", gpus, strings.Join(names, "; ")))
	}

	// Transport a registration would get: the vendor --vendor auto picks,
	// and the VM's BAR stand-in where the module's emu backend is loaded.
	var conns []connector.Connector
	if gpus > 0 {
		if c, err := nvidia.Open(); err == nil {
			conns = append(conns, c)
		}
	} else if c, err := emu.New(emu.Config{}); err == nil {
		conns = append(conns, c)
	}
	if len(devs) > 0 {
		if c, err := pcibar.New(pcibar.Config{}); err == nil {
			conns = append(conns, c)
		}
	}
	for _, c := range conns {
		t, why := phxfs.TransportFor(c, 0)
		note("transport", fmt.Sprintf("%s (--vendor %s): %s", t, c.Vendor(), why))
		c.Close()
	}
	return 0
}

// probeMount mounts a throwaway overlay and asks it whether passthrough
// took.
func probeMount(log *logrus.Entry) (bool, string) {
	dir, err := os.MkdirTemp("", "phxmount-doctor-")
	if err != nil {
		return false, "probe: " + err.Error()
	}
	defer os.RemoveAll(dir)
	backing, mnt := filepath.Join(dir, "backing"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(backing, 0700); err != nil {
		return false, "probe: " + err.Error()
	}
	if err := os.Mkdir(mnt, 0700); err != nil {
		return false, "probe: " + err.Error()
	}
	fsys, err := fusefs.Mount(backing, mnt, fusefs.Options{Log: log})
	if err != nil {
		return false, "probe mount failed: " + err.Error()
	}
	ok, why := fsys.PassthroughActive()
	fsys.Unmount()
	fsys.Wait()
	return ok, why + " (probed by a throwaway mount)"
}

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "unknown"
	}
	return string(bytes.TrimRight(u.Release[:], "\x00"))
}

func kernelVersion(rel string) (int, int) {
	parts := strings.SplitN(rel, ".", 3)
	if len(parts) < 2 {
		return 0, 0
	}
	maj, _ := strconv.Atoi(parts[0])
	minStr := parts[1]
	for i, r := range minStr {
		if r < '0' || r > '9' {
			minStr = minStr[:i]
			break
		}
	}
	min, _ := strconv.Atoi(minStr)
	return maj, min
}

// hasCapSysAdmin reads the effective capability set from /proc.
func hasCapSysAdmin() bool {
	st, err := procfs.ReadStatus(os.Getpid())
	if err != nil {
		return os.Geteuid() == 0
	}
	return st.CapEff&(1<<unix.CAP_SYS_ADMIN) != 0
}

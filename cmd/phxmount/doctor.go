package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/emu"
	"github.com/phxmount/phxmount/connector/nvidia"
	"github.com/phxmount/phxmount/connector/pcibar"
	"github.com/phxmount/phxmount/fusefs"
	"github.com/phxmount/phxmount/internal/procfs"
	"github.com/phxmount/phxmount/ioengine"
	"github.com/phxmount/phxmount/phxfs"
)

// finding is one line of doctor's report: a check that passed or not, or
// a note (the transport a registration would get). Required: the path the
// user asked for needs it, so doctor fails when it did not pass.
type finding struct {
	What     string `json:"what"`
	OK       bool   `json:"ok"`
	Required bool   `json:"required"`
	Note     bool   `json:"note"`
	Detail   string `json:"detail"`
}

func (f finding) String() string {
	mark := "ok  "
	switch {
	case f.Note:
		mark = "->  "
	case !f.OK && f.Required:
		mark = "FAIL"
	case !f.OK:
		mark = "no  "
	}
	return fmt.Sprintf("%s %-22s %s", mark, f.What, f.Detail)
}

// doctorReport is doctor --json's output.
type doctorReport struct {
	OK       bool              `json:"ok"`      // the path asked for can work here
	Asked    map[string]string `json:"asked"`   // vendor, passthrough, engine, cache
	Missing  []string          `json:"missing"` // the required findings that did not pass
	Findings []finding         `json:"findings"`
}

// doctor reports what this machine offers, without mounting anything the
// user can see (the passthrough probe mounts a throwaway overlay of an
// empty temporary directory and unmounts it). It exits 1 when the path
// asked for (--vendor, --passthrough, --engine; a mount at all) cannot
// work here, 2 on a bad command line.
func doctor(log *logrus.Entry, args []string) int {
	o, err := doctorArgs(args)
	if err != nil {
		return fail(2, "%v", err)
	}
	all := doctorFindings(log, o)
	r := doctorReport{OK: true, Findings: all, Missing: []string{}, Asked: map[string]string{
		"vendor": o.c.vendor, "passthrough": passthroughName(o.c.fs.Passthrough), "engine": o.c.engine, "cache": o.mode.String()}}
	for _, f := range all {
		if f.Required && !f.OK {
			r.OK = false
			r.Missing = append(r.Missing, f.What)
		}
	}
	if o.json {
		enc := json.NewEncoder(os.Stdout)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		enc.Encode(r)
	} else {
		for _, f := range all {
			fmt.Println(f)
		}
		if !r.OK {
			fmt.Printf("=> the path asked for (%s) cannot work here: %s\n", askedLine(r.Asked), strings.Join(r.Missing, ", "))
		}
	}
	if !r.OK {
		return 1
	}
	return 0
}

// doctorFindings runs every check; each is required where the path asked
// for needs it.
func doctorFindings(log *logrus.Entry, o doctorOpts) []finding {
	fuse := checkFuse()
	fuse.Required = true
	all := append([]finding{fuse}, userFindings()...)
	pt := checkPassthrough(log, fuse.OK)
	pt[len(pt)-1].Required = o.c.fs.Passthrough == fusefs.PassthroughOn
	all = append(all, pt...)
	all = append(all, checkCache(o.mode, o.dir)...)
	uring, env := checkIOUring(), checkEnvironment()
	uring.Required, env.Required = o.c.engine == "io_uring", true
	all = append(all, uring, checkCachestat(), env)
	if wake, ok := checkFuseWake(fuseWakeParam); ok {
		all = append(all, wake)
	}
	mod, modOK := checkModule()
	mod.Required = o.c.vendor == "pcibar"
	cuda, gpus := checkCUDA()
	cuda.Required = o.c.vendor == "nvidia"
	all = append(all, mod, cuda)
	return append(all, transportNotes(o.c.vendor, gpus, modOK)...)
}

func passthroughName(m fusefs.PassthroughMode) string {
	switch m {
	case fusefs.PassthroughOn:
		return "on"
	case fusefs.PassthroughOff:
		return "off"
	}
	return "auto"
}

func askedLine(a map[string]string) string {
	return fmt.Sprintf("--vendor %s --passthrough %s --engine %s", a["vendor"], a["passthrough"], a["engine"])
}

func checkFuse() finding {
	f := finding{What: "/dev/fuse"}
	st, err := os.Stat("/dev/fuse")
	switch {
	case err != nil:
		f.Detail = err.Error()
	case st.Mode()&os.ModeCharDevice == 0:
		f.Detail = "not a character device"
	default:
		fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			f.Detail = "cannot open: " + err.Error()
			break
		}
		unix.Close(fd)
		f.OK, f.Detail = true, "present and openable"
	}
	return f
}

// checkPassthrough: the kernel, the capability, and a probe mount.
func checkPassthrough(log *logrus.Entry, fuseOK bool) []finding {
	rel := kernelRelease()
	maj, min := kernelVersion(rel)
	kernelOK := maj > 6 || (maj == 6 && min >= 9)
	capOK := hasCapSysAdmin()
	out := []finding{
		{What: "kernel", OK: kernelOK, Detail: fmt.Sprintf("%s (FUSE passthrough needs >= 6.9)", rel)},
		{What: "CAP_SYS_ADMIN", OK: capOK, Detail: map[bool]string{true: "held (needed to register passthrough files)", false: "missing: passthrough and direct mounts need it"}[capOK]},
	}
	pt := finding{What: "FUSE passthrough"}
	switch {
	case !fuseOK:
		pt.Detail = "no /dev/fuse to probe with"
	case !capOK:
		pt.Detail = "not without CAP_SYS_ADMIN"
	default:
		pt.OK, pt.Detail = probeMount(log)
	}
	return append(out, pt)
}

func checkIOUring() finding {
	e, err := ioengine.New(ioengine.KindIOUring, 8)
	if err != nil {
		return finding{What: "io_uring", Detail: err.Error() + " (the sync engine will be used)"}
	}
	e.Close()
	return finding{What: "io_uring", OK: true, Detail: "a ring can be created (engine io_uring)"}
}

func checkCachestat() finding {
	cs := phxfs.CachestatSupported()
	return finding{What: "cachestat", OK: cs, Detail: map[bool]string{true: "the staged transport reads cold ranges with O_DIRECT, cached ones from the page cache",
		false: "missing (Linux >= 6.5): every staged read goes through the page cache"}[cs]}
}

// checkEnvironment: a bad tuning variable stops the mount.
func checkEnvironment() finding {
	err := phxfs.CheckEnv()
	if serr := nvidia.CheckEnv(); serr != nil && err == nil {
		err = serr
	}
	if err != nil {
		return finding{What: "environment", Detail: err.Error()}
	}
	return finding{What: "environment", OK: true, Detail: "PHX_ENGINE, PHX_STAGED_BUFFERS, PHX_DIRECT_IO, PHX_GATHER, PHX_WRITEBACK, PHX_STAGED_SHARE, PHX_CUDA_SYNC, PHX_SCATTER valid or unset"}
}

// checkModule reports the phxfs kernel module; ok: its devices exist.
func checkModule() (finding, bool) {
	devs, _ := filepath.Glob("/dev/phxfs_dev*")
	_, modErr := os.Stat("/sys/module/phxfs")
	f := finding{What: "phxfs kernel module", OK: len(devs) > 0}
	switch {
	case modErr == nil && len(devs) > 0:
		f.Detail = "loaded; devices " + strings.Join(devs, " ")
	case modErr == nil:
		f.Detail = "loaded but no /dev/phxfs_dev* device"
	case len(devs) > 0:
		f.Detail = "devices " + strings.Join(devs, " ")
	default:
		f.Detail = "not loaded (no /dev/phxfs_dev*)"
	}
	return f, f.OK
}

// checkCUDA reports libcuda and its GPUs; it passes with one GPU or more.
func checkCUDA() (finding, int) {
	c, err := nvidia.Open()
	if err != nil {
		return finding{What: "libcuda", Detail: err.Error()}, 0
	}
	defer c.Close()
	ds, _ := c.Devices()
	var names []string
	for _, d := range ds {
		names = append(names, fmt.Sprintf("%d: %s (%s, %d MiB)", d.Index, d.Name, d.PCIAddress, d.MemoryBytes>>20))
	}
	return finding{What: "libcuda", OK: len(ds) > 0, Detail: fmt.Sprintf("%d GPU(s): %s", len(ds), strings.Join(names, "; "))}, len(ds)
}

// transportNotes: the transport a registration would get for the vendor
// asked for (auto: NVIDIA when there is a GPU, else the emulated device),
// and the VM's BAR stand-in where the module is.
func transportNotes(vendor string, gpus int, module bool) []finding {
	var conns []connector.Connector
	switch {
	case (vendor == "auto" || vendor == "nvidia") && gpus > 0:
		if c, err := nvidia.Open(); err == nil {
			conns = append(conns, c)
		}
	case vendor == "auto" || vendor == "emu":
		if c, err := emu.New(emu.Config{}); err == nil {
			conns = append(conns, c)
		}
	}
	if module && (vendor == "auto" || vendor == "pcibar") {
		if c, err := pcibar.New(pcibar.Config{}); err == nil {
			conns = append(conns, c)
		}
	}
	var out []finding
	for _, c := range conns {
		t, why := phxfs.TransportFor(c, 0)
		out = append(out, finding{What: "transport", Note: true, Detail: fmt.Sprintf("%s (--vendor %s): %s", t, c.Vendor(), why)})
		c.Close()
	}
	return out
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

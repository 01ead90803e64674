package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"phxmount/fusefs"
)

// config is everything the command line says.
type config struct {
	backing, mountpoint string

	fs       fusefs.Options
	vendor   string // auto, nvidia, emu, pcibar
	engine   string // auto, io_uring, sync
	workers  int
	logLevel logrus.Level

	// The emulated device (--vendor emu, or auto without a GPU):
	// emuStaged makes its memory non-host-addressable (the staged
	// transport); emuDevices is its number of devices (0: default). The
	// environment variables PHXMOUNT_EMU_STAGED=1 and PHXMOUNT_EMU_DEVICES=N
	// still work; a flag wins over its variable.
	emuStaged  bool
	emuDevices int

	// The control's limits on registrations (0: the defaults).
	limits struct {
		perProcess, buffers int
		bytes               int64
	}
}

const usage = `usage: phxmount [options] BACKING MOUNTPOINT
       phxmount doctor
       phxmount wait [--timeout SECONDS] MOUNTPOINT

Mounts an overlay of the directory BACKING on MOUNTPOINT and serves it in
the foreground until SIGINT or SIGTERM (or an unmount). "wait" returns
once MOUNTPOINT is a phxmount mount that serves requests (exit 1 when it
is not by the timeout, default 30 s): start phxmount in the background,
then wait for it.

  -o OPT[,OPT...]       FUSE mount options:
                          ro, rw, allow_other, default_permissions (on by
                          default), nodefault_permissions (dangerous: a root
                          daemon then checks nothing), entry_timeout=S,
                          attr_timeout=S, negative_timeout=S (seconds; default
                          1, 1, 0), max_write=N, max_readahead=N,
                          max_background=N, fsname=NAME, dev, nodev, suid,
                          nosuid, exec, noexec, atime, noatime, debug;
                        registration limits: max_buffers_per_process=N
                          (4096), max_buffers=N (65536, the mount),
                          max_registered_bytes=N[KMGT] (16T, the mount)
  --passthrough MODE    auto (default), on (fail if unavailable), off
  --vendor V            auto (default), nvidia, emu, pcibar
  --engine E            auto (default), io_uring, sync
  --workers N           I/O workers of the GPU data path (0: default)
  --emu-staged          the emulated device's memory is not host-addressable
                        (the staged transport; env PHXMOUNT_EMU_STAGED=1)
  --emu-devices N       number of emulated devices (env PHXMOUNT_EMU_DEVICES)
  --log-level L         panic, fatal, error, warn, info (default), debug, trace
  -f                    foreground (always; accepted for compatibility)
  -d                    -o debug
`

// usageError is a bad command line: one line, exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func badf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

func parseArgs(args []string) (*config, error) {
	c := &config{vendor: "auto", engine: "auto", logLevel: logrus.InfoLevel}
	var pos []string
	value := func(i *int, name string, inline string, hasInline bool) (string, error) {
		if hasInline {
			return inline, nil
		}
		if *i+1 >= len(args) {
			return "", badf("option %s needs a value", name)
		}
		*i++
		return args[*i], nil
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		name, inline, hasInline := strings.Cut(a, "=")
		if strings.HasPrefix(a, "-o") && a != "-o" && !strings.HasPrefix(a, "--") {
			name, inline, hasInline = "-o", a[2:], true
		}
		switch name {
		case "-h", "--help", "-help":
			return nil, &usageError{msg: "help"}
		case "-f", "--foreground":
		case "-d", "--debug":
			c.fs.Debug = true
		case "-o":
			v, err := value(&i, name, inline, hasInline)
			if err != nil {
				return nil, err
			}
			if err := c.mountOptions(v); err != nil {
				return nil, err
			}
		case "--passthrough":
			v, err := value(&i, name, inline, hasInline)
			if err != nil {
				return nil, err
			}
			switch v {
			case "auto":
				c.fs.Passthrough = fusefs.PassthroughAuto
			case "on":
				c.fs.Passthrough = fusefs.PassthroughOn
			case "off":
				c.fs.Passthrough = fusefs.PassthroughOff
			default:
				return nil, badf("--passthrough %q: want auto, on or off", v)
			}
		case "--vendor":
			v, err := value(&i, name, inline, hasInline)
			if err != nil {
				return nil, err
			}
			switch v {
			case "auto", "nvidia", "emu", "pcibar":
				c.vendor = v
			default:
				return nil, badf("--vendor %q: want auto, nvidia, emu or pcibar", v)
			}
		case "--engine":
			v, err := value(&i, name, inline, hasInline)
			if err != nil {
				return nil, err
			}
			switch v {
			case "auto", "io_uring", "sync":
				c.engine = v
			default:
				return nil, badf("--engine %q: want auto, io_uring or sync", v)
			}
		case "--workers":
			v, err := value(&i, name, inline, hasInline)
			if err != nil {
				return nil, err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > 4096 {
				return nil, badf("--workers %q: want a number from 0 to 4096", v)
			}
			c.workers = n
		case "--emu-staged":
			if hasInline {
				b, err := strconv.ParseBool(inline)
				if err != nil {
					return nil, badf("--emu-staged=%q: want true or false", inline)
				}
				c.emuStaged = b
			} else {
				c.emuStaged = true
			}
		case "--emu-devices":
			v, err := value(&i, name, inline, hasInline)
			if err != nil {
				return nil, err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 64 {
				return nil, badf("--emu-devices %q: want a number from 1 to 64", v)
			}
			c.emuDevices = n
		case "--log-level":
			v, err := value(&i, name, inline, hasInline)
			if err != nil {
				return nil, err
			}
			l, err := logrus.ParseLevel(v)
			if err != nil {
				return nil, badf("--log-level %q: want panic, fatal, error, warn, info, debug or trace", v)
			}
			c.logLevel = l
		default:
			return nil, badf("unknown option %s (see phxmount --help)", name)
		}
	}
	switch len(pos) {
	case 2:
		c.backing, c.mountpoint = pos[0], pos[1]
	case 0, 1:
		return nil, badf("need BACKING and MOUNTPOINT (see phxmount --help)")
	default:
		return nil, badf("too many arguments: %s", strings.Join(pos[2:], " "))
	}
	return c, nil
}

func seconds(name, v string) (time.Duration, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || f > 1e6 {
		return 0, badf("-o %s=%s: want seconds (a number >= 0)", name, v)
	}
	if f == 0 {
		return -1, nil // disabled (Options: negative means 0)
	}
	return time.Duration(f * float64(time.Second)), nil
}

func (c *config) mountOptions(list string) error {
	for _, o := range strings.Split(list, ",") {
		if o == "" {
			continue
		}
		k, v, hasV := strings.Cut(o, "=")
		flag := func() error {
			if hasV {
				return badf("-o %s takes no value", k)
			}
			return nil
		}
		num := func() (int, error) {
			n, err := strconv.Atoi(v)
			if !hasV || err != nil || n < 0 {
				return 0, badf("-o %s: want %s=N", o, k)
			}
			return n, nil
		}
		var err error
		switch k {
		case "ro":
			c.fs.ReadOnly = true
			err = flag()
		case "rw":
			c.fs.ReadOnly = false
			err = flag()
		case "allow_other":
			c.fs.AllowOther = true
			err = flag()
		case "default_permissions":
			c.fs.NoDefaultPermissions = false
			err = flag()
		case "nodefault_permissions":
			c.fs.NoDefaultPermissions = true
			err = flag()
		case "debug":
			c.fs.Debug = true
			err = flag()
		case "entry_timeout", "attr_timeout", "negative_timeout":
			if !hasV {
				return badf("-o %s: want %s=SECONDS", o, k)
			}
			d, e := seconds(k, v)
			if e != nil {
				return e
			}
			switch k {
			case "entry_timeout":
				c.fs.EntryTimeout = d
			case "attr_timeout":
				c.fs.AttrTimeout = d
			default:
				c.fs.NegativeTimeout = d
			}
		case "max_write":
			c.fs.MaxWrite, err = num()
		case "max_readahead":
			c.fs.MaxReadAhead, err = num()
		case "max_background":
			c.fs.MaxBackground, err = num()
			if err == nil && c.fs.MaxBackground > 65535 {
				err = badf("-o %s: at most 65535", o)
			}
		case "max_buffers_per_process":
			c.limits.perProcess, err = num()
		case "max_buffers":
			c.limits.buffers, err = num()
		case "max_registered_bytes":
			c.limits.bytes, err = byteSize(o, v)
		case "fsname":
			if !hasV || v == "" || strings.ContainsAny(v, ", ") {
				return badf("-o %s: want fsname=NAME", o)
			}
			c.fs.FsName = v
		case "dev", "nodev", "suid", "nosuid", "exec", "noexec":
			c.fs.ExtraMountOptions = append(c.fs.ExtraMountOptions, k)
			err = flag()
		case "atime", "noatime":
			// The backing file system keeps the times.
			err = flag()
		default:
			return badf("unknown mount option -o %s", o)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// byteSize parses a byte count with an optional binary suffix (K, M, G, T).
func byteSize(opt, v string) (int64, error) {
	shift := 0
	if n := len(v); n > 0 {
		if i := strings.IndexByte("KMGT", v[n-1]&^0x20); i >= 0 {
			shift, v = 10*(i+1), v[:n-1]
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)>>shift {
		return 0, badf("-o %s: want a positive number of bytes, optionally with K, M, G or T", opt)
	}
	return n << shift, nil
}

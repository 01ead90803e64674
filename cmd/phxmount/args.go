package main

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/fusefs"
	"github.com/phxmount/phxmount/internal/mounthelper"
)

// config is everything the command line says.
type config struct {
	backing, mountpoint string

	fs       fusefs.Options
	vendor   string // auto, nvidia, emu, pcibar
	engine   string // auto, io_uring, sync
	workers  int
	logLevel logrus.Level

	logFormat string // text (default) or json
	logFile   string // "": stderr; reopened at SIGHUP
	metrics   string // --metrics ADDR: serve Prometheus text there ("": off)

	// The emulated device (--vendor emu, or auto without a GPU):
	// emuStaged makes its memory non-host-addressable (the staged
	// transport); emuDevices is its number of devices (0: default). The
	// environment variables PHXMOUNT_EMU_STAGED=1 and PHXMOUNT_EMU_DEVICES=N
	// still work; a flag wins over its variable.
	emuStaged  bool
	emuDevices int

	// The control's limits on registrations (0: the defaults).
	limits struct {
		perProcess, perUser, buffers int
		userBytes, bytes             int64
		userPieces, pieces           int
	}
}

const usage = `usage: phxmount [options] BACKING MOUNTPOINT
       phxmount doctor [--vendor V] [--passthrough MODE] [--engine E] [-o cache=MODE] [--json] [BACKING]
       phxmount wait [--timeout SECONDS] MOUNTPOINT
       phxmount --version
       mount -t fuse.phxmount BACKING MOUNTPOINT [-o OPTIONS]   (/sbin/mount.fuse.phxmount)

Mounts an overlay of the directory BACKING on MOUNTPOINT and serves it in
the foreground until SIGINT or SIGTERM (or an unmount); SIGHUP reopens
--log-file. Under systemd (Type=notify) it reports READY=1 once it serves.
"doctor" reports what this machine offers, and how a mount of BACKING would
cache; it exits 1 when the path asked for (--vendor, --passthrough,
--engine) cannot work here. "wait" returns once MOUNTPOINT is a phxmount
mount that serves requests (exit 1 when it is not by the timeout, default
30 s): start phxmount in the background, then wait for it.

  -o OPT[,OPT...]       FUSE mount options:
                          ro, rw, allow_other, default_permissions (on by
                          default), nodefault_permissions (dangerous: the
                          kernel then checks nothing, so a path's search
                          permission goes unchecked; opens and changes still
                          run as the caller; no ACLs in the kernel),
                          cache=auto|exclusive|off (default auto: local file
                          systems watched with fanotify and cached long,
                          network ones revalidated with 1 s timeouts;
                          exclusive: only this mount changes BACKING, cached
                          longest; off: 1 s timeouts, nothing kept),
                          entry_timeout=S, attr_timeout=S, negative_timeout=S
                          (seconds; override the cache mode's on every file
                          system), max_write=N, max_readahead=N (bytes of
                          readahead, default 4 MiB),
                          max_background=N, fsname=NAME, dev, nodev, suid,
                          nosuid, exec, noexec, atime, noatime, debug;
                        registration limits: max_buffers_per_process=N
                          (%d), max_buffers_per_user=N (%d, one uid but
                          root), max_buffers=N (%d, the mount),
                          max_registered_bytes_per_user=N[KMGT] (%dT),
                          max_registered_bytes=N[KMGT] (%dT, the mount),
                          max_pieces_in_flight_per_user=N (%d, pieces of one
                          uid's batches served at once; more wait),
                          max_pieces_in_flight=N (%d, everyone's)
  --passthrough MODE    auto (default), on (fail if unavailable), off
  --vendor V            auto (default), nvidia, emu, pcibar
  --engine E            auto (default), io_uring, sync
  --workers N           I/O workers of the GPU data path (0: default)
  --emu-staged          the emulated device's memory is not host-addressable
                        (the staged transport; env PHXMOUNT_EMU_STAGED=1)
  --emu-devices N       number of emulated devices (env PHXMOUNT_EMU_DEVICES)
  --log-level L         panic, fatal, error, warn, info (default), debug, trace
  --log-format F        text (default) or json
  --log-file PATH       append the log to PATH (default stderr); SIGHUP reopens it
  --metrics ADDR        serve Prometheus metrics at http://ADDR/metrics
                        (HOST:PORT; :PORT listens on 127.0.0.1 only, other
                        interfaces need a host, e.g. 0.0.0.0:9464; no
                        authentication; off by default)
  --version             the version, commit and build, then exit
  -f                    foreground (always; accepted for compatibility)
  -d                    -o debug

Every option above is also a mount option, for mount(8) and /etc/fstab:
-o vendor=emu,metrics=127.0.0.1:9464,log_file=/var/log/phxmount.log,emu_staged
(the name without "--", "_" for "-"). The options of mount(8), systemd and
fstab are accepted and consumed, not passed to FUSE:
`

// usageText is usage with the mount(8) options it accepts.
func usageText() string {
	var names []string
	for _, o := range mounthelper.MountLevelOptions {
		n := o.Name
		switch {
		case strings.HasSuffix(n, "="):
			n += "…"
		case strings.HasSuffix(n, "-"):
			n += "*"
		}
		names = append(names, n)
	}
	// The registration limits' defaults are client's (one table).
	u := fmt.Sprintf(usage, client.DefaultMaxBuffersPerProcess, client.DefaultMaxBuffersPerUser, client.DefaultMaxBuffers,
		client.DefaultMaxRegisteredBytesPerUser>>40, client.DefaultMaxRegisteredBytes>>40,
		client.DefaultMaxPiecesInFlightPerUser, client.DefaultMaxPiecesInFlight)
	return u + "  " + strings.Join(names, ", ") + "\n"
}

// usageError is a bad command line: one line, exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func badf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// flagOpt is a command-line option: a switch (set gets "" or the inline
// "=value" of --flag=value) or one that takes a value.
type flagOpt struct {
	names     []string
	takeValue bool
	set       func(c *config, v string) error
}

// flagTable is the command line's options, defined once.
var flagTable = []flagOpt{
	{[]string{"-f", "--foreground"}, false, func(*config, string) error { return nil }},
	{[]string{"-d", "--debug"}, false, func(c *config, _ string) error { c.fs.Debug = true; return nil }},
	{[]string{"-o"}, true, (*config).mountOptions},
	{[]string{"--passthrough"}, true, func(c *config, v string) error {
		m, ok := map[string]fusefs.PassthroughMode{"auto": fusefs.PassthroughAuto, "on": fusefs.PassthroughOn, "off": fusefs.PassthroughOff}[v]
		if !ok {
			return badf("--passthrough %q: want auto, on or off", v)
		}
		c.fs.Passthrough = m
		return nil
	}},
	{[]string{"--vendor"}, true, oneOf("--vendor", func(c *config) *string { return &c.vendor }, "auto", "nvidia", "emu", "pcibar")},
	{[]string{"--engine"}, true, oneOf("--engine", func(c *config) *string { return &c.engine }, "auto", "io_uring", "sync")},
	{[]string{"--workers"}, true, func(c *config, v string) (err error) {
		c.workers, err = intIn("--workers", v, 0, 4096)
		return err
	}},
	{[]string{"--emu-staged"}, false, func(c *config, v string) error {
		if v == "" {
			c.emuStaged = true
			return nil
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return badf("--emu-staged=%q: want true or false", v)
		}
		c.emuStaged = b
		return nil
	}},
	{[]string{"--emu-devices"}, true, func(c *config, v string) (err error) {
		c.emuDevices, err = intIn("--emu-devices", v, 1, 64)
		return err
	}},
	{[]string{"--log-format"}, true, oneOf("--log-format", func(c *config) *string { return &c.logFormat }, "text", "json")},
	{[]string{"--log-file"}, true, func(c *config, v string) error {
		if v == "" {
			return badf("--log-file: want a path")
		}
		c.logFile = v
		return nil
	}},
	{[]string{"--metrics"}, true, func(c *config, v string) error {
		if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
			return badf("--metrics %q: want HOST:PORT (127.0.0.1:9464, :9464)", v)
		}
		c.metrics = v
		return nil
	}},
	{[]string{"--log-level"}, true, func(c *config, v string) error {
		l, err := logrus.ParseLevel(v)
		if err != nil {
			return badf("--log-level %q: want panic, fatal, error, warn, info, debug or trace", v)
		}
		c.logLevel = l
		return nil
	}},
}

// oneOf sets a string option to one of the allowed values.
func oneOf(name string, field func(*config) *string, allowed ...string) func(*config, string) error {
	return func(c *config, v string) error {
		if !slices.Contains(allowed, v) {
			return badf("%s %q: want %s", name, v, strings.Join(allowed, ", "))
		}
		*field(c) = v
		return nil
	}
}

// intIn parses a number from lo to hi.
func intIn(name, v string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, badf("%s %q: want a number from %d to %d", name, v, lo, hi)
	}
	return n, nil
}

func lookupFlag(name string) (flagOpt, bool) {
	for _, f := range flagTable {
		if slices.Contains(f.names, name) {
			return f, true
		}
	}
	return flagOpt{}, false
}

func parseArgs(args []string) (*config, error) {
	c := &config{vendor: "auto", engine: "auto", logLevel: logrus.InfoLevel, logFormat: "text"}
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			pos = append(pos, args[i+1:]...)
			i = len(args)
			continue
		case !strings.HasPrefix(a, "-") || a == "-":
			pos = append(pos, a)
			continue
		case a == "-h" || a == "--help" || a == "-help":
			return nil, &usageError{msg: "help"}
		case a == "--version":
			return nil, &usageError{msg: "version"}
		}
		name, inline, hasInline := strings.Cut(a, "=")
		if strings.HasPrefix(a, "-o") && a != "-o" && !strings.HasPrefix(a, "--") {
			name, inline, hasInline = "-o", a[2:], true // -oro,allow_other
		}
		f, ok := lookupFlag(name)
		if !ok {
			return nil, badf("unknown option %s (see phxmount --help)", name)
		}
		if f.takeValue && !hasInline {
			if i+1 >= len(args) {
				return nil, badf("option %s needs a value", name)
			}
			i++
			inline = args[i]
		}
		if err := f.set(c, inline); err != nil {
			return nil, err
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

// mountOpt is one -o option: what it sets from its value ("" for a flag).
type mountOpt struct {
	takeValue bool
	set       func(c *config, opt, v string) error
}

// mountTable is the -o options, defined once.
var mountTable = map[string]mountOpt{
	"ro":                            {false, func(c *config, _, _ string) error { c.fs.ReadOnly = true; return nil }},
	"rw":                            {false, func(c *config, _, _ string) error { c.fs.ReadOnly = false; return nil }},
	"allow_other":                   {false, func(c *config, _, _ string) error { c.fs.AllowOther = true; return nil }},
	"default_permissions":           {false, func(c *config, _, _ string) error { c.fs.NoDefaultPermissions = false; return nil }},
	"nodefault_permissions":         {false, func(c *config, _, _ string) error { c.fs.NoDefaultPermissions = true; return nil }},
	"debug":                         {false, func(c *config, _, _ string) error { c.fs.Debug = true; return nil }},
	"entry_timeout":                 {true, timeoutOpt(func(c *config) *time.Duration { return &c.fs.EntryTimeout })},
	"attr_timeout":                  {true, timeoutOpt(func(c *config) *time.Duration { return &c.fs.AttrTimeout })},
	"negative_timeout":              {true, timeoutOpt(func(c *config) *time.Duration { return &c.fs.NegativeTimeout })},
	"max_write":                     {true, numOpt(func(c *config) *int { return &c.fs.MaxWrite }, 1<<62)},
	"max_readahead":                 {true, numOpt(func(c *config) *int { return &c.fs.MaxReadAhead }, 1<<62)},
	"max_background":                {true, numOpt(func(c *config) *int { return &c.fs.MaxBackground }, 65535)},
	"max_buffers_per_process":       {true, numOpt(func(c *config) *int { return &c.limits.perProcess }, 1<<31)},
	"max_buffers_per_user":          {true, numOpt(func(c *config) *int { return &c.limits.perUser }, 1<<31)},
	"max_buffers":                   {true, numOpt(func(c *config) *int { return &c.limits.buffers }, 1<<31)},
	"max_pieces_in_flight_per_user": {true, numOpt(func(c *config) *int { return &c.limits.userPieces }, 1<<40)},
	"max_pieces_in_flight":          {true, numOpt(func(c *config) *int { return &c.limits.pieces }, 1<<40)},
	"max_registered_bytes_per_user": {true, func(c *config, opt, v string) (err error) {
		c.limits.userBytes, err = byteSize(opt, v)
		return err
	}},
	"max_registered_bytes": {true, func(c *config, opt, v string) (err error) {
		c.limits.bytes, err = byteSize(opt, v)
		return err
	}},
	"cache": {true, func(c *config, opt, v string) error {
		m, ok := fusefs.ParseCacheMode(v)
		if !ok {
			return badf("-o %s: want cache=auto, cache=exclusive or cache=off", opt)
		}
		c.fs.Cache = m
		return nil
	}},
	"fsname": {true, func(c *config, opt, v string) error {
		if v == "" || strings.ContainsAny(v, ", ") {
			return badf("-o %s: want fsname=NAME", opt)
		}
		c.fs.FsName = v
		return nil
	}},
	// The backing file system keeps the times: atime and noatime change
	// nothing here.
	"atime":   {false, func(*config, string, string) error { return nil }},
	"noatime": {false, func(*config, string, string) error { return nil }},
}

func init() {
	for _, k := range []string{"dev", "nodev", "suid", "nosuid", "exec", "noexec"} {
		mountTable[k] = mountOpt{false, func(c *config, _, _ string) error {
			c.fs.ExtraMountOptions = append(c.fs.ExtraMountOptions, k)
			return nil
		}}
	}
	// Every --long option is a mount option too ("--log-file" is
	// log_file=), so an fstab line can say everything the command line can.
	for _, f := range flagTable {
		for _, n := range f.names {
			k, ok := strings.CutPrefix(n, "--")
			k = strings.ReplaceAll(k, "-", "_")
			if _, taken := mountTable[k]; ok && !taken {
				mountTable[k] = mountOpt{f.takeValue, func(c *config, _, v string) error { return f.set(c, v) }}
			}
		}
	}
}

func timeoutOpt(field func(*config) *time.Duration) func(*config, string, string) error {
	return func(c *config, opt, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1e6 {
			return badf("-o %s: want seconds (a number >= 0)", opt)
		}
		d := time.Duration(f * float64(time.Second))
		if f == 0 {
			d = -1 // disabled (Options: negative means 0)
		}
		*field(c) = d
		return nil
	}
}

func numOpt(field func(*config) *int, most int) func(*config, string, string) error {
	return func(c *config, opt, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			k, _, _ := strings.Cut(opt, "=")
			return badf("-o %s: want %s=N", opt, k)
		}
		if n > most {
			return badf("-o %s: at most %d", opt, most)
		}
		*field(c) = n
		return nil
	}
}

func (c *config) mountOptions(list string) error {
	for _, o := range strings.Split(list, ",") {
		if o == "" {
			continue
		}
		if mounthelper.MountLevel(o) {
			continue // mount(8)'s, systemd's or fstab's, not the file system's
		}
		k, v, hasV := strings.Cut(o, "=")
		m, ok := mountTable[k]
		switch {
		case !ok:
			return badf("unknown mount option -o %s", o)
		case m.takeValue && !hasV:
			return badf("-o %s: want %s=VALUE", o, k)
		case !m.takeValue && hasV:
			return badf("-o %s takes no value", k)
		}
		if err := m.set(c, o, v); err != nil {
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

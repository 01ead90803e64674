package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/sirupsen/logrus"

	"phxmount/connector"
	"phxmount/connector/emu"
	"phxmount/connector/nvidia"
	"phxmount/connector/pcibar"
	"phxmount/fusefs"
	"phxmount/phxfs"
)

// ---------------------------------------------------------------------------
// WIRING: phxfs + connector + the control protocol.
//
// newControl builds the fusefs.Control that answers the project's ioctls and
// user.phx.* xattrs: it opens the connector (--vendor), creates the phxfs
// library (--engine, --workers) and the control server over them, and
// returns a function that releases it all after unmount.
//
// --vendor auto takes nvidia when connector/nvidia.Open succeeds and falls
// back to the emulated device, loudly. The emulated device is configured by
// --emu-staged (its memory is non-host-addressable: the staged transport)
// and --emu-devices N, or by the environment variables they replace,
// PHXMOUNT_EMU_STAGED=1 and PHXMOUNT_EMU_DEVICES=N (see emuConfig).
// ---------------------------------------------------------------------------
func newControl(c *config, log *logrus.Entry) (ctl fusefs.Control, closeFn func(), err error) {
	newEmu := func() (connector.Connector, error) {
		cfg, err := emuConfig(c, os.Getenv)
		if err != nil {
			return nil, err
		}
		return emu.New(cfg)
	}
	var conn connector.Connector
	switch c.vendor {
	case "nvidia":
		conn, err = nvidia.Open()
	case "emu":
		conn, err = newEmu()
	case "pcibar":
		conn, err = pcibar.New(pcibar.Config{})
	default: // auto
		nv, nerr := nvidia.Open()
		if nerr == nil {
			conn = nv
			log.Infof("--vendor auto: using the NVIDIA GPUs")
		} else {
			conn, err = newEmu()
			log.Warnf("--vendor auto: NO GPU (%v): using the EMULATED device; ioctl reads land in host shared memory, not GPU memory", nerr)
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("--vendor %s: %v", c.vendor, err)
	}
	if e, ok := conn.(*emu.Connector); ok {
		mode := "host-addressable (host transport)"
		if !e.HostAddressable() {
			mode = "NOT host-addressable (staged transport, --emu-staged)"
		}
		log.Warnf("vendor emu: the emulated device's memory is %s", mode)
	}
	engine := c.engine
	if engine == "auto" {
		engine = ""
	}
	lib, err := phxfs.New(phxfs.Config{Connector: conn, Engine: engine, Workers: c.workers})
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	s, err := fusefs.NewControl(fusefs.ControlConfig{Lib: lib, ReadOnly: c.fs.ReadOnly, Log: log,
		MaxBuffersPerProcess: c.limits.perProcess, MaxBuffers: c.limits.buffers, MaxRegisteredBytes: c.limits.bytes})
	if err != nil {
		lib.Close()
		conn.Close()
		return nil, nil, err
	}
	log.WithFields(logrus.Fields{"vendor": conn.Vendor(), "engine": lib.EngineName(), "workers": lib.Workers()}).
		Infof("control protocol ready: vendor %s, engine %s, %d workers", conn.Vendor(), lib.EngineName(), lib.Workers())
	if err := lib.EngineFallback(); err != nil {
		log.Warnf("engine: io_uring could not be set up for some workers (%v): they run the sync engine (%s)", err, lib.EngineName())
	}
	if !conn.HostAddressable() && !lib.StagedStats().Cachestat {
		log.Warnf("staged read policy: this kernel has no cachestat(2) (Linux >= 6.5): every staged read goes through the page cache, none with O_DIRECT")
	}
	return s, func() {
		if err := s.Close(); err != nil {
			log.Warnf("control: %v", err)
		}
		if err := lib.Close(); err != nil {
			log.Warnf("phxfs: %v", err)
		}
		if err := conn.Close(); err != nil {
			log.Warnf("%s connector: %v", conn.Vendor(), err)
		}
	}, nil
}

// emuConfig is the emulated device's configuration: the flags, else the
// environment variables they replace.
func emuConfig(c *config, getenv func(string) string) (emu.Config, error) {
	cfg := emu.Config{Staged: c.emuStaged || getenv("PHXMOUNT_EMU_STAGED") == "1", Devices: c.emuDevices}
	if v := getenv("PHXMOUNT_EMU_DEVICES"); v != "" && cfg.Devices == 0 {
		n, err := strconv.Atoi(v)
		if err != nil {
			return cfg, fmt.Errorf("PHXMOUNT_EMU_DEVICES=%q: want a number", v)
		}
		cfg.Devices = n
	}
	return cfg, nil
}

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
// back to the emulated device, loudly. The emulated device reads two
// environment variables: PHXMOUNT_EMU_STAGED=1 makes its memory
// non-host-addressable (the staged transport), PHXMOUNT_EMU_DEVICES=N sets
// the number of devices.
// ---------------------------------------------------------------------------
func newControl(c *config, log *logrus.Entry) (ctl fusefs.Control, closeFn func(), err error) {
	newEmu := func() (connector.Connector, error) {
		cfg := emu.Config{Staged: os.Getenv("PHXMOUNT_EMU_STAGED") == "1"}
		if v := os.Getenv("PHXMOUNT_EMU_DEVICES"); v != "" {
			if cfg.Devices, err = strconv.Atoi(v); err != nil {
				return nil, fmt.Errorf("PHXMOUNT_EMU_DEVICES=%q: want a number", v)
			}
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
			mode = "NOT host-addressable (staged transport, PHXMOUNT_EMU_STAGED=1)"
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
		return nil, nil, fmt.Errorf("phxfs: %v", err)
	}
	s, err := fusefs.NewControl(fusefs.ControlConfig{Lib: lib, ReadOnly: c.fs.ReadOnly, Log: log})
	if err != nil {
		lib.Close()
		conn.Close()
		return nil, nil, err
	}
	log.WithFields(logrus.Fields{"vendor": conn.Vendor(), "engine": lib.EngineName(), "workers": lib.Workers()}).
		Infof("control protocol ready: vendor %s, engine %s, %d workers", conn.Vendor(), lib.EngineName(), lib.Workers())
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

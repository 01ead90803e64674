package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/emu"
	"github.com/phxmount/phxmount/connector/nvidia"
	"github.com/phxmount/phxmount/connector/pcibar"
	"github.com/phxmount/phxmount/fusefs"
	"github.com/phxmount/phxmount/phxfs"
)

// ---------------------------------------------------------------------------
// WIRING: phxfs + connector + the control protocol.
//
// newControl builds the fusefs.ControlServer that answers the project's
// ioctls and user.phx.* xattrs: it opens the connector (--vendor), creates
// the phxfs library (--engine, --workers) and the control server over them,
// and returns them with a function that releases it all after unmount.
//
// --vendor auto takes nvidia when connector/nvidia.Open succeeds and falls
// back to the emulated device, loudly. The emulated device is configured by
// --emu-staged (its memory is non-host-addressable: the staged transport)
// and --emu-devices N, or by the environment variables they replace,
// PHXMOUNT_EMU_STAGED=1 and PHXMOUNT_EMU_DEVICES=N (see emuConfig).
// ---------------------------------------------------------------------------

// controlStack is the control protocol server, the library it runs on,
// and how to release them after unmount.
type controlStack struct {
	ctl   *fusefs.ControlServer
	lib   *phxfs.Lib
	close func()
}

// newControl builds the stack; observe (nil: none) is told the latency of
// each data ioctl (the metrics' histogram).
func newControl(c *config, log *logrus.Entry, observe func(string, time.Duration)) (*controlStack, error) {
	conn, err := openConnector(c, log)
	if err != nil {
		return nil, err
	}
	engine := c.engine
	if engine == "auto" {
		engine = ""
	}
	// Writer: the WRITE ioctls' file writes are made for callers, and take
	// no block a file system reserves for root (fusefs/writeas.go).
	lib, err := phxfs.New(phxfs.Config{Connector: conn, Engine: engine, Workers: c.workers, Writer: true})
	if err != nil {
		conn.Close()
		return nil, err
	}
	s, err := fusefs.NewControl(fusefs.ControlConfig{Lib: lib, ReadOnly: c.fs.ReadOnly, Log: log, ObserveIoctl: observe,
		MaxBuffersPerProcess: c.limits.perProcess, MaxBuffersPerUser: c.limits.perUser, MaxBuffers: c.limits.buffers,
		MaxRegisteredBytesPerUser: c.limits.userBytes, MaxRegisteredBytes: c.limits.bytes,
		MaxPiecesInFlightPerUser: int64(c.limits.userPieces), MaxPiecesInFlight: int64(c.limits.pieces)})
	if err != nil {
		lib.Close()
		conn.Close()
		return nil, err
	}
	logControl(log, conn, lib)
	// Before the mount answers: a client's first load finds the GPU state
	// (context, streams, bounce buffers) made. A device that cannot be
	// prepared is tried again, and explained, at its first registration.
	if err := s.PrepareDevices(); err != nil {
		log.Warnf("%v", err)
	}
	return &controlStack{ctl: s, lib: lib, close: func() {
		if err := s.Close(); err != nil {
			log.Warnf("control: %v", err)
		}
		if err := lib.Close(); err != nil {
			log.Warnf("phxfs: %v", err)
		}
		if err := conn.Close(); err != nil {
			log.Warnf("%s connector: %v", conn.Vendor(), err)
		}
	}}, nil
}

// openConnector opens the vendor --vendor names (auto: NVIDIA, else the
// emulated device, loudly).
func openConnector(c *config, log *logrus.Entry) (connector.Connector, error) {
	newEmu := func() (connector.Connector, error) {
		cfg, err := emuConfig(c, os.Getenv)
		if err != nil {
			return nil, err
		}
		return emu.New(cfg)
	}
	var conn connector.Connector
	var err error
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
		return nil, fmt.Errorf("--vendor %s: %v", c.vendor, err)
	}
	if e, ok := conn.(*emu.Connector); ok {
		mode := "host-addressable (host transport)"
		if !e.HostAddressable() {
			mode = "NOT host-addressable (staged transport, --emu-staged)"
		}
		log.Warnf("vendor emu: the emulated device's memory is %s", mode)
	}
	return conn, nil
}

// logControl says what the control runs on, and what it falls back from.
func logControl(log *logrus.Entry, conn connector.Connector, lib *phxfs.Lib) {
	log.WithFields(logrus.Fields{"vendor": conn.Vendor(), "engine": lib.EngineName(), "workers": lib.Workers()}).
		Infof("control protocol ready: vendor %s, engine %s, %d workers", conn.Vendor(), lib.EngineName(), lib.Workers())
	if err := lib.EngineFallback(); err != nil {
		log.Warnf("engine: io_uring could not be set up for some workers (%v): they run the sync engine (%s)", err, lib.EngineName())
	}
	if !conn.HostAddressable() && !lib.StagedStats().Cachestat {
		log.Warnf("staged read policy: this kernel has no cachestat(2) (Linux >= 6.5): every staged read goes through the page cache, none with O_DIRECT")
	}
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

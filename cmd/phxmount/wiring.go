package main

import (
	"github.com/sirupsen/logrus"

	"phxmount/fusefs"
)

// ---------------------------------------------------------------------------
// WIRING: phxfs + connector + the control protocol.
//
// newControl builds the fusefs.Control that answers the project's ioctls and
// user.phx.* xattrs: it opens the connector (--vendor), creates the phxfs
// library (--engine, --workers) and the control server over them, and
// returns a function that releases it all after unmount. The overlay gives
// the control the overlay itself (PassthroughActive for user.phx.info).
//
// TODO(control): the control protocol (fusefs/control_*.go) has not landed
// yet; until it does this returns nil and the mount refuses every project
// ioctl (ENOTTY) and user.phx.* name (ENODATA).
// ---------------------------------------------------------------------------
func newControl(c *config, log *logrus.Entry) (ctl fusefs.Control, closeFn func(), err error) {
	log.WithFields(logrus.Fields{"vendor": c.vendor, "engine": c.engine, "workers": c.workers}).
		Debug("control protocol not wired yet: project ioctls get ENOTTY")
	return nil, func() {}, nil
}

package daemonize

import (
	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/phxmount/phxmount/internal/errs"
)

// Notify tells the service manager the daemon's state (sd_notify(3):
// daemon.SdNotifyReady, SdNotifyStopping, SdNotifyReloading, or
// "STATUS=…"). It reports false, and no error, when no manager listens
// (no NOTIFY_SOCKET: not a Type=notify unit).
func Notify(state string) (bool, error) {
	sent, err := daemon.SdNotify(false, state)
	return sent, errs.Wrapf(err, "sd_notify %q", state)
}

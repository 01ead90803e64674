package fusefs

import (
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/phxfs"
)

// PrepareDevices opens every device of the connector for the server's life
// and readies, before any client asks, what a first load would otherwise
// pay for: for the staged transport, the device's context, its copy
// streams and the bounce buffers (phxfs.Lib.Warm). The devices are
// prepared at once; the error of the first that failed is returned after
// all were tried (a registration on it tries again, and says why). The
// daemon calls it before it mounts.
func (s *ControlServer) PrepareDevices() error {
	infos, err := s.conn.Devices()
	if err != nil {
		return errs.Wrapf(err, "control: list %s devices", s.conn.Vendor())
	}
	errsOf := make([]error, len(infos))
	var wg sync.WaitGroup
	for i := range infos {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errsOf[i] = s.prepareDevice(i)
		}()
	}
	wg.Wait()
	for _, e := range errsOf {
		if e != nil {
			return e
		}
	}
	return nil
}

func (s *ControlServer) prepareDevice(dev int) error {
	t0 := time.Now()
	if err := s.openDevice(dev); err != nil {
		return err
	}
	d, err := s.lib.Device(dev)
	if err != nil || d.Transport != phxfs.Staged {
		return err
	}
	if err := s.lib.Warm(dev); err != nil {
		return errs.Wrapf(err, "control: prepare device %d for the staged transport", dev)
	}
	s.log.WithFields(logrus.Fields{"device": dev, "seconds": time.Since(t0).Seconds()}).
		Infof("device %d ready for the staged transport in %v: context, %d copy streams and their bounce buffers made before any client",
			dev, time.Since(t0).Round(time.Millisecond), s.lib.Workers())
	return nil
}

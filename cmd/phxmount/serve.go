package main

import (
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"runtime/trace"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/sirupsen/logrus"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/fusefs"
	"github.com/phxmount/phxmount/internal/buildinfo"
	"github.com/phxmount/phxmount/internal/daemonize"
	"github.com/phxmount/phxmount/internal/logfile"
	"github.com/phxmount/phxmount/internal/metrics"
	"github.com/phxmount/phxmount/phxfs"
)

// serve is the daemon: it mounts, says it is ready (the log line, sd_notify,
// and, started by the mount helper, by detaching), and serves until SIGINT,
// SIGTERM or an unmount. SIGHUP reopens the log file and never ends it.
func serve(c *config) int {
	// Signals are ours from the start: a SIGHUP while mounting must not
	// kill the daemon.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	log, lf, err := daemonLogger(c)
	if err != nil {
		return fail(2, "%v", err) // --log-file names a path that cannot be a log
	}
	if lf != nil {
		defer lf.Close()
	}
	c.fs.Log = log
	giveUpCapabilities(log) // re-executes the daemon without them, once
	defer profile(log)()

	src := &metricsSource{}
	m, observe, err := newMetrics(c, src)
	if err != nil {
		return fail(1, "%v", err)
	}
	st, err := newControl(c, log, observe)
	if err != nil {
		return fail(1, "%v", err)
	}
	defer st.close()
	c.fs.Control = st.ctl
	if m != nil {
		c.fs.ObserveRequest = m.ObserveRequest
		src.ctl, src.lib = st.ctl, st.lib
		srv, err := m.Serve(c.metrics)
		if err != nil {
			return fail(1, "--metrics: %v", err)
		}
		defer srv.Close()
		logMetrics(log, c.metrics, srv)
	}

	fsys, err := fusefs.Mount(c.backing, c.mountpoint, c.fs)
	if err != nil {
		return fail(1, "%v", err)
	}
	logMounted(log, c, fsys, true)
	// The control exists before the overlay: tell it how to report the
	// overlay's passthrough state (INFO and user.phx.info). From here on
	// the mount answers as ready (phxmount wait), after the line above.
	st.ctl.SetPassthrough(fsys.PassthroughActive)
	ready(log, c)
	return serveUntil(log, c, fsys, lf, sigs)
}

// ready tells whoever waits that the mount serves: systemd (Type=notify),
// and the mount helper, which returns once it sees the mount ready; a
// daemon the helper started then lets go of its terminal.
func ready(log *logrus.Entry, c *config) {
	notify(log, daemon.SdNotifyReady+"\nSTATUS=serving "+c.backing+" on "+c.mountpoint)
	if daemonize.Child() {
		if err := daemonize.Detach(); err != nil {
			log.Warnf("%v", err)
		}
	}
}

func notify(log *logrus.Entry, state string) {
	if _, err := daemonize.Notify(state); err != nil {
		log.Warnf("%v", err)
	}
}

// serveUntil serves until a signal or an unmount, and unmounts on SIGINT
// or SIGTERM.
func serveUntil(log *logrus.Entry, c *config, fsys *fusefs.FS, lf *logfile.File, sigs <-chan os.Signal) int {
	done := make(chan struct{})
	go func() {
		fsys.Wait()
		close(done)
	}()
	for {
		select {
		case s := <-sigs:
			if s == syscall.SIGHUP {
				hangup(log, lf)
				continue
			}
			notify(log, daemon.SdNotifyStopping)
			log.Infof("%v: unmounting %s", s, c.mountpoint)
			if err := fsys.Unmount(); err != nil {
				log.Errorf("unmount %s: %v", c.mountpoint, err)
			}
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				log.Warnf("%s was detached lazily; processes still using it will see ENOTCONN", c.mountpoint)
			}
			return 0
		case <-done:
			notify(log, daemon.SdNotifyStopping)
			log.Infof("%s was unmounted", c.mountpoint)
			return 0
		}
	}
}

// hangup is SIGHUP: reopen the log file (logrotate moved it), else go on.
func hangup(log *logrus.Entry, lf *logfile.File) {
	if lf == nil {
		log.Infof("SIGHUP: no --log-file to reopen; still serving")
		return
	}
	if err := lf.Reopen(); err != nil {
		log.Errorf("SIGHUP: %v; still logging to the file it had", err)
		return
	}
	log.Infof("SIGHUP: reopened the log file %s; still serving", lf.Path())
}

// logMetrics says where the metrics are served: loopback only, or reachable
// from other machines, without authentication, because the address said so.
func logMetrics(log *logrus.Entry, asked string, srv *metrics.Server) {
	l := log.WithFields(logrus.Fields{"metrics": srv.URL(), "bound": srv.Addr().String()})
	if srv.Loopback() {
		l.Infof("metrics: serving %s (--metrics %s: bound %s, loopback only)", srv.URL(), asked, srv.Addr())
		return
	}
	l.Warnf("metrics: serving %s (--metrics %s: bound %s): reachable from other machines, without authentication", srv.URL(), asked, srv.Addr())
}

// metricsSource gives the metrics the control's counters and the
// library's bytes per transport; serve fills it before serving metrics.
type metricsSource struct {
	ctl *fusefs.ControlServer
	lib *phxfs.Lib
}

func (s *metricsSource) Counters() client.Counters              { return s.ctl.Counters() }
func (s *metricsSource) TransportStats() []phxfs.TransportBytes { return s.lib.TransportStats() }

// newMetrics makes the metrics for --metrics (nil when off) and the
// function the control reports ioctl latencies to.
func newMetrics(c *config, src metrics.Source) (*metrics.Metrics, func(string, time.Duration), error) {
	if c.metrics == "" {
		return nil, nil, nil
	}
	m, err := metrics.New(src, buildinfo.Get())
	if err != nil {
		return nil, nil, err
	}
	return m, m.ObserveIoctl, nil
}

// EnvCPUProfile names a file for a CPU profile of the whole daemon, from
// mount to exit (go tool pprof phxmount FILE): where a load's time goes on
// a machine with no profiler of its own.
const EnvCPUProfile = "PHXMOUNT_CPUPROFILE"

// EnvTrace names a file for a runtime trace of the whole daemon, from
// mount to exit (go tool trace FILE): when each ioctl was served
// (fusefs.ioctl) and, inside it, the library's steps (phxfs.prepare,
// phxfs.gather, phxfs.scatter, phxfs.await), where a CPU profile only
// says how much CPU each took.
const EnvTrace = "PHXMOUNT_TRACE"

// recorders is each whole-daemon recording the environment can ask for.
var recorders = []struct {
	env, what string
	start     func(io.Writer) error
	stop      func()
}{
	{EnvCPUProfile, "CPU profile", pprof.StartCPUProfile, pprof.StopCPUProfile},
	{EnvTrace, "runtime trace", trace.Start, trace.Stop},
}

// profile starts the recordings the environment asks for and returns what
// stops them (nothing to stop where none is asked for or one cannot
// start: a warning, never a failure to serve).
func profile(log *logrus.Entry) func() {
	var stops []func()
	for _, r := range recorders {
		path := os.Getenv(r.env)
		if path == "" {
			continue
		}
		f, err := os.Create(path)
		if err == nil {
			err = r.start(f)
		}
		if err != nil {
			log.Warnf("%s=%s: no %s: %v", r.env, path, r.what, err)
			if f != nil {
				f.Close()
			}
			continue
		}
		log.Infof("%s of the daemon to %s (%s)", r.what, path, r.env)
		stop := r.stop
		stops = append(stops, func() {
			stop()
			f.Close()
		})
	}
	return func() {
		for _, stop := range stops {
			stop()
		}
	}
}

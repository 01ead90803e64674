package main

import (
	"io"
	"log/syslog"
	"os"
	"time"

	"github.com/sirupsen/logrus"
	lsyslog "github.com/sirupsen/logrus/hooks/syslog"

	"github.com/phxmount/phxmount/internal/daemonize"
	"github.com/phxmount/phxmount/internal/logfile"
)

// newLogger logs at level in format (text or json) to out.
func newLogger(level logrus.Level, format string, out io.Writer) *logrus.Entry {
	l := logrus.New()
	l.SetOutput(out)
	l.SetLevel(level)
	if format == "json" {
		l.SetFormatter(&logrus.JSONFormatter{TimestampFormat: time.RFC3339Nano})
	} else {
		l.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: "15:04:05.000"})
	}
	return logrus.NewEntry(l).WithField("component", "phxmount")
}

// daemonLogger is the daemon's log: --log-file when given (the file is
// returned, for SIGHUP to reopen); else stderr, or, for a daemon the mount
// helper started (which has no terminal once it serves), syslog when there
// is one and nothing otherwise.
func daemonLogger(c *config) (*logrus.Entry, *logfile.File, error) {
	if c.logFile != "" {
		lf, err := logfile.Open(c.logFile)
		if err != nil {
			return nil, nil, err
		}
		return newLogger(c.logLevel, c.logFormat, lf), lf, nil
	}
	if !daemonize.Child() {
		return newLogger(c.logLevel, c.logFormat, os.Stderr), nil, nil
	}
	log := newLogger(c.logLevel, c.logFormat, io.Discard)
	if h, err := lsyslog.NewSyslogHook("", "", syslog.LOG_DAEMON|syslog.LOG_INFO, "phxmount"); err == nil {
		log.Logger.AddHook(h)
	}
	return log, nil, nil
}

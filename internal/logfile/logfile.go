// Package logfile is a log file that can be reopened, so that logrotate
// (or an operator) can move it away and have the daemon write a new one
// at the next SIGHUP.
package logfile

import (
	"os"
	"sync"

	"github.com/phxmount/phxmount/internal/errs"
)

// File appends to a path; Reopen closes it and opens the path again.
type File struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

// Open opens path for appending, creating it (mode 0640) when missing.
func Open(path string) (*File, error) {
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	return &File{path: path, f: f}, nil
}

func open(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0640)
	if err != nil {
		return nil, errs.Wrapf(err, "log file")
	}
	return f, nil
}

// Path is the file's path.
func (l *File) Path() string { return l.path }

// Write appends p.
func (l *File) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Write(p)
}

// Reopen opens the path anew (a rotated file is left to whoever moved
// it). When the path cannot be opened, the old file stays in use and the
// error says why.
func (l *File) Reopen() error {
	f, err := open(l.path)
	if err != nil {
		return err
	}
	l.mu.Lock()
	old := l.f
	l.f = f
	l.mu.Unlock()
	return errs.Wrapf(old.Close(), "log file: close the old %s", l.path)
}

// Close closes the file.
func (l *File) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return errs.Wrapf(l.f.Close(), "log file: close %s", l.path)
}

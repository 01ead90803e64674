// Package errs builds errors that carry an errno with context, so that every
// layer can report what went wrong while callers still match the errno with
// errors.Is and the FUSE server can return it unchanged.
package errs

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Error carries an errno with context.
type Error struct {
	Errno unix.Errno
	Msg   string
}

func (e *Error) Error() string { return e.Msg + ": " + e.Errno.Error() }

// Unwrap lets errors.Is match the errno.
func (e *Error) Unwrap() error { return e.Errno }

// New returns an error carrying errno, described by format and args.
func New(errno unix.Errno, format string, args ...any) error {
	return &Error{Errno: errno, Msg: fmt.Sprintf(format, args...)}
}

// Errno extracts the errno an error carries; EIO when it carries none.
func Errno(err error) unix.Errno {
	if err == nil {
		return 0
	}
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	return unix.EIO
}

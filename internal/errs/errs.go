// Package errs builds the project's errors the way package os builds a
// PathError: an error says what was being done (Op), to what (Subject),
// and why (the cause it wraps), and each layer adds only what it knows.
// Every error carries an errno at its root, so callers match it with
// errors.Is(err, unix.EFAULT), find an Error with errors.As, and the FUSE
// server returns the errno unchanged. A message names each fact once:
//
//	phxfs: register [0x7f3a00000000, +4096) on device 0: address and length must be non-zero multiples of 65536: invalid argument
//
// is Wrap("phxfs: register", "[…) on device 0", New(EINVAL, "address and …")).
package errs

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Error is an operation that failed: Op on Subject, because of Err. A leaf
// error (New) has no Op: Detail says what is wrong and Err is the errno.
type Error struct {
	Op      string // what was being done ("phxfs: register"); "" for a leaf
	Subject string // what it was done to ("[0x…, +4096) on device 0"); may be ""
	Detail  string // a leaf's reason in words
	Err     error  // the cause: an errno, or an error that unwraps to one
}

func (e *Error) Error() string {
	var b strings.Builder
	add := func(sep, s string) {
		if s == "" {
			return
		}
		if b.Len() > 0 {
			b.WriteString(sep)
		}
		b.WriteString(s)
	}
	add("", e.Op)
	add(" ", e.Subject)
	add(": ", e.Detail)
	if e.Err != nil {
		add(": ", e.Err.Error())
	}
	return b.String()
}

// Unwrap gives the cause, so errors.Is and errors.As see through every
// layer.
func (e *Error) Unwrap() error { return e.Err }

// New returns a leaf error: errno, with format describing what is wrong.
func New(errno unix.Errno, format string, args ...any) error {
	return &Error{Detail: fmt.Sprintf(format, args...), Err: errno}
}

// Wrap says that op on subject failed because of err; nil stays nil.
func Wrap(op, subject string, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Op: op, Subject: subject, Err: err}
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

// Wrapf is Wrap with the operation (and its subject) formatted in one
// string: "emu: map device memory", "pcibar: read /sys/...".
func Wrapf(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return &Error{Op: fmt.Sprintf(format, args...), Err: err}
}

//go:build tools

// Package deps pins the project's direct dependencies while the packages
// that import them are being written; `go mod tidy` keeps what is named here.
package deps

import (
	_ "github.com/ebitengine/purego"
	_ "github.com/hanwen/go-fuse/v2/fs"
	_ "github.com/pawelgaczynski/giouring"
	_ "github.com/sirupsen/logrus"
	_ "golang.org/x/sys/unix"
)

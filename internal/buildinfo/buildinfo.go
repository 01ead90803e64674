// Package buildinfo says which phxmount this is: the version, the commit
// and how it was built. The Makefile stamps Version, Commit and Date with
// -ldflags -X; a build without them (go build, go install) falls back on
// what the Go toolchain recorded (debug.ReadBuildInfo: the module version
// of `go install …@vX.Y.Z`, and vcs.revision and vcs.time where the build
// saw the git checkout).
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Stamped by the Makefile: -ldflags "-X <module>/internal/buildinfo.Version=…".
var (
	Version = "" // git describe --tags --always --dirty
	Commit  = "" // git rev-parse HEAD
	Date    = "" // commit time, RFC 3339
)

// Info is what --version prints and the metrics' build_info carries.
type Info struct {
	Version   string // "devel" when nothing says better
	Commit    string // "unknown" when nothing says
	Date      string // "" when unknown
	Modified  bool   // built from a tree with uncommitted changes (vcs.modified)
	Module    string // the main module's path
	GoVersion string
	Platform  string // GOOS/GOARCH
	Settings  []string
}

// Get gathers the build information: the stamped values first, then the
// toolchain's.
func Get() Info {
	in := Info{Version: Version, Commit: Commit, Date: Date, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		fromBuildInfo(&in, bi)
	}
	if in.Version == "" {
		in.Version = "devel"
	}
	if in.Commit == "" {
		in.Commit = "unknown"
	}
	return in
}

// fromBuildInfo fills what the stamps left empty from the toolchain's
// record, and keeps the build settings worth printing.
func fromBuildInfo(in *Info, bi *debug.BuildInfo) {
	in.Module = bi.Main.Path
	if in.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		in.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if in.Commit == "" {
				in.Commit = s.Value
			}
		case "vcs.time":
			if in.Date == "" {
				in.Date = s.Value
			}
		case "vcs.modified":
			in.Modified = s.Value == "true"
		case "CGO_ENABLED", "-race", "-tags", "-trimpath", "GOAMD64", "GOARM64":
			in.Settings = append(in.Settings, s.Key+"="+s.Value)
		}
	}
}

// String is --version's text: the version on the first line, then one
// detail a line.
func (in Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "phxmount %s\n", in.Version)
	commit := in.Commit
	if in.Modified {
		commit += " (modified)"
	}
	fmt.Fprintf(&b, "commit: %s\n", commit)
	if in.Date != "" {
		fmt.Fprintf(&b, "date: %s\n", in.Date)
	}
	if in.Module != "" {
		fmt.Fprintf(&b, "module: %s\n", in.Module)
	}
	fmt.Fprintf(&b, "go: %s %s\n", in.GoVersion, in.Platform)
	if len(in.Settings) > 0 {
		fmt.Fprintf(&b, "build: %s\n", strings.Join(in.Settings, " "))
	}
	return b.String()
}

package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

// TestStampsWin: values stamped with -X win over the toolchain's; the
// toolchain's fill what is not stamped.
func TestStampsWin(t *testing.T) {
	bi := &debug.BuildInfo{Main: debug.Module{Path: "example.com/phx", Version: "v1.2.3"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
		{Key: "vcs.modified", Value: "true"}, {Key: "CGO_ENABLED", Value: "0"}, {Key: "GOOS", Value: "linux"}}}
	in := Info{Version: "v9.9.9-stamped", Commit: "def"}
	fromBuildInfo(&in, bi)
	if in.Version != "v9.9.9-stamped" || in.Commit != "def" || in.Date != "2026-01-02T03:04:05Z" || !in.Modified || in.Module != "example.com/phx" {
		t.Errorf("stamped: %+v", in)
	}
	if strings.Join(in.Settings, " ") != "CGO_ENABLED=0" {
		t.Errorf("settings %q", in.Settings)
	}
	var plain Info
	fromBuildInfo(&plain, bi)
	if plain.Version != "v1.2.3" || plain.Commit != "abc" {
		t.Errorf("unstamped: %+v", plain)
	}
	fromBuildInfo(&plain, &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}})
	if plain.Version != "v1.2.3" {
		t.Errorf("(devel) replaced a version: %+v", plain)
	}
}

// TestString: --version's text names the version first, then the commit
// (marked when modified), the date and the toolchain.
func TestString(t *testing.T) {
	s := Info{Version: "v1.0.0", Commit: "abc", Modified: true, Date: "2026-01-02", Module: "m", GoVersion: "go1.26", Platform: "linux/amd64", Settings: []string{"CGO_ENABLED=0"}}.String()
	want := "phxmount v1.0.0\ncommit: abc (modified)\ndate: 2026-01-02\nmodule: m\ngo: go1.26 linux/amd64\nbuild: CGO_ENABLED=0\n"
	if s != want {
		t.Errorf("got\n%s\nwant\n%s", s, want)
	}
	if g := Get(); g.Version == "" || g.Commit == "" || g.GoVersion == "" {
		t.Errorf("Get left a field empty: %+v", g)
	}
}

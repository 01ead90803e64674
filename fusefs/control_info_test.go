package fusefs

import (
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/phxmount/phxmount/connector/emu"
	"github.com/phxmount/phxmount/phxfs"
)

// reportingConn is an emu connector that reports its scatter method, as
// the NVIDIA connector does.
type reportingConn struct{ *emu.Connector }

func (reportingConn) ScatterReport() string { return "PHX_SCATTER=auto; kernel 3" }

// TestInfoScatterKey: user.phx.info carries scatter= where the connector
// reports it (NVIDIA), and not where it has nothing to say (emu).
func TestInfoScatterKey(t *testing.T) {
	root := XattrTarget{IsRoot: true, IsDir: true}
	e := newCtlEnv(t, false, false)
	if v, errno := e.s.GetXattr(e.me, root, XattrInfo); errno != 0 || strings.Contains(string(v), "scatter=") {
		t.Errorf("emu info (%v) has a scatter key:\n%s", errno, v)
	}
	conn, err := emu.New(emu.Config{Staged: true})
	if err != nil {
		t.Fatal(err)
	}
	lib, err := phxfs.New(phxfs.Config{Connector: reportingConn{conn}, Engine: "sync", Workers: 2, BounceSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	s, err := NewControl(ControlConfig{Lib: lib, Log: logrus.NewEntry(logrus.New()), Passthrough: func() (bool, string) { return false, "test" }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v, errno := s.GetXattr(e.me, root, XattrInfo)
	if errno != 0 || !strings.Contains(string(v), "\nscatter=PHX_SCATTER=auto; kernel 3\n") {
		t.Errorf("info (%v) lacks the connector's scatter report:\n%s", errno, v)
	}
}

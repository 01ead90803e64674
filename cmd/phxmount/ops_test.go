package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/fusefs"
	"github.com/phxmount/phxmount/internal/logfile"
	"github.com/phxmount/phxmount/internal/mounthelper"
)

// TestMountLevelOptions: what mount(8), systemd and fstab put in -o is
// accepted and consumed (it reaches neither the daemon's settings nor the
// kernel), whatever the file system's own options around it.
func TestMountLevelOptions(t *testing.T) {
	opts := "ro,nofail,_netdev,noauto,auto,defaults,user,user=alice,users,nouser,owner,group,comment=c,x-systemd.automount," +
		"x-systemd.requires=network-online.target,X-mount.mkdir,noexec,nosuid,nodev,cache=exclusive"
	c, err := parseArgs([]string{"-o", opts, "b", "m"})
	if err != nil {
		t.Fatal(err)
	}
	if !c.fs.ReadOnly || c.fs.Cache != fusefs.CacheExclusive || strings.Join(c.fs.ExtraMountOptions, ",") != "noexec,nosuid,nodev" {
		t.Errorf("ro %v cache %v extra %q", c.fs.ReadOnly, c.fs.Cache, c.fs.ExtraMountOptions)
	}
	for _, o := range mounthelper.MountLevelOptions {
		name := o.Name
		if strings.HasSuffix(name, "=") || strings.HasSuffix(name, "-") {
			name += "x"
		}
		if _, err := parseArgs([]string{"-o", name, "b", "m"}); err != nil {
			t.Errorf("-o %s: %v", name, err)
		}
	}
	for _, bad := range []string{"nofailx", "x-", "user="} {
		var ue *usageError
		if _, err := parseArgs([]string{"-o", bad, "b", "m"}); !errors.As(err, &ue) {
			t.Errorf("-o %s: %v, want a usage error", bad, err)
		}
	}
}

// TestFlagsAsMountOptions: every --long option is a mount option with "_"
// for "-", checked the same way; the new flags parse and refuse bad values.
func TestFlagsAsMountOptions(t *testing.T) {
	c, err := parseArgs([]string{"-o", "vendor=emu,engine=sync,workers=3,passthrough=off,log_level=debug,log_format=json," +
		"log_file=/var/log/p.log,metrics=127.0.0.1:9464,emu_staged,emu_devices=2", "b", "m"})
	if err != nil {
		t.Fatal(err)
	}
	if c.vendor != "emu" || c.engine != "sync" || c.workers != 3 || c.fs.Passthrough != fusefs.PassthroughOff || c.logLevel != logrus.DebugLevel ||
		c.logFormat != "json" || c.logFile != "/var/log/p.log" || c.metrics != "127.0.0.1:9464" || !c.emuStaged || c.emuDevices != 2 {
		t.Errorf("config %+v", c)
	}
	c, err = parseArgs([]string{"--log-format", "json", "--log-file=/tmp/l", "--metrics", ":9464", "b", "m"})
	if err != nil || c.logFormat != "json" || c.logFile != "/tmp/l" || c.metrics != ":9464" {
		t.Errorf("flags: %+v, %v", c, err)
	}
	if c, _ := parseArgs([]string{"b", "m"}); c.logFormat != "text" || c.metrics != "" || c.logFile != "" {
		t.Errorf("defaults: %+v", c)
	}
	for _, bad := range [][]string{{"--log-format", "xml"}, {"--metrics", "9464"}, {"--metrics", "localhost"}, {"--log-file="},
		{"-o", "vendor=amd"}, {"-o", "metrics=nowhere"}, {"-o", "log_format"}, {"-o", "emu_staged=1"}} {
		var ue *usageError
		if _, err := parseArgs(append(bad, "b", "m")); !errors.As(err, &ue) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
}

// TestHelpAndVersion: --version and --help exit 0 before anything else is
// checked; the help names the mount(8) options it consumes.
func TestHelpAndVersion(t *testing.T) {
	for _, a := range []string{"--version", "--help"} {
		var ue *usageError
		if _, err := parseArgs([]string{a}); !errors.As(err, &ue) || ue.msg != strings.TrimPrefix(a, "--") {
			t.Errorf("%s: %v", a, err)
		}
		if code := run([]string{a}); code != 0 {
			t.Errorf("%s: exit %d", a, code)
		}
	}
	if u := usageText(); !strings.Contains(u, "nofail, _netdev") || !strings.Contains(u, "x-*") || !strings.Contains(u, "--metrics ADDR") {
		t.Errorf("usage lacks the mount(8) options or --metrics:\n%s", u)
	}
	if u, want := usageText(), fmt.Sprintf("max_buffers_per_process=N\n                          (%d)", client.DefaultMaxBuffersPerProcess); !strings.Contains(u, want) || strings.Contains(u, "%!") {
		t.Errorf("usage does not say the registration limits' defaults (%q):\n%s", want, u)
	}
}

// TestLogFormatAndHangup: json logs are JSON objects; SIGHUP's handler
// reopens the log file after it was moved, and says so in the new one.
func TestLogFormatAndHangup(t *testing.T) {
	var b bytes.Buffer
	newLogger(logrus.InfoLevel, "json", &b).Infof("mounted; test")
	var rec map[string]any
	if err := json.Unmarshal(b.Bytes(), &rec); err != nil || rec["msg"] != "mounted; test" || rec["component"] != "phxmount" || rec["level"] != "info" {
		t.Errorf("json log %q: %v", b.String(), err)
	}
	path := filepath.Join(t.TempDir(), "p.log")
	c := &config{logFile: path, logFormat: "text", logLevel: logrus.InfoLevel}
	log, lf, err := daemonLogger(c)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	log.Infof("before")
	os.Rename(path, path+".1")
	hangup(log, lf)
	log.Infof("after")
	old, _ := os.ReadFile(path + ".1")
	cur, _ := os.ReadFile(path)
	if !strings.Contains(string(old), "before") || strings.Contains(string(old), "after") ||
		!strings.Contains(string(cur), "SIGHUP: reopened the log file") || !strings.Contains(string(cur), "after") {
		t.Errorf("moved file %q, new file %q", old, cur)
	}
	var quiet bytes.Buffer
	hangup(newLogger(logrus.InfoLevel, "text", &quiet), (*logfile.File)(nil))
	if !strings.Contains(quiet.String(), "no --log-file to reopen; still serving") {
		t.Errorf("SIGHUP without a log file: %q", quiet.String())
	}
	if _, _, err := daemonLogger(&config{logFile: filepath.Join(path, "x")}); err == nil {
		t.Errorf("a log file under a file opened")
	}
}

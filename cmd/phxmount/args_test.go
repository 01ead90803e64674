package main

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/phxmount/phxmount/fusefs"
)

// TestEmuFlags: --emu-staged and --emu-devices configure the emulated
// device; the environment variables they replace still work, and a flag
// wins over its variable.
func TestEmuFlags(t *testing.T) {
	env := func(kv map[string]string) func(string) string {
		return func(k string) string { return kv[k] }
	}
	for _, tc := range []struct {
		args    []string
		env     map[string]string
		staged  bool
		devices int
	}{
		{nil, nil, false, 0},
		{[]string{"--emu-staged"}, nil, true, 0},
		{[]string{"--emu-staged=false"}, nil, false, 0},
		{[]string{"--emu-devices", "3"}, nil, false, 3},
		{[]string{"--emu-devices=2", "--emu-staged"}, nil, true, 2},
		{nil, map[string]string{"PHXMOUNT_EMU_STAGED": "1", "PHXMOUNT_EMU_DEVICES": "2"}, true, 2},
		{[]string{"--emu-devices", "4"}, map[string]string{"PHXMOUNT_EMU_DEVICES": "2"}, false, 4},
	} {
		c, err := parseArgs(append(tc.args, "b", "m"))
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		cfg, err := emuConfig(c, env(tc.env))
		if err != nil || cfg.Staged != tc.staged || cfg.Devices != tc.devices {
			t.Errorf("%v %v: %+v, %v; want staged %v, devices %d", tc.args, tc.env, cfg, err, tc.staged, tc.devices)
		}
	}
	for _, bad := range [][]string{{"--emu-devices"}, {"--emu-devices", "x"}, {"--emu-devices", "0"}, {"--emu-staged=maybe"}} {
		if _, err := parseArgs(append(bad, "b", "m")); err == nil {
			t.Errorf("%v: accepted", bad)
		}
	}
	c, _ := parseArgs([]string{"b", "m"})
	if _, err := emuConfig(c, env(map[string]string{"PHXMOUNT_EMU_DEVICES": "two"})); err == nil {
		t.Errorf("PHXMOUNT_EMU_DEVICES=two accepted")
	}
}

// TestLimitOptions: the registration limits come from -o, with binary
// suffixes for bytes; bad values are usage errors.
func TestLimitOptions(t *testing.T) {
	c, err := parseArgs([]string{"-o", "max_buffers_per_process=7,max_buffers_per_user=8,max_buffers=9,max_registered_bytes_per_user=2M,max_registered_bytes=3G", "b", "m"})
	if err != nil {
		t.Fatal(err)
	}
	if c.limits.perProcess != 7 || c.limits.perUser != 8 || c.limits.buffers != 9 || c.limits.userBytes != 2<<20 || c.limits.bytes != 3<<30 {
		t.Errorf("limits %+v", c.limits)
	}
	for _, bad := range []string{"max_buffers=x", "max_registered_bytes=0", "max_registered_bytes=2Q", "max_registered_bytes=9999999T", "max_buffers",
		"max_buffers_per_user=-1", "max_registered_bytes_per_user=0"} {
		if _, err := parseArgs([]string{"-o", bad, "b", "m"}); err == nil {
			t.Errorf("-o %s accepted", bad)
		}
	}
}

// TestBadEnvironmentIsAUsageError: a tuning variable with a bad value stops
// phxmount before it mounts, with exit status 2 and the variable named.
func TestBadEnvironmentIsAUsageError(t *testing.T) {
	backing, mnt := t.TempDir(), t.TempDir()
	c, err := parseArgs([]string{backing, mnt})
	if err != nil || checkEnv(c) != nil {
		t.Fatalf("a clean environment: %v, %v", err, checkEnv(c))
	}
	for _, kv := range [][2]string{{"PHX_STAGED_BUFFERS", "99"}, {"PHX_STAGED_BUFFERS", "many"}, {"PHX_DIRECT_IO", "sometimes"}, {"PHX_ENGINE", "aio"}, {"PHX_CUDA_SYNC", "busy"}, {"PHX_SCATTER", "dma"}} {
		t.Run(kv[0]+"="+kv[1], func(t *testing.T) {
			t.Setenv(kv[0], kv[1])
			if err := checkEnv(c); err == nil || !strings.Contains(err.Error(), kv[0]) {
				t.Errorf("checkEnv: %v, want an error naming %s", err, kv[0])
			}
			if code := run([]string{backing, mnt}); code != 2 {
				t.Errorf("exit status %d, want 2", code)
			}
		})
	}
}

// TestCacheOption: -o cache= takes auto, exclusive or off (auto when not
// given); anything else is a usage error. The timeouts stay overrides.
func TestCacheOption(t *testing.T) {
	c, err := parseArgs([]string{"b", "m"})
	if err != nil || c.fs.Cache != fusefs.CacheAuto {
		t.Fatalf("default: %v, %v", c.fs.Cache, err)
	}
	for v, want := range map[string]fusefs.CacheMode{"auto": fusefs.CacheAuto, "exclusive": fusefs.CacheExclusive, "off": fusefs.CacheOff} {
		c, err := parseArgs([]string{"-o", "cache=" + v + ",entry_timeout=2", "b", "m"})
		if err != nil || c.fs.Cache != want || c.fs.EntryTimeout != 2*time.Second {
			t.Errorf("-o cache=%s: %v, entry %v, %v", v, c.fs.Cache, c.fs.EntryTimeout, err)
		}
	}
	for _, bad := range []string{"cache", "cache=", "cache=on", "cache=AUTO"} {
		var ue *usageError
		if _, err := parseArgs([]string{"-o", bad, "b", "m"}); !errors.As(err, &ue) {
			t.Errorf("-o %s: %v, want a usage error", bad, err)
		}
	}
}

// TestDoctorArgs: doctor takes -o cache=MODE, the mount's --vendor,
// --passthrough and --engine (parsed by the same table), --json and one
// directory; anything else is exit status 2.
func TestDoctorArgs(t *testing.T) {
	o, err := doctorArgs([]string{"-o", "cache=exclusive", "--vendor", "nvidia", "--passthrough=on", "--engine", "io_uring", "--json", "/data"})
	if err != nil || o.mode != fusefs.CacheExclusive || o.dir != "/data" || o.c.vendor != "nvidia" ||
		o.c.fs.Passthrough != fusefs.PassthroughOn || o.c.engine != "io_uring" || !o.json {
		t.Errorf("doctorArgs = %+v, %v", o, err)
	}
	if o, err := doctorArgs(nil); err != nil || o.mode != fusefs.CacheAuto || o.dir != "" || o.c.vendor != "auto" || o.json {
		t.Errorf("doctorArgs() = %+v, %v", o, err)
	}
	for _, bad := range [][]string{{"-o", "cache=sometimes"}, {"-o", "ro"}, {"--frob"}, {"a", "b"}, {"--vendor", "amd"}, {"--vendor"}, {"--passthrough", "maybe"}} {
		if _, err := doctorArgs(bad); err == nil {
			t.Errorf("doctorArgs(%q) accepted", bad)
		}
	}
	if code := doctor(newLogger(logrus.PanicLevel, "text", os.Stderr), []string{"-o", "cache=bogus"}); code != 2 {
		t.Errorf("doctor with a bad option: exit %d, want 2", code)
	}
}

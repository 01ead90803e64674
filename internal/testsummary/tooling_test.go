package main

// The test commands themselves: `make test` installs its packages, runs the
// tiers through testsummary and ends with the skip check (strict on CI);
// scripts/deps.sh installs a C compiler when the race detector could not
// build with what is there.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const repo = "../.."

// makeDryRun runs `make -n ARGS` in the repository root, outside any make
// that runs these tests.
func makeDryRun(t *testing.T, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make: %v", err)
	}
	cmd := exec.Command("make", append([]string{"-n", "--no-print-directory"}, args...)...)
	cmd.Dir = repo
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "MAKEFLAGS" && k != "MFLAGS" && k != "MAKELEVEL" && k != "STRICT" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestMakeTest: deps first, every tier through testsummary (unit with
// -race), then the skip check; STRICT=1 (CI) makes it strict.
func TestMakeTest(t *testing.T) {
	out := makeDryRun(t, "test")
	deps := strings.Index(out, "bash scripts/deps.sh")
	vet := strings.Index(out, "go vet")
	if deps < 0 || vet < 0 || deps > vet {
		t.Errorf("make test does not install its packages (scripts/deps.sh) before the tests:\n%s", out)
	}
	for _, want := range []string{
		"cgo=1 race=-race", "$race -count=1 -json", "go -tier unit -out bin/test-skips/unit.jsonl",
		"-json ./integration/... 2>&1 | bin/testsummary go -tier integration -out bin/test-skips/integration.jsonl",
		"unittest discover -v -s tests 2>&1 |", "python -tier python -out",
		"bash module/test/run-vm.sh", "go -q -tier module -out bin/test-skips/module.jsonl",
		"bin/testsummary check  bin/test-skips/unit.jsonl bin/test-skips/integration.jsonl bin/test-skips/python.jsonl bin/test-skips/module.jsonl",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("make -n test lacks %q:\n%s", want, out)
		}
	}
	if strict := makeDryRun(t, "test", "STRICT=1"); !strings.Contains(strict, "bin/testsummary check -strict bin/test-skips/unit.jsonl") {
		t.Errorf("make test STRICT=1 does not check strictly:\n%s", strict)
	}
	ci, err := os.ReadFile(filepath.Join(repo, ".ci/run"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ci), "\nmake test STRICT=1\n") || !strings.Contains(string(ci), "\nbash scripts/deps.sh\n") {
		t.Errorf(".ci/run does not run `make test STRICT=1` after scripts/deps.sh:\n%s", ci)
	}
}

// TestDepsInstallsCompiler runs scripts/deps.sh against stand-ins for the
// tools and apt-get: it installs gcc and libc6-dev when gcc is missing or
// cannot build a program (no libc6-dev), and nothing when all is there.
func TestDepsInstallsCompiler(t *testing.T) {
	script, err := filepath.Abs(filepath.Join(repo, "scripts/deps.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		tools   map[string]string // name -> shell body; "" leaves it out
		uid     string
		install string // the packages apt-get installs, "" for no apt-get call
		fail    bool
	}{
		{"everything there", map[string]string{"gcc": "exit 0"}, "0", "", false},
		{"gcc that cannot build", map[string]string{"gcc": "echo 'fatal error: stdio.h: No such file or directory' >&2; exit 1"}, "0", "gcc libc6-dev", false},
		{"no gcc", map[string]string{"gcc": ""}, "0", "gcc libc6-dev", false},
		{"no gcc, no attr", map[string]string{"gcc": "", "setfattr": ""}, "0", "attr gcc libc6-dev", false},
		{"not root", map[string]string{"gcc": ""}, "1000", "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			bin := filepath.Join(dir, "bin")
			log := filepath.Join(dir, "apt.log")
			tools := map[string]string{
				"getfattr": "exit 0", "setfattr": "exit 0", "flock": "exit 0", "mountpoint": "exit 0", "python3": "exit 0",
				"curl": "exit 0", "fusermount3": "exit 0", "dpkg": "exit 0", "systemd-analyze": "exit 0", "dkms": "exit 0",
				"id":      "echo " + c.uid,
				"apt-get": `echo "$*" >>` + log,
			}
			for k, v := range c.tools {
				tools[k] = v
			}
			if err := os.Mkdir(bin, 0755); err != nil {
				t.Fatal(err)
			}
			for name, body := range tools {
				if body != "" {
					if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body+"\n"), 0755); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, real := range []string{"mktemp", "rm", "sh"} {
				p, err := exec.LookPath(real)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(p, filepath.Join(bin, real)); err != nil {
					t.Fatal(err)
				}
			}
			bash, err := exec.LookPath("bash")
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bash, script)
			cmd.Env = []string{"PATH=" + bin, "TMPDIR=" + dir}
			out, err := cmd.CombinedOutput()
			if (err != nil) != c.fail {
				t.Fatalf("deps.sh: %v, want failure %v\n%s", err, c.fail, out)
			}
			calls, _ := os.ReadFile(log)
			if c.install == "" {
				if len(calls) != 0 {
					t.Errorf("apt-get ran:\n%s", calls)
				}
				return
			}
			if !strings.Contains(string(calls), "install -y -qq --no-install-recommends "+c.install+"\n") {
				t.Errorf("apt-get calls:\n%s\nwant an install of %s (output: %s)", calls, c.install, out)
			}
		})
	}
}

package main

import (
	"os"
	"strings"
	"testing"

	"github.com/phxmount/phxmount/client"
)

// TestDemoMountsEmulatedDevice: make demo registers emulated device memory,
// so scripts/demo.sh must mount with --vendor emu (with --vendor auto a
// machine with a GPU gets nvidia and the demo's REGISTER fails), must
// check that the mount reports vendor=emu, and installs its packages.
func TestDemoMountsEmulatedDevice(t *testing.T) {
	b, err := os.ReadFile("../../scripts/demo.sh")
	if err != nil {
		t.Fatal(err)
	}
	var mounts []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") {
			continue
		}
		if strings.Contains(line, "--vendor auto") || strings.Contains(line, "--vendor nvidia") {
			t.Errorf("demo.sh picks a vendor other than emu: %s", line)
		}
		if strings.HasPrefix(line, `"$BIN/phxmount"`) && !strings.HasPrefix(line, `"$BIN/phxmount" wait `) {
			mounts = append(mounts, line)
		}
	}
	if len(mounts) != 1 {
		t.Fatalf("demo.sh runs phxmount %d times, want once: %q", len(mounts), mounts)
	}
	// PHXMOUNT_ARGS come after: --vendor emu is the demo's, whatever else is passed.
	if !strings.HasPrefix(mounts[0], `"$BIN/phxmount" --vendor emu `) {
		t.Errorf("demo.sh mounts without --vendor emu first: %s", mounts[0])
	}
	for _, want := range []string{
		"getfattr --absolute-names --only-values -n user.phx.info \"$mnt\" | sed -n 's/^vendor=//p'",
		`[ "$vendor" = emu ] ||`,
		"bash scripts/deps.sh",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("demo.sh lacks %q", want)
		}
	}
}

// TestCheckVendor: the client refuses a mount on anything but the
// emulated device, saying how to mount.
func TestCheckVendor(t *testing.T) {
	if err := checkVendor(client.Info{Vendor: "emu"}); err != nil {
		t.Errorf("emu: %v", err)
	}
	for _, v := range []string{"nvidia", "pcibar", ""} {
		err := checkVendor(client.Info{Vendor: v})
		if err == nil || !strings.Contains(err.Error(), "--vendor emu") {
			t.Errorf("vendor %q: %v", v, err)
		}
	}
}

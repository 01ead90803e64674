// Package packaging holds what `make install` installs besides the
// binary: the systemd units, the udev rule, the sysusers group and the
// DKMS configuration. Its test checks them against the code they describe.
package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/phxmount/phxmount/internal/mounthelper"
)

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestUdevRule: the rule matches the class and the device names the
// module creates, and gives them to the group sysusers.d creates.
func TestUdevRule(t *testing.T) {
	core := read(t, "../module/phxfs-core.c")
	class := regexp.MustCompile(`class_create\("(\w+)"\)`).FindStringSubmatch(core)
	name := regexp.MustCompile(`"(\w+)%d", index`).FindStringSubmatch(core)
	if class == nil || name == nil {
		t.Fatalf("module/phxfs-core.c: no class_create(%q) or device name %q found", "…", "…%d")
	}
	rule := read(t, "udev/70-phxfs.rules")
	m := regexp.MustCompile(`(?m)^SUBSYSTEM=="(\w+)", KERNEL=="([\w\[\]\-*]+)", GROUP="(\w+)", MODE="(0660)"$`).FindStringSubmatch(rule)
	if m == nil {
		t.Fatalf("70-phxfs.rules has no SUBSYSTEM/KERNEL/GROUP/MODE line:\n%s", rule)
	}
	if m[1] != class[1] {
		t.Errorf("rule SUBSYSTEM %q, the module's class %q", m[1], class[1])
	}
	for _, dev := range []string{name[1] + "0", name[1] + "17"} {
		if ok, _ := filepath.Match(m[2], dev); !ok {
			t.Errorf("rule KERNEL %q does not match %s", m[2], dev)
		}
	}
	if ok, _ := filepath.Match(m[2], "phxfs_ctl"); ok {
		t.Errorf("rule KERNEL %q matches more than devices", m[2])
	}
	if !strings.Contains(read(t, "sysusers/phxmount.conf"), "\ng "+m[3]+" -\n") {
		t.Errorf("sysusers/phxmount.conf does not create the group %q", m[3])
	}
}

// TestUnits: the service is Type=notify on the installed binary, reloads
// with SIGHUP, and the mount example mounts the helper's type.
func TestUnits(t *testing.T) {
	svc := read(t, "systemd/phxmount@.service.in")
	for _, want := range []string{"\nType=notify\n", "\nNotifyAccess=main\n", "\nExecStart=@BINDIR@/phxmount $OPTIONS ${BACKING} ${MOUNTPOINT}\n",
		"\nExecReload=/bin/kill -HUP $MAINPID\n", "\nEnvironmentFile=/etc/phxmount/%I.conf\n"} {
		if !strings.Contains(svc, want) {
			t.Errorf("phxmount@.service.in lacks %q", strings.TrimSpace(want))
		}
	}
	conf := read(t, "systemd/phxmount.conf.example")
	for _, v := range []string{"BACKING=", "MOUNTPOINT=", "OPTIONS="} {
		if !strings.Contains(conf, "\n"+v) {
			t.Errorf("phxmount.conf.example sets no %s", v)
		}
	}
	mount := read(t, "systemd/models.mount.example")
	if !strings.Contains(mount, "\nType="+mounthelper.Type+"\n") {
		t.Errorf("models.mount.example does not mount Type=%s", mounthelper.Type)
	}
}

// TestDKMSConf: dkms.conf, read by bash as dkms reads it, builds the
// module's one object with Kbuild, emu where the kernel has no NVIDIA
// driver, nvidia when asked.
func TestDKMSConf(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash to read dkms.conf with")
	}
	obj := regexp.MustCompile(`(?m)^obj-m := (\w+)\.o$`).FindStringSubmatch(read(t, "../module/Makefile"))
	if obj == nil {
		t.Fatal("module/Makefile: no obj-m")
	}
	eval := func(env ...string) string {
		cmd := exec.Command("bash", "-c", `kernelver=0.0.0-none kernel_source_dir=/k dkms_tree=/d; . ./dkms/dkms.conf.in
			echo "$PACKAGE_NAME|$PACKAGE_VERSION|${BUILT_MODULE_NAME[0]}|${MAKE[0]}|$AUTOINSTALL"`)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v: %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	want := "phxfs|@VERSION@|" + obj[1] + "|make -C /k M=/d/phxfs/@VERSION@/build PHXFS_VENDOR=emu modules|yes"
	if got := eval(); got != want {
		t.Errorf("dkms.conf:\n got %s\nwant %s", got, want)
	}
	if got := eval("PHXFS_VENDOR=nvidia"); !strings.Contains(got, "PHXFS_VENDOR=nvidia modules") {
		t.Errorf("PHXFS_VENDOR=nvidia: %s", got)
	}
}

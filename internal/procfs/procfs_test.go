package procfs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestReadStatusOfThisProcess(t *testing.T) {
	st, err := ReadStatus(unix.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	if st.Tgid != os.Getpid() {
		t.Errorf("Tgid %d, want %d", st.Tgid, os.Getpid())
	}
	if os.Geteuid() == 0 && st.CapEff&(1<<21) == 0 {
		t.Logf("root without CAP_SYS_ADMIN in CapEff %#x (a container?)", st.CapEff)
	}
}

func TestSoftLimit(t *testing.T) {
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: 123456, Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	got, err := SoftLimit(os.Getpid(), "Max file size")
	unix.Setrlimit(unix.RLIMIT_FSIZE, &old)
	if err != nil || got != 123456 {
		t.Errorf("Max file size = %d, %v; want 123456", got, err)
	}
	if got, err := SoftLimit(os.Getpid(), "Max no such"); err == nil {
		t.Errorf("an unknown limit gave %d", got)
	}
}

// TestFileSizeLimit: prlimit(2)'s soft limit, "unlimited" as Unlimited,
// and /proc/<pid>/limits where prlimit is refused.
func TestFileSizeLimit(t *testing.T) {
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_FSIZE, &old)
	for _, lim := range []uint64{123456, unix.RLIM_INFINITY} {
		if old.Max != unix.RLIM_INFINITY && lim > old.Max {
			continue // a hard limit below: cannot raise the soft one
		}
		if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: lim, Max: old.Max}); err != nil {
			t.Fatal(err)
		}
		want := lim
		if lim == unix.RLIM_INFINITY {
			want = Unlimited
		}
		if got, err := FileSizeLimit(os.Getpid()); err != nil || got != want {
			t.Errorf("FileSizeLimit = %d, %v; want %d", got, err, want)
		}
	}
	if _, err := FileSizeLimit(1 << 30); err == nil {
		t.Errorf("no such process: no error")
	}

	dir := t.TempDir()
	oldRoot, oldPrlimit := Root, prlimit
	Root, prlimit = dir, func(int, int, *unix.Rlimit, *unix.Rlimit) error { return unix.EPERM }
	defer func() { Root, prlimit = oldRoot, oldPrlimit }()
	os.MkdirAll(filepath.Join(dir, "7"), 0755)
	os.WriteFile(filepath.Join(dir, "7", "limits"), []byte("Limit                     Soft Limit           Hard Limit           Units\nMax file size             4096                 unlimited            bytes\n"), 0644)
	if got, err := FileSizeLimit(7); err != nil || got != 4096 {
		t.Errorf("refused prlimit: FileSizeLimit = %d, %v; want /proc's 4096", got, err)
	}
}

func TestParseFixtures(t *testing.T) {
	dir := t.TempDir()
	old := Root
	Root = dir
	defer func() { Root = old }()
	os.MkdirAll(filepath.Join(dir, "7"), 0755)
	os.WriteFile(filepath.Join(dir, "7", "status"), []byte("Name:\tx\nTgid:\t5\nUid:\t1000\t0\t0\t0\nGroups:\t4 24 1000 \nCapEff:\t0000000000000010\n"), 0644)
	os.WriteFile(filepath.Join(dir, "7", "limits"), []byte("Limit                     Soft Limit           Hard Limit           Units\nMax file size             unlimited            unlimited            bytes\nMax files                 9                    9\n"), 0644)
	st, err := ReadStatus(7)
	if err != nil || st.Tgid != 5 || len(st.Groups) != 3 || st.Groups[2] != 1000 || st.CapEff != 1<<4 || st.EUID != 0 {
		t.Errorf("ReadStatus = %+v, %v", st, err)
	}
	if n, err := SoftLimit(7, "Max file size"); err != nil || n != Unlimited {
		t.Errorf("unlimited = %d, %v", n, err)
	}
	if _, err := SoftLimit(7, "Max file"); err == nil {
		t.Errorf("a name that is a prefix of another matched")
	}
	os.WriteFile(filepath.Join(dir, "7", "status"), []byte("Tgid:\t5\n"), 0644)
	if _, err := ReadStatus(7); err == nil {
		t.Errorf("a status without CapEff was accepted")
	}
}

func TestParseMountinfo(t *testing.T) {
	m, ok := parseMountinfo(`36 25 0:32 / /mnt/a\040b rw,nosuid shared:1 master:2 - fuse.phxmount /data/x\134y rw,user_id=0`)
	if !ok || m.ID != 36 || m.Dev != unix.Mkdev(0, 32) || m.MountPoint != "/mnt/a b" || m.FSType != "fuse.phxmount" || m.Source != `/data/x\y` {
		t.Errorf("%+v %v", m, ok)
	}
	if _, ok := parseMountinfo("36 25 0:32 / /mnt"); ok {
		t.Errorf("a line without the separator parsed")
	}
	ms, err := Mounts()
	if err != nil || len(ms) == 0 {
		t.Fatalf("Mounts: %d, %v", len(ms), err)
	}
	if root, ok := MountAt("/"); !ok || root.FSType == "" {
		t.Errorf("MountAt(/) = %+v, %v", root, ok)
	}
}

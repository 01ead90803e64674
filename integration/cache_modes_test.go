package integration

// The cache modes as a user sees them: reported by INFO (the cache field
// and the network flag) and user.phx.info, the classic path's kept pages
// and readahead, and a backing directory on a file system other machines
// share (here another FUSE mount, which cache=auto treats like NFS).

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
)

// cacheModes: each -o cache mode, the class INFO reports for a local
// backing directory, and its entry timeout in user.phx.info.
var cacheModes = []struct {
	mode  string
	class client.CacheClass
	entry string
}{
	{"auto", client.CacheWatch, "3600"},
	{"exclusive", client.CacheExclusive, "86400"},
	{"off", client.CacheOff, "1"},
}

// TestCacheModesReported: each -o cache mode on a local backing
// directory is reported by INFO on a file (cache field, no network flag)
// and by user.phx.info, with its timeouts.
func TestCacheModesReported(t *testing.T) {
	for _, tc := range cacheModes {
		t.Run(tc.mode, func(t *testing.T) {
			d := startDaemon(t, withArgs("-o", "cache="+tc.mode))
			must(t, os.WriteFile(filepath.Join(d.Backing, "f"), []byte("x"), 0644))
			info, err := openClient(t, filepath.Join(d.Mnt, "f"), unix.O_RDONLY).Info()
			if err != nil || info.Cache != tc.class || info.NetworkBacking() {
				t.Errorf("INFO: cache %s, network %v, %v; want %s, false", info.Cache, info.NetworkBacking(), err, tc.class)
			}
			m := phxInfo(t, filepath.Join(d.Mnt, "f"))
			if m["cache"] != tc.class.String() || m["cache_mode"] != tc.mode || m["cache_network"] != "false" ||
				m["entry_timeout"] != tc.entry || m["cache_fs"] == "" || m["cache_why"] == "" {
				t.Errorf("user.phx.info: cache=%q cache_mode=%q cache_network=%q entry_timeout=%q cache_fs=%q cache_why=%q",
					m["cache"], m["cache_mode"], m["cache_network"], m["entry_timeout"], m["cache_fs"], m["cache_why"])
			}
			if want := map[string]string{"auto": "active", "exclusive": "off", "off": "off"}[tc.mode]; m["watch"] != want {
				t.Errorf("user.phx.info watch=%q, want %q", m["watch"], want)
			}
			if !strings.Contains(d.Stderr(), "cache="+tc.mode+" on ") {
				t.Errorf("the log does not say cache=%s:\n%s", tc.mode, d.Stderr())
			}
		})
	}
}

// residentPages counts the pages of an open file in its page cache.
func residentPages(t *testing.T, f *os.File) uint64 {
	t.Helper()
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &cs, 0); err != nil {
		t.Fatalf("cachestat: %v", err)
	}
	return cs.Cache
}

// TestClassicPathKeepsPages: on the classic path, cache=auto opens files
// with FOPEN_KEEP_CACHE while the backing file is unchanged, so what one
// open read stays cached for the next; cache=off drops it at every open
// (as before there were cache modes). The mount's readahead is 4 MiB.
func TestClassicPathKeepsPages(t *testing.T) {
	for mode, keep := range map[string]bool{"auto": true, "off": false} {
		t.Run(mode, func(t *testing.T) {
			// Written before the mount: an event of the write, arriving
			// after the first read, would rightly drop what it cached.
			backing := t.TempDir()
			os.Chmod(backing, 0755)
			data := pattern(1<<20, 3)
			must(t, os.WriteFile(filepath.Join(backing, "f"), data, 0644))
			d := startDaemon(t, withBacking(backing), withArgs("--passthrough", "off", "-o", "cache="+mode))
			p := filepath.Join(d.Mnt, "f")
			mustEqualFile(t, p, data)
			f, err := os.Open(p)
			must(t, err)
			defer f.Close()
			if n := residentPages(t, f); (n == 256) != keep {
				t.Errorf("cache=%s: %d of 256 pages cached after a reopen", mode, n)
			}
			st := statOf(t, d.Mnt)
			ra, err := os.ReadFile(fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev)))
			if kb, _ := strconv.Atoi(strings.TrimSpace(string(ra))); err != nil || kb != 4096 {
				t.Errorf("the mount's read_ahead_kb is %q (%v), want 4096", ra, err)
			}
		})
	}
}

// TestNetworkBackingRevalidates: a backing directory on a file system that
// other machines may change (another FUSE mount here, as NFS, CephFS or
// Lustre would be) gets cache=revalidate: said in the log, INFO and
// user.phx.info; and a change made under that file system shows through
// the mount within twice the 1 s timeout (the README's bound).
func TestNetworkBackingRevalidates(t *testing.T) {
	lower := startDaemon(t, withArgs("-o", "allow_other"))
	d := startDaemon(t, withBacking(lower.Mnt))
	if !strings.Contains(d.Stderr(), "fuse is shared with other machines") {
		t.Errorf("the log does not say the backing is shared:\n%s", d.Stderr())
	}
	server, mnt := lower.Backing, d.Mnt
	must(t, os.WriteFile(filepath.Join(server, "f"), []byte("one"), 0644))
	info, err := openClient(t, filepath.Join(mnt, "f"), unix.O_RDONLY).Info()
	if err != nil || info.Cache != client.CacheRevalidate || !info.NetworkBacking() {
		t.Errorf("INFO: cache %s, network %v, %v; want revalidate, true", info.Cache, info.NetworkBacking(), err)
	}
	if m := phxInfo(t, filepath.Join(mnt, "f")); m["cache"] != "revalidate" || m["cache_fs"] != "fuse" || m["cache_network"] != "true" || m["entry_timeout"] != "1" {
		t.Errorf("user.phx.info: cache=%q cache_fs=%q cache_network=%q entry_timeout=%q", m["cache"], m["cache_fs"], m["cache_network"], m["entry_timeout"])
	}
	for _, c := range backingChanges(t) {
		t.Run(strings.ReplaceAll(c.name, " ", "-"), func(t *testing.T) {
			bd, md := c.prepare(t, server, mnt)
			c.change(bd)
			for _, n := range c.names {
				networkEventually(t, c.name+" "+n, func() string { return sameAsBacking(bd, md, n) })
			}
		})
	}
}

// TestBackingChmodThroughTheMount: a chmod 0600 of a file made on the
// backing side is enforced at the next open through the mount in every
// cache mode (the open runs as the caller against the backing file); a
// chmod 0700 of the directory above it is enforced through a cache=auto
// mount within watchBound, and not through a cache=exclusive one, where
// the kernel checks the search permission of the path against attributes
// it keeps for 86400 s: the security consequence the README's caching
// table and doctor state.
func TestBackingChmodThroughTheMount(t *testing.T) {
	for _, mode := range []string{"auto", "exclusive"} {
		t.Run(mode, func(t *testing.T) {
			d := startDaemon(t, withArgs("-o", "allow_other,cache="+mode))
			must(t, os.Mkdir(d.Backing+"/dir", 0755))
			must(t, os.WriteFile(d.Backing+"/dir/below", []byte("below"), 0644))
			must(t, os.WriteFile(d.Backing+"/secret", []byte("secret"), 0644))
			read := func(name string) (string, error) { return asNobody("cat " + d.Mnt + "/" + name) }
			for _, name := range []string{"secret", "dir/below"} {
				if out, err := read(name); err != nil || out != filepath.Base(name) {
					t.Fatalf("nobody reads a 0644 file %s: %q, %v", name, out, err)
				}
			}
			must(t, os.Chmod(d.Backing+"/secret", 0600))
			if out, err := read("secret"); err == nil || !strings.Contains(out, "Permission denied") {
				t.Errorf("cache=%s: nobody still reads a file made 0600 on the backing side: %q, %v", mode, out, err)
			}
			must(t, os.Chmod(d.Backing+"/dir", 0700))
			if mode == "auto" {
				eventually(t, "chmod 0700 of the directory on the backing side", func() string {
					if out, err := read("dir/below"); err == nil || !strings.Contains(out, "Permission denied") {
						return fmt.Sprintf("nobody still reads below it: %q, %v", out, err)
					}
					return ""
				})
				return
			}
			time.Sleep(200 * time.Millisecond) // far more than a watched mount takes
			if out, err := read("dir/below"); err != nil || out != "below" {
				t.Errorf("cache=exclusive enforced the backing-side chmod of the directory (%q, %v): the README and doctor say it does not", out, err)
			}
		})
	}
}

// TestDoctorCacheFindings: doctor -o cache=exclusive reports the stale
// permissions as a failed (not required) check, in text and in --json;
// cache=auto passes it, and doctor says how mounts below BACKING are
// noticed and what unmounting one takes.
func TestDoctorCacheFindings(t *testing.T) {
	bin := phxmountBin(t)
	dir := t.TempDir()
	out, err := exec.Command(bin, "doctor", "-o", "cache=exclusive", dir).Output()
	if err != nil && exitCode(err) != 1 {
		t.Fatalf("doctor: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^no +permission changes +security: a permission change made on the backing side to a directory .* not enforced through the mount for up to 86400s for the paths through it.*checked at every open`).Match(out) {
		t.Errorf("doctor -o cache=exclusive does not state the security consequence:\n%s", out)
	}
	out, _ = exec.Command(bin, "doctor", "--json", "-o", "cache=exclusive", dir).Output()
	var r struct {
		Findings []struct {
			What, Detail string
			OK, Required bool
		}
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	found := false
	for _, f := range r.Findings {
		if f.What == "permission changes" {
			found = true
			if f.OK || f.Required || !strings.HasPrefix(f.Detail, "security: ") {
				t.Errorf("doctor --json: %+v", f)
			}
		}
	}
	if !found {
		t.Errorf("doctor --json has no permission changes finding:\n%s", out)
	}
	out, _ = exec.Command(bin, "doctor", "-o", "cache=auto", dir).Output()
	// What TestBackingChmodThroughTheMount and TestOpenJudgedByTheBackingFile
	// check: a file's change at its next open, a directory's by the watch.
	if !regexp.MustCompile(`(?m)^ok +permission changes +a chmod, chown or ACL change of a file on the backing side is enforced at its next open .*of a directory, for the paths through it, as soon as its fanotify event is applied`).Match(out) {
		t.Errorf("doctor -o cache=auto does not say when a permission change is enforced:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^-> +mounts below BACKING +noticed by polling /proc/self/mountinfo.*umount -l`).Match(out) {
		t.Errorf("doctor does not say how mounts below BACKING are noticed:\n%s", out)
	}
}

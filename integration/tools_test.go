package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestUnmodifiedTools drives the mount with coreutils, tar and find, with
// passthrough and on the classic path, and compares the whole tree with the
// backing directory after every step.
func TestUnmodifiedTools(t *testing.T) {
	for _, mode := range []string{"auto", "off"} {
		t.Run("passthrough="+mode, func(t *testing.T) {
			d := startDaemon(t, withArgs("--passthrough", mode))
			backing, mnt := d.Backing, d.Mnt
			if mode == "auto" && !strings.Contains(d.Stderr(), "passthrough active") {
				t.Logf("note: passthrough not active here: %s", d.Stderr())
			}
			if mode == "off" && !strings.Contains(d.Stderr(), "passthrough inactive") {
				t.Errorf("--passthrough off: the mount log does not say passthrough inactive:\n%s", d.Stderr())
			}
			src := t.TempDir()
			data := pattern(3<<20+123, 1)
			if err := os.WriteFile(filepath.Join(src, "data.bin"), data, 0644); err != nil {
				t.Fatal(err)
			}
			sh := func(script string) string {
				t.Helper()
				cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
				cmd.Env = append(os.Environ(), "M="+mnt, "B="+backing, "S="+src, "LC_ALL=C")
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("%s\n%v\n%s", script, err, out)
				}
				return string(out)
			}
			sh(`cp "$S/data.bin" "$M/copy.bin"`)
			mustEqualFile(t, filepath.Join(backing, "copy.bin"), data)
			if got := sh(`cat "$M/copy.bin" | sha256sum`); got != sh(`sha256sum < "$S/data.bin"`) {
				t.Fatalf("cat through the mount: sha256 %s", got)
			}
			sh(`dd if="$S/data.bin" of="$M/dd.bin" bs=64k status=none`)
			sh(`dd if="$M/dd.bin" of="$S/dd-direct.bin" bs=1M iflag=direct status=none`)
			mustEqualFile(t, filepath.Join(src, "dd-direct.bin"), data)
			sh(`dd if="$S/data.bin" of="$M/dd-odirect.bin" bs=1M oflag=direct status=none 2>/dev/null || dd if="$S/data.bin" of="$M/dd-odirect.bin" bs=1M count=3 oflag=direct status=none`)
			if got, want := sh(`sha256sum < "$M/copy.bin"`), sh(`sha256sum < "$B/copy.bin"`); got != want {
				t.Fatalf("sha256sum: mount %s backing %s", got, want)
			}
			sh(`mkdir -p "$M/tree/a/b" && for i in 1 2 3; do echo "file $i" > "$M/tree/a/f$i"; done && echo deep > "$M/tree/a/b/deep"`)
			sh(`ln -s a/f1 "$M/tree/link" && ln "$M/tree/a/f2" "$M/tree/hard"`)
			sh(`chmod 0640 "$M/tree/a/f3" && chmod 0711 "$M/tree/a/b"`)
			sh(`touch -d "2001-02-03 04:05:06.789" "$M/tree/a/f1" && touch -h -d "2002-01-01 00:00:00" "$M/tree/link"`)
			sh(`truncate -s 1000000 "$M/tree/a/sparse" && truncate -s 7 "$M/dd.bin"`)
			sh(`mv "$M/tree/a/f1" "$M/tree/moved" && mv "$M/tree/a/b" "$M/tree/b2"`)
			sh(`cd "$M" && tar -cf "$S/t.tar" tree && mkdir "$M/x" && tar -C "$M/x" -xpf "$S/t.tar"`)
			sh(`cd "$S" && mkdir -p ref && tar -C ref -xpf t.tar && diff -r --no-dereference ref/tree "$M/x/tree"`)
			if got, want := sh(`cd "$M" && find . | sort`), sh(`cd "$B" && find . | sort`); got != want {
				t.Fatalf("find differs:\n%s\n---\n%s", got, want)
			}
			if got, want := sh(`cd "$M" && stat -c '%n %i %s %a %h %u %g %Y %F' $(find . | sort)`),
				sh(`cd "$B" && stat -c '%n %i %s %a %h %u %g %Y %F' $(find . | sort)`); got != want {
				t.Fatalf("stat differs:\n%s\n---\n%s", got, want)
			}
			if n := compareTrees(t, backing, mnt); n < 20 {
				t.Fatalf("compared only %d entries", n)
			}
		})
	}
}

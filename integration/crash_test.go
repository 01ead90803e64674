package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestKilledMidWrite: the daemon dies by SIGKILL while a writer is busy.
// Everything the writer had fsync'd is intact on the backing file, and after
// `umount -l` the same backing directory mounts again and reads the same.
func TestKilledMidWrite(t *testing.T) {
	for _, mode := range []string{"auto", "off"} {
		t.Run("passthrough="+mode, func(t *testing.T) {
			d := startDaemon(t, withArgs("--passthrough", mode))
			p := filepath.Join(d.Mnt, "victim")
			const acked = 8 << 20
			data := pattern(acked, 9)
			f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0644)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write(data); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			// Keep writing past the acknowledged part while the daemon dies.
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				junk := pattern(1<<20, 10)
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := f.Write(junk); err != nil {
						return
					}
				}
			}()
			time.Sleep(100 * time.Millisecond)
			if err := d.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			d.WaitExit(10 * time.Second)
			close(stop)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Log("writer still blocked 10 s after the kill (its descriptor belongs to a dead connection)")
			}
			f.Close()
			got, err := os.ReadFile(filepath.Join(d.Backing, "victim"))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) < acked || !bytes.Equal(got[:acked], data) {
				t.Fatalf("backing file has %d bytes; the %d fsync'd bytes are not intact", len(got), acked)
			}
			if out, err := exec.Command("umount", "-l", d.Mnt).CombinedOutput(); err != nil {
				t.Fatalf("umount -l: %v %s", err, out)
			}
			d2 := startDaemon(t, withBacking(d.Backing), withMountpoint(d.Mnt), withArgs("--passthrough", mode))
			got2, err := os.ReadFile(filepath.Join(d2.Mnt, "victim"))
			if err != nil {
				t.Fatalf("read after remount: %v", err)
			}
			if !bytes.Equal(got2, got) {
				t.Fatalf("after remount the file reads %d bytes unlike the backing file's %d", len(got2), len(got))
			}
			compareTrees(t, d2.Backing, d2.Mnt)
		})
	}
}

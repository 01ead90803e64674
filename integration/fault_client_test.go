package integration

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"phxmount/client"
)

// TestFaultClientKilledMidBatch: a client killed (SIGKILL) while its
// batches run has its buffers released; another client keeps being served
// the whole time, byte-exact. The client's file stays open in a process it
// started, so the release comes from the death of the registering process,
// not from the close of its file.
func TestFaultClientKilledMidBatch(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu"))
	data := writePattern(t, filepath.Join(d.Backing, "f"), 8<<20, 0644)
	mf := filepath.Join(d.Mnt, "f")
	f := openClient(t, mf, unix.O_RDONLY)
	m := emuBuffer(t, 0, 4<<20)
	b := register(t, f, m)

	c := startChild(t, nil, "busy", mf)
	keeper, _ := strconv.Atoi(c.expect(t, "KEEPER"))
	if keeper > 0 {
		t.Cleanup(func() { syscall.Kill(keeper, syscall.SIGKILL) })
	}
	ids := strings.Fields(c.expect(t, "IDS"))
	c.expect(t, "BUSY")
	if got := infoCounter(t, d.Mnt, "buffers_live"); got != 3 {
		t.Fatalf("buffers_live = %d with the busy client, want 3", got)
	}

	// Our own reads run across the kill.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var served atomic.Int64
	var bad atomic.Value
	wg.Add(1)
	defer func() { stop.Store(true); wg.Wait() }() // before the buffer is unmapped
	go func() {
		defer wg.Done()
		for i := int64(0); !stop.Load(); i++ {
			off := (i * 65536) % (4 << 20)
			n, err := f.Read(b, off, 65536, off+(1<<20))
			if err != nil || n != 65536 || !bytes.Equal(m.Bytes()[off:off+65536], data[off+(1<<20):off+(1<<20)+65536]) {
				bad.Store(errors.Join(err, errors.New("short or wrong bytes")))
				return
			}
			served.Add(1)
		}
	}()
	time.Sleep(100 * time.Millisecond)
	c.cmd.Process.Signal(syscall.SIGKILL)
	c.cmd.Wait()
	if !waitFor(10*time.Second, func() bool { return infoCounter(t, d.Mnt, "released_death") == 2 }) {
		t.Fatalf("the killed client's buffers %v were not released: %v", ids, phxInfo(t, d.Mnt))
	}
	before := served.Load()
	time.Sleep(100 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Fatalf("the surviving client was not served correctly: %v", v)
	}
	if served.Load() <= before {
		t.Fatalf("the surviving client stopped being served after the kill")
	}
	if got := infoCounter(t, d.Mnt, "buffers_live"); got != 1 {
		t.Fatalf("buffers_live = %d after the kill, want 1", got)
	}
	if got := infoCounter(t, d.Mnt, "released_close"); got != 0 {
		t.Errorf("released_close = %d: the keeper still holds the file", got)
	}
	if d.Stderr() == "" || !strings.Contains(d.Stderr(), "died") {
		t.Errorf("the daemon did not log the release")
	}
}

type extentErr struct{ errno unix.Errno }

func (e extentErr) Error() string { return "extents failed with " + unix.ErrnoName(e.errno) }

// TestFaultUnmountWhileBusy: SIGTERM to the daemon while a client's batches
// run. The daemon exits, nothing stays mounted, and every batch the client
// saw complete carried the right bytes; the rest failed with an errno.
func TestFaultUnmountWhileBusy(t *testing.T) {
	d := startDaemon(t, withArgs("--vendor", "emu"))
	data := writePattern(t, filepath.Join(d.Backing, "f"), 8<<20, 0644)
	f, err := client.Open(filepath.Join(d.Mnt, "f"))
	if err != nil {
		t.Fatal(err)
	}
	m := emuBuffer(t, 0, 4<<20)
	b := register(t, f, m)
	var ext []client.Extent
	for j := int64(0); j < 256; j++ {
		ext = append(ext, client.Extent{Buffer: b.ID, BufOffset: j << 14, Len: 1 << 14, FileOffset: (255 - j) << 14})
	}
	done := make(chan error, 1)
	var ok atomic.Int64
	go func() {
		for {
			fill(m.Bytes(), 0)
			failed, err := f.ReadBatch(ext)
			if err != nil {
				done <- err
				return
			}
			for j, e := range ext {
				switch {
				case e.Result == e.Len:
					if !bytes.Equal(m.Bytes()[e.BufOffset:e.BufOffset+e.Len], data[e.FileOffset:e.FileOffset+e.Len]) {
						done <- fmt.Errorf("wrong bytes in extent %d", j)
						return
					}
				case e.Result >= 0:
					done <- fmt.Errorf("extent %d: %d of %d bytes", j, e.Result, e.Len)
					return
				}
			}
			if failed != 0 {
				// The daemon released the buffer while shutting down: every
				// failing extent carries an errno.
				done <- extentErr{unix.Errno(-ext[len(ext)-1].Result)}
				return
			}
			ok.Add(1)
		}
	}()
	time.Sleep(200 * time.Millisecond)
	d.Signal(syscall.SIGTERM)
	// The open file keeps the mount busy: the daemon detaches it lazily and
	// later requests fail.
	var got error
	select {
	case got = <-done:
	case <-time.After(20 * time.Second):
		f.Close()
		t.Fatalf("the client's batches neither finished nor failed 20 s after SIGTERM")
	}
	f.Close()
	if ok.Load() == 0 {
		t.Errorf("no batch completed before the unmount")
	}
	var ce *client.Error
	var ee extentErr
	if !errors.As(got, &ce) && !errors.As(got, &ee) {
		t.Fatalf("the client ended with %v, want an errno from the ioctl or its extents", got)
	}
	if code, exited := d.WaitExit(15 * time.Second); !exited {
		t.Fatalf("the daemon did not exit after SIGTERM")
	} else if code != 0 {
		t.Errorf("daemon exit status %d", code)
	}
	if d.Mounted() {
		t.Errorf("%s is still mounted", d.Mnt)
	}
	t.Logf("%d batches completed before the unmount; the client then got %v", ok.Load(), got)
}

package integration

// Helpers of the ioctl, xattr and fault tests: pattern files, emulated
// device buffers in the test process, and child processes (the test binary
// re-executed) that act as other clients.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"phxmount/client"
	"phxmount/connector/emu"
)

// writePattern writes a file whose every 8-byte little-endian word holds
// its own offset (the tail shorter than a word is 0xEE).
func writePattern(t testing.TB, path string, size int64, mode os.FileMode) []byte {
	t.Helper()
	b := patternBytes(size)
	if err := os.WriteFile(path, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return b
}

func patternBytes(size int64) []byte {
	b := make([]byte, size)
	for i := int64(0); i < size; i++ {
		b[i] = 0xEE
	}
	for i := int64(0); i+8 <= size; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(i))
	}
	return b
}

// emuDevice is the test process's view of the emulated device.
var emuConn = func() *emu.Connector {
	c, err := emu.New(emu.Config{Devices: 2})
	if err != nil {
		panic(err)
	}
	return c
}()

// emuBuffer allocates device memory on the emulated device dev, filled
// with 0xA5.
func emuBuffer(t testing.TB, dev int, size int64) *emu.Memory {
	t.Helper()
	m, err := emuConn.Alloc(dev, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	mem := m.(*emu.Memory)
	fill(mem.Bytes(), 0xA5)
	return mem
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

func allBytes(b []byte, v byte) bool { return bytes.Count(b, []byte{v}) == len(b) }

// register registers m through f.
func register(t testing.TB, f *client.File, m *emu.Memory) client.Buffer {
	t.Helper()
	h, err := m.Export()
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.Register(client.VendorEmu, m.Device(), h, m.Size())
	if err != nil {
		t.Fatalf("register %d bytes on device %d: %v", m.Size(), m.Device(), err)
	}
	return b
}

func openClient(t testing.TB, path string, flags int) *client.File {
	t.Helper()
	f, err := client.OpenFile(path, flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// phxInfo reads user.phx.info of path into a map.
func phxInfo(t testing.TB, path string) map[string]string {
	t.Helper()
	buf := make([]byte, 8192)
	n, err := unix.Getxattr(path, "user.phx.info", buf)
	if err != nil {
		t.Fatalf("getxattr user.phx.info %s: %v", path, err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(buf[:n]), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = v
		}
	}
	return m
}

func infoCounter(t testing.TB, path, key string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(phxInfo(t, path)[key], 10, 64)
	if err != nil {
		t.Fatalf("user.phx.info %s: %q", key, phxInfo(t, path)[key])
	}
	return v
}

// waitFor polls cond for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// child is the test binary re-executed as another client process: it runs
// TestIoctlHelperChild with PHX_CHILD set to a mode, prints lines on stdout
// and reads commands on stdin.
type child struct {
	cmd   *exec.Cmd
	out   *bufio.Reader
	in    io.WriteCloser
	lines chan string
}

func startChild(t testing.TB, cred *syscall.Credential, mode string, args ...string) *child {
	t.Helper()
	return startChildTest(t, "TestIoctlHelperChild", cred, mode, args...)
}

// startChildTest re-executes the test binary to run test (a helper that
// reads PHX_CHILD and PHX_CHILD_ARGS) as cred (nil: as this process).
func startChildTest(t testing.TB, test string, cred *syscall.Credential, mode string, args ...string) *child {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		// Another user must be able to run the binary: copy it somewhere
		// world-readable.
		dir := t.TempDir()
		os.Chmod(dir, 0755)
		os.Chmod(filepath.Dir(dir), 0755)
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		bin = filepath.Join(dir, "child.test")
		if err := os.WriteFile(bin, b, 0755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PHX_CHILD="+mode, "PHX_CHILD_ARGS="+strings.Join(args, "\x1f"))
	cmd.Dir = "/"
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	stdout, _ := cmd.StdoutPipe()
	stdin, _ := cmd.StdinPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, in: stdin, lines: make(chan string, 100)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return c
}

// expect returns the child's next line that starts with prefix.
func (c *child) expect(t testing.TB, prefix string) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("child exited before printing %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return strings.TrimSpace(strings.TrimPrefix(l, prefix))
			}
		case <-timeout:
			t.Fatalf("child printed no %q in 30 s", prefix)
		}
	}
}

func errnoName(err error) string {
	if err == nil {
		return "OK"
	}
	var e unix.Errno
	if ce, ok := err.(*client.Error); ok {
		e = ce.Errno
	} else if en, ok := err.(unix.Errno); ok {
		e = en
	} else {
		return "ERR(" + err.Error() + ")"
	}
	return unix.ErrnoName(e)
}

// TestIoctlHelperChild is the body of child processes; it skips when run
// normally.
func TestIoctlHelperChild(t *testing.T) {
	mode := os.Getenv("PHX_CHILD")
	if mode == "" {
		t.Skip("helper process for the ioctl/fault tests (runs only when re-executed)")
	}
	args := strings.Split(os.Getenv("PHX_CHILD_ARGS"), "\x1f")
	say := func(format string, a ...any) { fmt.Printf(format+"\n", a...) }
	defer os.Exit(0)
	switch mode {
	case "use": // args: path, buffer id — use another process's buffer
		f, err := client.Open(args[0])
		if err != nil {
			say("OPEN %s", errnoName(err))
			return
		}
		id, _ := strconv.ParseUint(args[1], 10, 64)
		_, err = f.Read(client.Buffer{ID: id}, 0, 4096, 0)
		say("READ %s", errnoName(err))
		ext := []client.Extent{{Buffer: id, Len: 4096}}
		_, err = f.ReadBatch(ext)
		say("BATCH %s %d", errnoName(err), ext[0].Result)
		say("DEREGISTER %s", errnoName(f.DeregisterID(id)))
	case "wronly": // args: path — open write-only, register, try to read
		f, err := client.OpenFile(args[0], unix.O_WRONLY)
		if err != nil {
			say("OPEN %s", errnoName(err))
			return
		}
		conn, _ := emu.New(emu.Config{})
		m, _ := conn.Alloc(0, 1<<20)
		fill(m.(*emu.Memory).Bytes(), 0xA5)
		h, _ := m.Export()
		b, err := f.Register(client.VendorEmu, 0, h, 1<<20)
		if err != nil {
			say("REGISTER %s", errnoName(err))
			return
		}
		_, err = f.Read(b, 0, 4096, 0)
		ext := []client.Extent{{Buffer: b.ID, Len: 4096}}
		_, berr := f.ReadBatch(ext)
		say("READ %s BATCH %s UNTOUCHED %v", errnoName(err), errnoName(berr), allBytes(m.(*emu.Memory).Bytes(), 0xA5))
	case "device": // args: path, device, rounds — load the file onto one device, again and again
		dev, _ := strconv.Atoi(args[1])
		rounds, _ := strconv.Atoi(args[2])
		want, err := os.ReadFile(args[0])
		if err != nil {
			say("READFILE %v", err)
			return
		}
		f, err := client.Open(args[0])
		if err != nil {
			say("OPEN %s", errnoName(err))
			return
		}
		conn, _ := emu.New(emu.Config{Devices: dev + 1})
		size := (int64(len(want)) + 64<<10 - 1) &^ (64<<10 - 1)
		m, err := conn.Alloc(dev, size)
		if err != nil {
			say("ALLOC %v", err)
			return
		}
		h, _ := m.Export()
		b, err := f.Register(client.VendorEmu, dev, h, size)
		if err != nil {
			say("REGISTER %s", errnoName(err))
			return
		}
		mem := m.(*emu.Memory).Bytes()
		for r := 0; r < rounds; r++ {
			fill(mem, 0xA5)
			var ext []client.Extent
			for off := int64(0); off < int64(len(want)); off += 256 << 10 {
				ext = append(ext, client.Extent{Buffer: b.ID, BufOffset: off, Len: min(256<<10, int64(len(want))-off), FileOffset: off})
			}
			if failed, err := f.ReadBatch(ext); err != nil || failed != 0 {
				say("BAD round %d: %d failed, %s", r, failed, errnoName(err))
				return
			}
			if !bytes.Equal(mem[:len(want)], want) {
				say("BAD round %d: bytes differ", r)
				return
			}
		}
		say("OK %d rounds on device %d", rounds, dev)
	case "write": // args: path, "syscall" or "ioctl", offset, length, RLIMIT_FSIZE (-1: none)
		off, _ := strconv.ParseInt(args[2], 10, 64)
		n, _ := strconv.ParseInt(args[3], 10, 64)
		data := bytes.Repeat([]byte{0x5A}, int(n))
		var write func() (int64, error)
		if args[1] == "syscall" {
			write = func() (int64, error) {
				fd, err := unix.Open(args[0], unix.O_WRONLY, 0)
				if err != nil {
					return 0, err
				}
				defer unix.Close(fd)
				m, err := unix.Pwrite(fd, data, off)
				return int64(m), err
			}
		} else {
			var err error
			// The buffer is made before the limit applies: a memfd is a file.
			if write, err = childIoctlWriter(args[0], data, off); err != nil {
				say("SETUP %s", errnoName(err))
				return
			}
		}
		if lim, _ := strconv.ParseInt(args[4], 10, 64); lim >= 0 {
			if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: uint64(lim), Max: uint64(lim)}); err != nil {
				say("SETRLIMIT %v", err)
				return
			}
		}
		// Go ignores SIGXFSZ unless asked: catch it to see whether it came.
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGXFSZ)
		got, err := write()
		if err != nil {
			got = 0
		}
		xfsz := "no"
		if args[4] != "-1" {
			select {
			case <-sig:
				xfsz = "yes"
			case <-time.After(200 * time.Millisecond):
			}
		}
		say("WRITE %s %d SIGXFSZ %s", errnoName(err), got, xfsz)
	case "busy": // args: path — register two buffers and read in a loop until killed
		f, err := client.Open(args[0])
		if err != nil {
			say("OPEN %s", errnoName(err))
			return
		}
		conn, _ := emu.New(emu.Config{})
		var ext []client.Extent
		var ids []string
		for i := 0; i < 2; i++ {
			m, _ := conn.Alloc(0, 4<<20)
			h, _ := m.Export()
			b, err := f.Register(client.VendorEmu, 0, h, 4<<20)
			if err != nil {
				say("REGISTER %s", errnoName(err))
				return
			}
			ids = append(ids, strconv.FormatUint(b.ID, 10))
			for j := int64(0); j < 256; j++ {
				ext = append(ext, client.Extent{Buffer: b.ID, BufOffset: j << 14, Len: 1 << 14, FileOffset: j << 14})
			}
		}
		// Keep the open file alive in another process: the release must
		// then come from this process's death.
		keeper := exec.Command("sleep", "60")
		keeper.ExtraFiles = []*os.File{os.NewFile(uintptr(f.Fd()), "f")}
		if err := keeper.Start(); err != nil {
			say("KEEPER %v", err)
			return
		}
		say("KEEPER %d", keeper.Process.Pid)
		say("IDS %s", strings.Join(ids, " "))
		for n := 0; ; n++ {
			if _, err := f.ReadBatch(ext); err != nil {
				say("BATCHERR %s", errnoName(err))
				time.Sleep(10 * time.Millisecond)
			}
			if n == 2 {
				say("BUSY")
			}
		}
	}
}

// childIoctlWriter prepares an ioctl WRITE of data at off of path from an
// emulated device buffer of this process, and returns it.
func childIoctlWriter(path string, data []byte, off int64) (func() (int64, error), error) {
	f, err := client.OpenFile(path, unix.O_WRONLY)
	if err != nil {
		return nil, err
	}
	conn, _ := emu.New(emu.Config{})
	size := (int64(len(data)) + 64<<10 - 1) &^ (64<<10 - 1)
	m, err := conn.Alloc(0, max(size, 64<<10))
	if err != nil {
		return nil, err
	}
	copy(m.(*emu.Memory).Bytes(), data)
	h, _ := m.Export()
	b, err := f.Register(client.VendorEmu, 0, h, m.Size())
	if err != nil {
		return nil, err
	}
	return func() (int64, error) { return f.Write(b, 0, int64(len(data)), off) }, nil
}

package phxfs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/emu"
)

// setup is one combination the suites run on: an engine and a transport.
type setup struct {
	engine    string
	transport Transport
}

func (s setup) String() string { return s.engine + "/" + string(s.transport) }

// setups lists the engine × transport combinations. PHX_TEST_CONNECTOR
// chooses another connector (the kernel-module VM test runs the suites on
// the real module with "pcibar").
func setups() []setup {
	var out []setup
	for _, e := range []string{"io_uring", "sync"} {
		for _, t := range testTransports() {
			out = append(out, setup{e, t})
		}
	}
	return out
}

// newConnector returns the connector a setup runs on.
var newConnector = func(t testing.TB, s setup, devices int) connector.Connector {
	c, err := emu.New(emu.Config{Devices: devices, Staged: s.transport == Staged})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testTransports lists the transports the connector can be run with.
var testTransports = func() []Transport { return []Transport{Host, Staged} }

// forEach runs fn as a subtest for every setup.
func forEach(t *testing.T, fn func(t *testing.T, s setup)) {
	for _, s := range setups() {
		t.Run(s.String(), func(t *testing.T) { fn(t, s) })
	}
}

func newLib(t testing.TB, s setup, devices int, tweak ...func(*Config)) (*Lib, connector.Connector) {
	c := newConnector(t, s, devices)
	return newLibOn(t, c, s, devices, tweak...), c
}

// emuStaged is an emulated connector of devices staged devices, whatever
// PHX_TEST_CONNECTOR says: for tests of the staged pipeline's own logic.
func emuStaged(t testing.TB, devices int) connector.Connector {
	c, err := emu.New(emu.Config{Devices: devices, Staged: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() }) // after the memory and the library
	return c
}

// newLibOn is newLib on the connector c.
func newLibOn(t testing.TB, c connector.Connector, s setup, devices int, tweak ...func(*Config)) *Lib {
	cfg := Config{Connector: c, Engine: s.engine, Workers: 3, QueueDepth: 64, BounceSize: 256 << 10, SplitSize: 512 << 10}
	if s.transport == Kmod {
		cfg.Transport = Kmod
	}
	for _, f := range tweak {
		f(&cfg)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.EngineName(); got != s.engine {
		t.Fatalf("engine %q, want %q", got, s.engine)
	}
	t.Cleanup(func() {
		if !l.closed {
			l.Close()
		}
	})
	for i := 0; i < devices; i++ {
		if err := l.OpenDevice(i); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

func alloc(t testing.TB, c connector.Connector, dev int, size int64) connector.Memory {
	m, err := c.Alloc(dev, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func register(t testing.TB, l *Lib, m connector.Memory) *Registration {
	r, err := l.RegMem(m.Device(), m.Addr(), m.Size())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// patternFile creates a file of size bytes whose every 8-byte little-endian
// word holds its own offset, on a filesystem that takes O_DIRECT.
func patternFile(t testing.TB, size int64) string {
	dir, err := os.MkdirTemp("/var/tmp", "phxfs-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	name := filepath.Join(dir, "pattern")
	b := make([]byte, size)
	fillPattern(b, 0)
	if err := os.WriteFile(name, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return name
}

func fillPattern(b []byte, off int64) {
	for i := int64(0); i+8 <= int64(len(b)); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(off+i))
	}
}

// checkPattern reports the first byte of b that is not the pattern of the
// file region starting at fileOff.
func checkPattern(t testing.TB, b []byte, fileOff int64) {
	t.Helper()
	if fileOff%8 != 0 {
		t.Fatalf("checkPattern needs an 8-aligned offset, got %d", fileOff)
	}
	want := make([]byte, len(b))
	fillPattern(want, fileOff)
	for i := range b {
		if b[i] != want[i] {
			t.Fatalf("byte %d (file offset %d) is %#x, want %#x", i, fileOff+int64(i), b[i], want[i])
		}
	}
}

func openFile(t testing.TB, name string, flags int) int {
	fd, err := unix.Open(name, flags|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// deviceBytes copies device memory back to the host through the
// connector's copy engine: how bytes are checked on any vendor.
func deviceBytes(t testing.TB, c connector.Connector, m connector.Memory, off, n int64) []byte {
	t.Helper()
	h, err := c.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	s, err := c.NewStream(m.Device())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CopyFromDevice(h.Bytes()[:n], m.Addr()+uint64(off)); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), h.Bytes()[:n]...)
}

// fillDevice writes b into device memory at off through the copy engine.
func fillDevice(t testing.TB, c connector.Connector, m connector.Memory, off int64, b []byte) {
	t.Helper()
	h, err := c.AllocHost(int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	copy(h.Bytes(), b)
	s, err := c.NewStream(m.Device())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CopyToDevice(m.Addr()+uint64(off), h.Bytes()[:len(b)]); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

func wantErrno(t testing.TB, err error, want unix.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("error %v, want %v", err, want)
	}
}

func errnoResult(e unix.Errno) int64 { return -int64(e) }

func describe(reqs []Request) string {
	s := ""
	for i, r := range reqs {
		s += fmt.Sprintf("[%d] len %d result %d; ", i, r.Len, r.Result)
	}
	return s
}

func connectorDevice(t testing.TB, c connector.Connector, i int) connector.DeviceInfo {
	infos, err := c.Devices()
	if err != nil || i >= len(infos) {
		t.Fatalf("device %d: %v", i, err)
	}
	return infos[i]
}

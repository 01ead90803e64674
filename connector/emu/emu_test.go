package emu

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/connector"
)

func newConn(t *testing.T, cfg Config) *Connector {
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// roundTrip copies src to addr and back through s, and says what went
// wrong, if anything: a copy, the wait, or bytes that came back different.
func roundTrip(s connector.Stream, addr uint64, src []byte) error {
	dst := make([]byte, len(src))
	if err := s.CopyToDevice(addr, src); err != nil {
		return fmt.Errorf("copy to the device: %w", err)
	}
	if err := s.CopyFromDevice(dst, addr); err != nil {
		return fmt.Errorf("copy back: %w", err)
	}
	if err := s.Synchronize(); err != nil {
		return fmt.Errorf("synchronize: %w", err)
	}
	if !bytes.Equal(dst, src) {
		return errors.New("copies did not round-trip")
	}
	return nil
}

func TestAllocResolveAndAlignment(t *testing.T) {
	c := newConn(t, Config{Devices: 2})
	m, err := c.Alloc(1, 3*PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Addr()%PageSize != 0 {
		t.Fatalf("address %#x is not 64 KiB aligned", m.Addr())
	}
	if host, err := c.Resolve(1, m.Addr()+PageSize, PageSize); err != nil || host != uintptr(m.Addr()+PageSize) {
		t.Fatalf("resolve: %#x, %v", host, err)
	}
	for _, bad := range []struct {
		dev  int
		addr uint64
		size int64
	}{{0, m.Addr(), 1}, {1, m.Addr() + 2*PageSize, PageSize + 1}, {1, m.Addr() - 1, 1}, {1, 4096, 1}} {
		if _, err := c.Resolve(bad.dev, bad.addr, bad.size); !errors.Is(err, unix.EFAULT) {
			t.Fatalf("resolve %+v: %v, want EFAULT", bad, err)
		}
	}
	if _, err := c.Alloc(2, PageSize); !errors.Is(err, unix.ENODEV) {
		t.Fatalf("alloc on a missing device: %v", err)
	}
	if _, err := c.Alloc(0, 4096); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("unaligned alloc: %v", err)
	}
	m.Close()
	if _, err := c.Resolve(1, m.Addr(), 1); !errors.Is(err, unix.EFAULT) {
		t.Fatalf("resolve after free: %v", err)
	}
}

// In staged mode the CPU cannot touch device memory: an O_DIRECT read into
// it faults, and only the copy engine reaches it.
func TestStagedMemoryIsNotHostAddressable(t *testing.T) {
	c := newConn(t, Config{Staged: true})
	if c.HostAddressable() {
		t.Fatal("staged connector claims host-addressable memory")
	}
	m, err := c.Alloc(0, PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if host, err := c.Resolve(0, m.Addr(), PageSize); err != nil || host != 0 {
		t.Fatalf("resolve: %#x, %v", host, err)
	}
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	view := m.(*Memory).view
	if _, err := unix.Pread(int(f.Fd()), view[:4096], 0); !errors.Is(err, unix.EFAULT) {
		t.Fatalf("read into staged device memory: %v, want EFAULT", err)
	}
	s, err := c.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src := bytes.Repeat([]byte{0xA5, 0x5A}, 2048)
	if err := roundTrip(s, m.Addr()+100, src); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyToDevice(m.Addr()+PageSize-1, src); !errors.Is(err, unix.EFAULT) {
		t.Fatalf("copy past the buffer: %v", err)
	}
}

// TestImportAcrossProcesses: a child process exports a buffer and writes a
// pattern; this process imports it as the child (the pid matches) and reads
// the pattern, and an import claimed by another pid is refused.
func TestImportAcrossProcesses(t *testing.T) {
	if os.Getenv("EMU_TEST_CHILD") == "1" {
		exportChild()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=TestImportAcrossProcesses")
	cmd.Env = append(os.Environ(), "EMU_TEST_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Wait() }()
	line := make([]byte, 2*connector.HandleSize)
	if _, err := readFull(out, line); err != nil {
		t.Fatal(err)
	}
	var h connector.Handle
	if _, err := hex.Decode(h[:], line); err != nil {
		t.Fatal(err)
	}
	c := newConn(t, Config{})
	if _, err := c.Import(0, h, PageSize, os.Getpid()); !errors.Is(err, unix.EPERM) {
		t.Fatalf("import claimed by another process: %v, want EPERM", err)
	}
	if _, err := c.Import(0, h, 4*PageSize, cmd.Process.Pid); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("import larger than the export: %v, want EINVAL", err)
	}
	var bad connector.Handle
	if _, err := c.Import(0, bad, PageSize, cmd.Process.Pid); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("import of a zero handle: %v, want EINVAL", err)
	}
	m, err := c.Import(0, h, 2*PageSize, cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	b := m.(*Memory).Bytes()
	for i := range b {
		if b[i] != byte(i*7) {
			t.Fatalf("byte %d is %d, want %d", i, b[i], byte(i*7))
		}
	}
}

func exportChild() {
	c, _ := New(Config{})
	m, err := c.Alloc(0, 2*PageSize)
	if err != nil {
		os.Exit(3)
	}
	b := m.(*Memory).Bytes()
	for i := range b {
		b[i] = byte(i * 7)
	}
	h, _ := m.Export()
	os.Stdout.WriteString(hex.EncodeToString(h[:]))
	os.Stdin.Read(make([]byte, 1)) // live until the parent is done
	os.Exit(0)
}

func readFull(r interface{ Read([]byte) (int, error) }, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := r.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// TestImportRefusesWhatIsNotAnEmuBuffer: reserved handle bytes that are not
// zero, and a handle naming a descriptor of the caller that is not an emu
// memfd, are invalid handles (EINVAL), not a permission matter.
func TestImportRefusesWhatIsNotAnEmuBuffer(t *testing.T) {
	c := newConn(t, Config{})
	m, err := c.Alloc(0, PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	h, _ := m.Export()
	bad := h
	bad[40] = 1
	if _, err := c.Import(0, bad, PageSize, os.Getpid()); !errors.Is(err, unix.EINVAL) {
		t.Errorf("import of a handle with reserved bytes set: %v, want EINVAL", err)
	}
	f, err := os.CreateTemp(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Truncate(PageSize)
	plain := h
	binary.LittleEndian.PutUint32(plain[12:], uint32(f.Fd()))
	if _, err := c.Import(0, plain, PageSize, os.Getpid()); !errors.Is(err, unix.EINVAL) {
		t.Errorf("import of a handle naming a regular file: %v, want EINVAL", err)
	}
}

// TestImportHoldsNoDescriptor: imported memory is held by its mappings
// alone, so that a client registering one memfd again and again cannot
// use up the daemon's descriptors; the memory still works, and cannot be
// exported again.
func TestImportHoldsNoDescriptor(t *testing.T) {
	c := newConn(t, Config{})
	m, err := c.Alloc(0, PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	h, _ := m.Export()
	open := func() int {
		fds, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(fds)
	}
	before := open()
	var imports []connector.Memory
	for range 8 {
		im, err := c.Import(0, h, PageSize, os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		imports = append(imports, im)
	}
	if after := open(); after != before {
		t.Errorf("8 imports hold %d descriptors", after-before)
	}
	m.(*Memory).Bytes()[7] = 42
	if got := imports[7].(*Memory).Bytes()[7]; got != 42 {
		t.Errorf("imported memory reads %d, want the exporter's 42", got)
	}
	if _, err := imports[0].Export(); !errors.Is(err, unix.EINVAL) {
		t.Errorf("export of imported memory: %v, want EINVAL", err)
	}
	for _, im := range imports {
		if err := im.Close(); err != nil {
			t.Error(err)
		}
	}
}

// Command phxdemo is the client side of `make demo`:
//
//	phxdemo gen  -out FILE [-size-mb N]   write a deterministic safetensors-shaped file
//	phxdemo load -file FILE               through a phxmount mount on the emulated device
//	                                      (phxmount --vendor emu): register an emulated
//	                                      device buffer, load every tensor with one batch
//	                                      of ioctls, verify against a plain read, and print
//	                                      the throughput of both paths
package main

import (
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/emu"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: phxdemo gen -out FILE [-size-mb N] | phxdemo load -file FILE")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "phxdemo:", err)
		os.Exit(1)
	}
}

// run runs the command cmd with its arguments.
func run(cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	switch cmd {
	case "gen":
		out := fs.String("out", "", "file to write")
		mb := fs.Int("size-mb", 256, "approximate size in MiB")
		fs.Parse(args)
		return gen(*out, int64(*mb)<<20)
	case "load":
		file := fs.String("file", "", "safetensors file on a phxmount mount")
		fs.Parse(args)
		return load(*file)
	}
	return fmt.Errorf("unknown command %q", cmd)
}

// checkVendor refuses a mount that is not on the emulated device: the demo
// registers emulated device memory (scripts/demo.sh mounts with --vendor
// emu; with --vendor auto a machine with a GPU would get nvidia).
func checkVendor(info client.Info) error {
	if info.Vendor != "emu" {
		return fmt.Errorf("the mount uses vendor %q: phxdemo loads into emulated device memory, so mount with --vendor emu (as scripts/demo.sh does)", info.Vendor)
	}
	return nil
}

func gbps(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }

// device is the emulated device buffer registered with the mount.
type device struct {
	info client.Info
	m    connector.Memory
	mem  []byte
	buf  client.Buffer
}

// Each path runs `rounds` times; the best round counts (the first one
// also pays for faulting in fresh memory).
const rounds = 3

func load(path string) error {
	if path == "" {
		return errors.New("load: -file is required")
	}
	pf, err := os.Open(path)
	if err != nil {
		return err
	}
	defer pf.Close()
	st, err := parse(pf)
	if err != nil {
		return fmt.Errorf("%s: not a safetensors file: %w", path, err)
	}
	plain, plainT, err := plainRead(pf, st)
	if err != nil {
		return err
	}

	// Path 2: the ioctl path, into an emulated device buffer.
	f, err := client.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	dev, err := registerDevice(f, path, st.dataLen)
	if dev.m != nil {
		defer dev.m.Close()
	}
	if err != nil {
		return err
	}
	ext := st.extents(dev.buf.ID)
	ioctlT, err := batchLoad(f, ext, dev.mem)
	if err != nil {
		return err
	}
	ioctls := (len(ext) + client.BatchClasses[len(client.BatchClasses)-1] - 1) / client.BatchClasses[len(client.BatchClasses)-1]
	if err := verify(st, dev.mem, plain); err != nil {
		return err
	}
	fmt.Printf("plain read through the mount : %8.1f MiB in %7.1f ms = %5.2f GB/s (into host memory, best of %d)\n", float64(len(plain))/(1<<20), plainT.Seconds()*1e3, gbps(int64(len(plain)), plainT), rounds)
	fmt.Printf("ioctl batch load             : %8.1f MiB in %7.1f ms = %5.2f GB/s (%d tensors in %d ioctl(s), into %s device memory, transport %s, best of %d)\n",
		float64(st.dataLen)/(1<<20), ioctlT.Seconds()*1e3, gbps(st.dataLen, ioctlT), len(st.names), ioctls, dev.info.Vendor, dev.buf.Transport, rounds)
	return deregister(f, dev.buf)
}

// plainRead is path 1: a plain read of the file through the mount (what
// any loader does), into host memory.
func plainRead(pf *os.File, st safetensors) ([]byte, time.Duration, error) {
	plain := make([]byte, st.dataStart+st.dataLen)
	var plainT time.Duration
	for r := 0; r < rounds; r++ {
		t0 := time.Now()
		if _, err := pf.ReadAt(plain, 0); err != nil && err != io.EOF {
			return nil, 0, fmt.Errorf("plain read: %w", err)
		}
		if d := time.Since(t0); r == 0 || d < plainT {
			plainT = d
		}
	}
	return plain, plainT, nil
}

// registerDevice allocates an emulated device buffer of dataLen rounded up
// to the mount's page size and registers it. Once dev.m is set the caller
// closes it, error or not.
func registerDevice(f *client.File, path string, dataLen int64) (dev device, err error) {
	if dev.info, err = f.Info(); err != nil {
		return dev, fmt.Errorf("INFO ioctl (is %s on a phxmount mount?): %w", path, err)
	}
	info := dev.info
	if err := checkVendor(info); err != nil {
		return dev, err
	}
	conn, err := emu.New(emu.Config{Staged: info.Transport == client.TransportStaged})
	if err != nil {
		return dev, err
	}
	page := int64(info.PageSize)
	size := (dataLen + page - 1) / page * page
	if dev.m, err = conn.Alloc(0, size); err != nil {
		return dev, err
	}
	dev.mem = dev.m.(*emu.Memory).Bytes()
	h, err := dev.m.Export()
	if err != nil {
		return dev, err
	}
	if dev.buf, err = f.Register(client.VendorEmu, 0, h, size); err != nil {
		return dev, fmt.Errorf("REGISTER: %w", err)
	}
	fmt.Printf("registered a %d MiB %s device buffer: id %d, transport %s (engine %s)\n", size>>20, info.Vendor, dev.buf.ID, dev.buf.Transport, info.Engine)
	return dev, nil
}

// extents loads every tensor to its data offset in buffer id.
func (st safetensors) extents(id uint64) []client.Extent {
	ext := make([]client.Extent, len(st.names))
	for i, n := range st.names {
		t := st.ts[n]
		ext[i] = client.Extent{Buffer: id, BufOffset: t.DataOffsets[0], Len: t.DataOffsets[1] - t.DataOffsets[0], FileOffset: st.dataStart + t.DataOffsets[0]}
	}
	return ext
}

// batchLoad reads ext in one batch `rounds` times, mem filled with 0xA5
// before each so that verify sees what landed.
func batchLoad(f *client.File, ext []client.Extent, mem []byte) (time.Duration, error) {
	var ioctlT time.Duration
	for r := 0; r < rounds; r++ {
		for i := range mem {
			mem[i] = 0xA5
		}
		t0 := time.Now()
		failed, err := f.ReadBatch(ext)
		d := time.Since(t0)
		if err != nil || failed != 0 {
			return 0, fmt.Errorf("batch load: %d of %d tensors failed: %v", failed, len(ext), err)
		}
		if r == 0 || d < ioctlT {
			ioctlT = d
		}
	}
	return ioctlT, nil
}

// verify checks every tensor in the device buffer against the plain read,
// and that nothing landed past the last one.
func verify(st safetensors, mem, plain []byte) error {
	dataStart, dataLen := st.dataStart, st.dataLen
	for i, n := range st.names {
		t := st.ts[n]
		got := mem[t.DataOffsets[0]:t.DataOffsets[1]]
		want := plain[dataStart+t.DataOffsets[0] : dataStart+t.DataOffsets[1]]
		if string(got) != string(want) {
			return fmt.Errorf("tensor %d (%s) differs between the device buffer and the plain read", i, n)
		}
	}
	for _, b := range mem[dataLen:] {
		if b != 0xA5 {
			return errors.New("bytes landed past the last tensor")
		}
	}
	dsum := sha256.Sum256(mem[:dataLen])
	psum := sha256.Sum256(plain[dataStart:])
	fmt.Printf("verified: %d tensors, %d bytes identical (sha256 of tensor data: device %x, plain %x)\n", len(st.names), dataLen, dsum[:8], psum[:8])
	return nil
}

// deregister drops the buffer and prints the daemon's counters after it.
func deregister(f *client.File, buf client.Buffer) error {
	if err := f.Deregister(buf); err != nil {
		return fmt.Errorf("DEREGISTER: %w", err)
	}
	after, err := f.Info()
	if err == nil {
		fmt.Printf("daemon counters: %d buffers live, %d registered, %d ioctl bytes read, %d extents, %d failed\n",
			after.Counters.BuffersLive, after.Counters.BuffersRegistered, after.Counters.IoctlBytesRead, after.Counters.IoctlExtents, after.Counters.IoctlFailedExtents)
	}
	return nil
}

// Command phxbench-ioctl measures the ioctl read path of a phxmount mount
// against the phxfs library called in-process on the backing file, side by
// side in one run: reads of 4 KiB, 64 KiB, 1 MiB and 64 MiB, a batch of
// 1,024 x 16 KiB, and the round trip of one ioctl. Both paths read the same
// page-cached file into emulated device memory with the same engine and
// worker count. It prints a table of ratios (medians of -reps) and writes
// the raw numbers as JSON to -raw.
//
//	phxbench-ioctl -mount MNT [-backing DIR] [-reps 3] [-raw FILE]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/emu"
	"github.com/phxmount/phxmount/internal/procfs"
	"github.com/phxmount/phxmount/phxfs"
)

const (
	fileSize = 256 << 20
	bufSize  = 64 << 20
)

type row struct {
	Name        string    `json:"name"`
	Bytes       int64     `json:"bytes_per_op"`
	Extents     int       `json:"extents_per_op"`
	IoctlNs     []float64 `json:"ioctl_ns_per_op"`
	DirectNs    []float64 `json:"direct_ns_per_op"`
	Ratio       float64   `json:"ratio_ioctl_over_direct_throughput"`
	AddedPerExt float64   `json:"added_ns_per_extent,omitempty"`
}

// bench holds both read paths over the same backing file: the mount's
// ioctls (f, buf) and the in-process library (lib, md, fd).
type bench struct {
	reps   int
	budget time.Duration

	info client.Info
	f    *client.File
	buf  client.Buffer

	lib *phxfs.Lib
	md  connector.Memory
	fd  int

	// closers run in reverse on close, as the defers they replace did.
	closers []func()
}

func (b *bench) onClose(fn func()) { b.closers = append(b.closers, fn) }

func (b *bench) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

func main() {
	mnt := flag.String("mount", "", "phxmount mountpoint")
	backing := flag.String("backing", "", "its backing directory (default: from /proc/self/mountinfo)")
	reps := flag.Int("reps", 3, "repetitions (medians are reported)")
	raw := flag.String("raw", "", "write raw numbers as JSON here")
	budget := flag.Duration("budget", 300*time.Millisecond, "time per measurement")
	flag.Parse()
	if err := run(*mnt, *backing, *reps, *raw, *budget); err != nil {
		fmt.Fprintln(os.Stderr, "phxbench-ioctl:", err)
		os.Exit(1)
	}
}

// backingOf finds the source of a FUSE mount (phxmount's fsname defaults
// to the backing directory).
func backingOf(mnt string) (string, error) {
	if m, ok := procfs.MountAt(mnt); ok {
		return m.Source, nil
	}
	return "", fmt.Errorf("%s is not a mountpoint (give -backing)", mnt)
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// measure runs op until budget is spent and returns ns per op.
func measure(budget time.Duration, op func(i int) error) (float64, error) {
	if err := op(0); err != nil { // warm
		return 0, err
	}
	start := time.Now()
	n := 0
	for time.Since(start) < budget || n < 3 {
		if err := op(n + 1); err != nil {
			return 0, err
		}
		n++
	}
	return float64(time.Since(start).Nanoseconds()) / float64(n), nil
}

// measurePair measures the ioctl op then the library op, reps times each,
// into r.
func (b *bench) measurePair(r *row, ioctl, direct func(i int) error) error {
	for k := 0; k < b.reps; k++ {
		ns, err := measure(b.budget, ioctl)
		if err != nil {
			return err
		}
		r.IoctlNs = append(r.IoctlNs, ns)
		ns, err = measure(b.budget, direct)
		if err != nil {
			return err
		}
		r.DirectNs = append(r.DirectNs, ns)
	}
	return nil
}

func run(mnt, backing string, reps int, raw string, budget time.Duration) error {
	b := &bench{reps: reps, budget: budget}
	defer b.close()
	if err := b.setup(mnt, backing); err != nil {
		return err
	}
	fmt.Printf("ioctl path vs phxfs in-process library: vendor %s, transport %s, engine %s, %d workers, page-cached %d MiB file\n",
		b.info.Vendor, b.info.Transport, b.info.Engine, b.info.Workers, fileSize>>20)
	rows, err := b.sizeRows()
	if err != nil {
		return err
	}
	br, err := b.batchRow()
	if err != nil {
		return err
	}
	rows = append(rows, br)
	rtRead, rtInfo, err := b.roundTrip()
	if err != nil {
		return err
	}
	printTable(rows)
	fmt.Printf("single ioctl round trip: %.1f us (zero-length READ), %.1f us (INFO, 512 bytes each way)\n", median(rtRead)/1e3, median(rtInfo)/1e3)
	fmt.Printf("batch: %.2f us added per extent over the phxfs in-process library (target <= 2 us)\n", br.AddedPerExt/1e3)
	if raw == "" {
		return nil
	}
	return b.writeRaw(raw, rows, rtRead, rtInfo)
}

// setup finds the backing directory, writes the test file there and opens
// both read paths on it, the page cache warm.
func (b *bench) setup(mnt, backing string) error {
	if mnt == "" {
		return fmt.Errorf("-mount is required")
	}
	mnt, _ = filepath.Abs(mnt)
	if backing == "" {
		var err error
		if backing, err = backingOf(mnt); err != nil {
			return err
		}
	}
	name := fmt.Sprintf("phxbench-ioctl-%d.dat", os.Getpid())
	bpath := filepath.Join(backing, name)
	if err := writeTestFile(bpath); err != nil {
		return err
	}
	b.onClose(func() { os.Remove(bpath) })
	conn, err := b.openIoctl(mnt, filepath.Join(mnt, name))
	if err != nil {
		return err
	}
	if err := b.openLibrary(conn, bpath); err != nil {
		return err
	}
	// Warm the page cache for both.
	_, err = b.lib.Read(b.fd, 0, b.md.Addr(), 0, bufSize, 0)
	return err
}

func writeTestFile(path string) error {
	data := make([]byte, fileSize)
	for i := range data {
		data[i] = byte(i*131 + i>>12)
	}
	return os.WriteFile(path, data, 0644)
}

// openIoctl opens the file through the mount and registers an emulated
// device buffer with it; the connector it returns matches the mount's
// transport.
func (b *bench) openIoctl(mnt, path string) (*emu.Connector, error) {
	f, err := client.Open(path)
	if err != nil {
		return nil, err
	}
	b.f = f
	b.onClose(func() { f.Close() })
	if b.info, err = f.Info(); err != nil {
		return nil, fmt.Errorf("INFO: %v (is %s a phxmount mount?)", err, mnt)
	}
	staged := b.info.Transport == client.TransportStaged
	conn, err := emu.New(emu.Config{Staged: staged})
	if err != nil {
		return nil, err
	}
	mi, err := conn.Alloc(0, bufSize)
	if err != nil {
		return nil, err
	}
	b.onClose(func() { mi.Close() })
	h, _ := mi.Export()
	if b.buf, err = f.Register(client.VendorByName(b.info.Vendor), 0, h, bufSize); err != nil {
		return nil, fmt.Errorf("REGISTER: %v", err)
	}
	b.onClose(func() { f.Deregister(b.buf) })
	return conn, nil
}

// openLibrary sets up phxfs in this process with the mount's engine and
// workers, device memory registered, and the backing file open.
func (b *bench) openLibrary(conn *emu.Connector, bpath string) error {
	info := b.info
	lib, err := phxfs.New(phxfs.Config{Connector: conn, Engine: info.Engine, Workers: int(info.Workers), BounceSize: int64(info.BounceSize)})
	if err != nil {
		return err
	}
	b.lib = lib
	b.onClose(func() { lib.Close() })
	if err := lib.OpenDevice(0); err != nil {
		return err
	}
	md, err := conn.Alloc(0, bufSize)
	if err != nil {
		return err
	}
	b.md = md
	b.onClose(func() { md.Close() })
	reg, err := lib.RegMem(0, md.Addr(), bufSize)
	if err != nil {
		return err
	}
	b.onClose(func() { lib.DeregMem(0, reg.Addr(), reg.Size()) })
	fd, err := unix.Open(bpath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	b.fd = fd
	b.onClose(func() { unix.Close(fd) })
	return nil
}

// sizeRows reads single extents of each size through both paths.
func (b *bench) sizeRows() ([]*row, error) {
	var rows []*row
	for _, sz := range []int64{4 << 10, 64 << 10, 1 << 20, 64 << 20} {
		r := &row{Name: sizeName(sz) + " read", Bytes: sz, Extents: 1}
		span := int64(fileSize) - sz
		slots := max(span/sz, 1)
		err := b.measurePair(r, func(i int) error {
			off := (int64(i) % slots) * sz
			n, err := b.f.Read(b.buf, 0, sz, off)
			if err == nil && n != sz {
				err = fmt.Errorf("short ioctl read %d", n)
			}
			return err
		}, func(i int) error {
			off := (int64(i) % slots) * sz
			n, err := b.lib.Read(b.fd, 0, b.md.Addr(), 0, sz, off)
			if err == nil && n != sz {
				err = fmt.Errorf("short in-process library read %d", n)
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// batchRow reads 1,024 x 16 KiB at scattered file offsets, contiguous in
// the buffer, through both paths.
func (b *bench) batchRow() (*row, error) {
	const nb, eb = 1024, 16 << 10
	ext := make([]client.Extent, nb)
	reqs := make([]phxfs.Request, nb)
	for i := range ext {
		fo := int64((i*7919)%(fileSize/eb)) * eb
		ext[i] = client.Extent{Buffer: b.buf.ID, BufOffset: int64(i) * eb, Len: eb, FileOffset: fo}
		reqs[i] = phxfs.Request{Fd: b.fd, Device: 0, DevAddr: b.md.Addr(), BufOffset: int64(i) * eb, Len: eb, FileOffset: fo}
	}
	br := &row{Name: "batch 1024 x 16 KiB", Bytes: nb * eb, Extents: nb}
	err := b.measurePair(br, func(int) error {
		failed, err := b.f.ReadBatch(ext)
		if err == nil && failed != 0 {
			err = fmt.Errorf("%d extents failed", failed)
		}
		return err
	}, func(int) error {
		failed, err := b.lib.ReadBatch(reqs)
		if err == nil && failed != 0 {
			err = fmt.Errorf("%d requests failed", failed)
		}
		return err
	})
	return br, err
}

// roundTrip times one ioctl: a zero-length READ (checked, no I/O) and
// INFO.
func (b *bench) roundTrip() (rtRead, rtInfo []float64, err error) {
	for k := 0; k < b.reps; k++ {
		ns, err := measure(b.budget, func(int) error { _, err := b.f.Read(b.buf, 0, 0, 0); return err })
		if err != nil {
			return nil, nil, err
		}
		rtRead = append(rtRead, ns)
		ns, err = measure(b.budget, func(int) error { _, err := b.f.Info(); return err })
		if err != nil {
			return nil, nil, err
		}
		rtInfo = append(rtInfo, ns)
	}
	return rtRead, rtInfo, nil
}

// printTable prints the rows' medians and fills in their ratios (and added
// time per extent, for batches) for the JSON.
func printTable(rows []*row) {
	fmt.Printf("%-22s %14s %24s %12s %12s\n", "", "ioctl GB/s", "in-process library GB/s", "ratio", "target")
	for _, r := range rows {
		io, d := median(r.IoctlNs), median(r.DirectNs)
		r.Ratio = d / io
		target := ""
		if r.Bytes >= 1<<20 && r.Extents == 1 {
			target = ">= 0.90"
		}
		if r.Extents > 1 {
			r.AddedPerExt = (io - d) / float64(r.Extents)
			target = fmt.Sprintf("+%.2f us/ext", r.AddedPerExt/1e3)
		}
		fmt.Printf("%-22s %14.2f %24.2f %11.2fx %12s\n", r.Name, float64(r.Bytes)/io, float64(r.Bytes)/d, r.Ratio, target)
	}
}

func (b *bench) writeRaw(raw string, rows []*row, rtRead, rtInfo []float64) error {
	info := b.info
	out := map[string]any{
		"vendor": info.Vendor, "transport": info.Transport.String(), "engine": info.Engine, "workers": info.Workers,
		"reps": b.reps, "rows": rows, "round_trip_read_ns": rtRead, "round_trip_info_ns": rtInfo,
	}
	js, _ := json.MarshalIndent(out, "", "  ")
	if err := os.WriteFile(raw, js, 0644); err != nil {
		return err
	}
	fmt.Printf("raw numbers: %s\n", raw)
	return nil
}

func sizeName(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	default:
		return fmt.Sprintf("%d KiB", n>>10)
	}
}

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

	"phxmount/client"
	"phxmount/connector/emu"
	"phxmount/internal/procfs"
	"phxmount/phxfs"
)

const fileSize = 256 << 20

type row struct {
	Name        string    `json:"name"`
	Bytes       int64     `json:"bytes_per_op"`
	Extents     int       `json:"extents_per_op"`
	IoctlNs     []float64 `json:"ioctl_ns_per_op"`
	DirectNs    []float64 `json:"direct_ns_per_op"`
	Ratio       float64   `json:"ratio_ioctl_over_direct_throughput"`
	AddedPerExt float64   `json:"added_ns_per_extent,omitempty"`
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

func run(mnt, backing string, reps int, raw string, budget time.Duration) error {
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
	data := make([]byte, fileSize)
	for i := range data {
		data[i] = byte(i*131 + i>>12)
	}
	if err := os.WriteFile(bpath, data, 0644); err != nil {
		return err
	}
	defer os.Remove(bpath)
	data = nil

	// The ioctl path.
	f, err := client.Open(filepath.Join(mnt, name))
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Info()
	if err != nil {
		return fmt.Errorf("INFO: %v (is %s a phxmount mount?)", err, mnt)
	}
	staged := info.Transport == client.TransportStaged
	conn, err := emu.New(emu.Config{Staged: staged})
	if err != nil {
		return err
	}
	const bufSize = 64 << 20
	mi, err := conn.Alloc(0, bufSize)
	if err != nil {
		return err
	}
	defer mi.Close()
	h, _ := mi.Export()
	buf, err := f.Register(client.VendorByName(info.Vendor), 0, h, bufSize)
	if err != nil {
		return fmt.Errorf("REGISTER: %v", err)
	}
	defer f.Deregister(buf)

	// The in-process library path: phxfs in this process, same engine and
	// workers.
	lib, err := phxfs.New(phxfs.Config{Connector: conn, Engine: info.Engine, Workers: int(info.Workers), BounceSize: int64(info.BounceSize)})
	if err != nil {
		return err
	}
	defer lib.Close()
	if err := lib.OpenDevice(0); err != nil {
		return err
	}
	md, err := conn.Alloc(0, bufSize)
	if err != nil {
		return err
	}
	defer md.Close()
	reg, err := lib.RegMem(0, md.Addr(), bufSize)
	if err != nil {
		return err
	}
	defer lib.DeregMem(0, reg.Addr(), reg.Size())
	fd, err := unix.Open(bpath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// Warm the page cache for both.
	if _, err := lib.Read(fd, 0, md.Addr(), 0, bufSize, 0); err != nil {
		return err
	}

	fmt.Printf("ioctl path vs phxfs in-process library: vendor %s, transport %s, engine %s, %d workers, page-cached %d MiB file\n",
		info.Vendor, info.Transport, info.Engine, info.Workers, fileSize>>20)
	var rows []*row
	for _, sz := range []int64{4 << 10, 64 << 10, 1 << 20, 64 << 20} {
		r := &row{Name: sizeName(sz) + " read", Bytes: sz, Extents: 1}
		span := int64(fileSize) - sz
		slots := max(span/sz, 1)
		for k := 0; k < reps; k++ {
			ns, err := measure(budget, func(i int) error {
				off := (int64(i) % slots) * sz
				n, err := f.Read(buf, 0, sz, off)
				if err == nil && n != sz {
					err = fmt.Errorf("short ioctl read %d", n)
				}
				return err
			})
			if err != nil {
				return err
			}
			r.IoctlNs = append(r.IoctlNs, ns)
			ns, err = measure(budget, func(i int) error {
				off := (int64(i) % slots) * sz
				n, err := lib.Read(fd, 0, md.Addr(), 0, sz, off)
				if err == nil && n != sz {
					err = fmt.Errorf("short in-process library read %d", n)
				}
				return err
			})
			if err != nil {
				return err
			}
			r.DirectNs = append(r.DirectNs, ns)
		}
		rows = append(rows, r)
	}
	// The batch: 1,024 x 16 KiB at scattered file offsets, contiguous in
	// the buffer.
	const nb, eb = 1024, 16 << 10
	ext := make([]client.Extent, nb)
	reqs := make([]phxfs.Request, nb)
	for i := range ext {
		fo := int64((i*7919)%(fileSize/eb)) * eb
		ext[i] = client.Extent{Buffer: buf.ID, BufOffset: int64(i) * eb, Len: eb, FileOffset: fo}
		reqs[i] = phxfs.Request{Fd: fd, Device: 0, DevAddr: md.Addr(), BufOffset: int64(i) * eb, Len: eb, FileOffset: fo}
	}
	br := &row{Name: "batch 1024 x 16 KiB", Bytes: nb * eb, Extents: nb}
	for k := 0; k < reps; k++ {
		ns, err := measure(budget, func(int) error {
			failed, err := f.ReadBatch(ext)
			if err == nil && failed != 0 {
				err = fmt.Errorf("%d extents failed", failed)
			}
			return err
		})
		if err != nil {
			return err
		}
		br.IoctlNs = append(br.IoctlNs, ns)
		ns, err = measure(budget, func(int) error {
			failed, err := lib.ReadBatch(reqs)
			if err == nil && failed != 0 {
				err = fmt.Errorf("%d requests failed", failed)
			}
			return err
		})
		if err != nil {
			return err
		}
		br.DirectNs = append(br.DirectNs, ns)
	}
	rows = append(rows, br)
	// The round trip of one ioctl: a zero-length READ (checked, no I/O)
	// and INFO.
	var rtRead, rtInfo []float64
	for k := 0; k < reps; k++ {
		ns, err := measure(budget, func(int) error { _, err := f.Read(buf, 0, 0, 0); return err })
		if err != nil {
			return err
		}
		rtRead = append(rtRead, ns)
		ns, err = measure(budget, func(int) error { _, err := f.Info(); return err })
		if err != nil {
			return err
		}
		rtInfo = append(rtInfo, ns)
	}

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
	fmt.Printf("single ioctl round trip: %.1f us (zero-length READ), %.1f us (INFO, 512 bytes each way)\n", median(rtRead)/1e3, median(rtInfo)/1e3)
	fmt.Printf("batch: %.2f us added per extent over the phxfs in-process library (target <= 2 us)\n", br.AddedPerExt/1e3)
	if raw != "" {
		out := map[string]any{
			"vendor": info.Vendor, "transport": info.Transport.String(), "engine": info.Engine, "workers": info.Workers,
			"reps": reps, "rows": rows, "round_trip_read_ns": rtRead, "round_trip_info_ns": rtInfo,
		}
		b, _ := json.MarshalIndent(out, "", "  ")
		if err := os.WriteFile(raw, b, 0644); err != nil {
			return err
		}
		fmt.Printf("raw numbers: %s\n", raw)
	}
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

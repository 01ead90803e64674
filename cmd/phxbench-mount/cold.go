package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A cold measurement is only cold if no page of the file is in the guest's
// page cache when it starts, on either path a read through the mount can be
// served from: the FUSE inode's own cache and the backing file's. Each cold
// sample records the pages found resident right before it; a row whose
// sample on either side was not cold prints no ratio.

// unknownResidency marks a sample whose residency could not be checked.
const unknownResidency = -1

// resident counts the pages of path's file in the page cache: cachestat(2)
// (Linux 6.5+), else mincore(2) on a mapping, which faults nothing in.
func resident(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var cs unix.Cachestat_t
	err = unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &cs, 0) // Len 0: to the end
	if err == nil {
		return int64(cs.Cache), nil
	}
	if !errors.Is(err, unix.ENOSYS) {
		return 0, fmt.Errorf("cachestat %s: %w", path, err)
	}
	return mincoreResident(f)
}

func mincoreResident(f *os.File) (int64, error) {
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return 0, err
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("mmap %s: %w", f.Name(), err)
	}
	defer unix.Munmap(m) // a mapped page could not be dropped
	page := int64(os.Getpagesize())
	vec := make([]byte, (st.Size()+page-1)/page)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)),
		uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return 0, fmt.Errorf("mincore %s: %w", f.Name(), e)
	}
	var n int64
	for _, v := range vec {
		n += int64(v & 1)
	}
	return n, nil
}

// residentAll sums the resident pages of the paths, or unknownResidency
// if any could not be checked.
func residentAll(paths []string, count func(string) (int64, error)) int64 {
	var sum int64
	for _, p := range paths {
		n, err := count(p)
		if err != nil {
			fmt.Fprintf(os.Stderr, "phxbench-mount: residency of %s: %v\n", p, err)
			return unknownResidency
		}
		sum += n
	}
	return sum
}

// dropCold drops the guest's caches until none of the paths has a resident
// page (three tries) and returns what was still resident. Every fd the
// benchmark opened on the file is closed by now: nothing maps or pins it.
func dropCold(paths []string) int64 {
	n := int64(unknownResidency)
	for try := 0; try < 3 && n != 0; try++ {
		dropCaches()
		n = residentAll(paths, resident)
	}
	return n
}

// coldVerdict says whether a cold row's ratio may be printed: only if every
// sample on both sides started with no page resident. Otherwise it returns
// what to print instead of the ratio.
func (r *row) coldVerdict() (bool, string) {
	var worst int64
	where := ""
	for _, s := range []string{"backing", "mount"} {
		res := r.Resident[s]
		if len(res) != len(r.Samples[s]) {
			return false, "not cold: residency not checked"
		}
		for _, n := range res {
			if n == unknownResidency {
				return false, "not cold: residency unknown (" + s + ")"
			}
			if n > worst {
				worst, where = n, s
			}
		}
	}
	if worst > 0 {
		return false, fmt.Sprintf("not cold: %d pages resident (%s)", worst, where)
	}
	return true, ""
}

// primeHost reads path once with O_DIRECT, which fills no guest page
// cache. Under a VM the host caches the virtual disk and no guest drop
// reaches it: the first cold read of a run would come from the disk and
// every later one from the host's memory, so whichever side read first was
// slower. Read before every cold sample, the file is host-warm for both
// sides alike; on bare metal it leaves no cache behind.
func primeHost(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	defer unix.Munmap(buf) // page-aligned, as O_DIRECT needs
	for {
		n, err := unix.Read(fd, buf)
		if err != nil || n == 0 {
			return err
		}
	}
}

// underVM reports whether /proc/cpuinfo's flags say a hypervisor runs
// this machine, whose host may cache its disk.
func underVM(cpuinfo string) bool {
	for _, l := range strings.Split(cpuinfo, "\n") {
		if strings.HasPrefix(l, "flags") && strings.Contains(l+" ", " hypervisor ") {
			return true
		}
	}
	return false
}

// coldName names the cold row for what it measures.
func coldName(vm bool) string {
	if vm {
		return "seq read 1 MiB, guest-cold, host-warm"
	}
	return "seq read 1 MiB, cold"
}

// hostCacheNote says what "cold" means here.
func hostCacheNote(vm bool) string {
	const checked = "cold: page cache dropped and checked empty (cachestat) on both paths before each cold read"
	if vm {
		return checked + ";\n  this is a VM: its host may cache the virtual disk, beyond any guest drop, so the file is read\n" +
			"  once with O_DIRECT before each cold read and both sides find it host-warm; a host-cold read is not measured"
	}
	return checked
}

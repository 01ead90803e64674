// Command uring-spike is the spike of docs/fuse-uring.md §4 step 1: a go-fuse loopback
// (fs.NewLoopbackRoot) served over FUSE-over-io_uring through fuse.ProtocolServer, one
// pinned, locked thread and one SQE128 ring per possible CPU, next to the same loopback on
// /dev/fuse; and the interleaved create/unlink loop and getxattr round trip that compared them
// (results: docs/fuse-uring.md §5). Not part of phxmount; run as root.
//
//	uring-spike serve -mode dev|uring -src DIR -mnt DIR [-depth 2] [-pin] [-idle] [-nodp]
//	uring-spike bench -dirs name=DIR,... [-rounds 30] [-batch 200]
//	uring-spike rtt -dirs name=DIR,... [-n 20000]
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/pawelgaczynski/giouring"
	"golang.org/x/sys/unix"
)

const (
	cmdRegister       = 1
	cmdCommitAndFetch = 2
	hdrSize           = 288 // struct fuse_uring_req_header
	opInOff           = 128
	entInOutOff       = 256
	inHeaderSize      = 40
	outHeaderSize     = 16
)

// entInOut is struct fuse_uring_ent_in_out (32 bytes).
type entInOut struct {
	Flags     uint64
	CommitID  uint64
	PayloadSz uint32
	Padding   uint32
	Reserved  uint64
}

// cmdReq is struct fuse_uring_cmd_req (24 bytes), at byte 48 of an SQE128.
type cmdReq struct {
	Flags    uint64
	CommitID uint64
	Qid      uint16
	Padding  [6]uint8
}

type entry struct {
	hdr     []byte
	payload []byte
	iov     [2]unix.Iovec
}

var (
	stats struct {
		reqs, badOpSize, errs atomic.Int64
	}
)

func fuseFds() map[int]bool {
	r := map[int]bool{}
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == unix.Mkdev(10, 229) {
			r[fd] = true
		}
	}
	return r
}

func possibleCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		return runtime.NumCPU()
	}
	s := strings.TrimSpace(string(b))
	n := 0
	for _, part := range strings.Split(s, ",") {
		lo, hi, ok := strings.Cut(part, "-")
		a, _ := strconv.Atoi(lo)
		c := a
		if ok {
			c, _ = strconv.Atoi(hi)
		}
		n = max(n, c+1)
	}
	return n
}

func syntheticInit(ps *fuse.ProtocolServer, ks *fuse.InitIn) error {
	in := *ks
	in.InHeader.Length = uint32(unsafe.Sizeof(in))
	in.InHeader.Opcode = 26 // FUSE_INIT
	in.InHeader.Unique = 1
	b := unsafe.Slice((*byte)(unsafe.Pointer(&in)), unsafe.Sizeof(in))
	out := make([]byte, 4096)
	n, st := ps.HandleRequest([][]byte{b}, [][]byte{out})
	if !st.Ok() || n < outHeaderSize {
		return fmt.Errorf("synthetic INIT: %v n=%d", st, n)
	}
	if e := (*fuse.OutHeader)(unsafe.Pointer(&out[0])).Status; e != 0 {
		return fmt.Errorf("synthetic INIT: errno %d", -e)
	}
	return nil
}

func prepCmd(sqe *giouring.SubmissionQueueEntry, fd int, cmd uint32, idx int, qid int, commit uint64) {
	*sqe = giouring.SubmissionQueueEntry{}
	sqe.OpCode = giouring.OpUringCmd
	sqe.Fd = int32(fd)
	sqe.Off = uint64(cmd) // cmd_op is the low 32 bits of off
	sqe.UserData = uint64(idx)
	area := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(sqe), 48)), 80)
	clear(area)
	c := (*cmdReq)(unsafe.Pointer(&area[0]))
	c.Qid = uint16(qid)
	c.CommitID = commit
}

var idlePolicy = false

func queue(qid, fd, depth, payloadSz int, pin bool, ps *fuse.ProtocolServer, ready chan<- error, wg *sync.WaitGroup) {
	defer wg.Done()
	runtime.LockOSThread() // never unlocked: the thread's affinity is changed
	if pin {
		var set unix.CPUSet
		set.Set(qid)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			ready <- fmt.Errorf("affinity %d: %w", qid, err)
			return
		}
	}
	if idlePolicy {
		// Experiment: a CPU that runs only SCHED_IDLE tasks counts as idle when the
		// scheduler places the caller woken by our commit, so the caller stays here.
		attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}
		if err := unix.SchedSetAttr(0, &attr, 0); err != nil {
			ready <- fmt.Errorf("sched_idle %d: %w", qid, err)
			return
		}
	}
	ring := giouring.NewRing()
	if err := ring.QueueInit(uint32(2*depth), giouring.SetupSQE128); err != nil {
		ready <- fmt.Errorf("ring %d: %w", qid, err)
		return
	}
	defer ring.QueueExit()
	ents := make([]entry, depth)
	for i := range ents {
		mem, err := unix.Mmap(-1, 0, 4096+payloadSz, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			ready <- err
			return
		}
		e := &ents[i]
		e.hdr, e.payload = mem[:hdrSize], mem[4096:]
		e.iov[0] = unix.Iovec{Base: &e.hdr[0], Len: hdrSize}
		e.iov[1] = unix.Iovec{Base: &e.payload[0], Len: uint64(payloadSz)}
		sqe := ring.GetSQE()
		prepCmd(sqe, fd, cmdRegister, i, qid, 0)
		sqe.Addr = uint64(uintptr(unsafe.Pointer(&e.iov[0])))
		sqe.Len = 2
	}
	if _, err := ring.Submit(); err != nil {
		ready <- fmt.Errorf("register %d: %w", qid, err)
		return
	}
	ready <- nil
	cqes := make([]*giouring.CompletionQueueEvent, 2*depth)
	live := depth
	for live > 0 {
		if _, err := ring.SubmitAndWait(1); err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			log.Printf("q%d: enter: %v", qid, err)
			return
		}
		n := ring.PeekBatchCQE(cqes)
		for _, cqe := range cqes[:n] {
			idx, res := int(cqe.UserData), cqe.Res
			if res < 0 {
				if res != -int32(syscall.ENOTCONN) {
					log.Printf("q%d e%d: cqe %v", qid, idx, syscall.Errno(-res))
					stats.errs.Add(1)
				}
				live--
				continue
			}
			e := &ents[idx]
			serve(e, ps)
			io := (*entInOut)(unsafe.Pointer(&e.hdr[entInOutOff]))
			prepCmd(ring.GetSQE(), fd, cmdCommitAndFetch, idx, qid, io.CommitID)
		}
		ring.CQAdvance(n)
	}
}

func serve(e *entry, ps *fuse.ProtocolServer) {
	stats.reqs.Add(1)
	ih := (*fuse.InHeader)(unsafe.Pointer(&e.hdr[0]))
	io := (*entInOut)(unsafe.Pointer(&e.hdr[entInOutOff]))
	unique := ih.Unique
	pl := int(io.PayloadSz)
	opSize := int(ih.Length) - inHeaderSize - pl
	if opSize < 0 || opSize > 128 {
		stats.badOpSize.Add(1)
		log.Printf("op %d len %d payload %d: bad op size", ih.Opcode, ih.Length, pl)
		opSize = 0
	}
	in := [][]byte{e.hdr[:inHeaderSize], e.hdr[opInOff : opInOff+opSize], e.payload[:pl]}
	if ih.Opcode == 39 { // IOCTL: the out buffer aliases the in payload
		in[2] = append([]byte(nil), in[2]...)
	}
	out := [][]byte{e.hdr[:outHeaderSize], e.payload}
	n, st := ps.HandleRequest(in, out)
	if n < outHeaderSize {
		if st.Ok() {
			st = fuse.ENOSYS
		}
		*(*fuse.OutHeader)(unsafe.Pointer(&e.hdr[0])) = fuse.OutHeader{Length: outHeaderSize, Status: -int32(st), Unique: unique}
		n = outHeaderSize
	}
	io.PayloadSz = uint32(n - outHeaderSize)
}

func mountDev(mnt string) (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) > 4 && fl[4] == mnt {
			_, minor, _ := strings.Cut(fl[2], ":")
			return minor, nil
		}
	}
	return "", fmt.Errorf("%s not in mountinfo", mnt)
}

func serveMain(args []string) {
	fl := flag.NewFlagSet("serve", flag.ExitOnError)
	mode := fl.String("mode", "uring", "dev or uring")
	src := fl.String("src", "", "backing dir")
	mnt := fl.String("mnt", "", "mount point")
	depth := fl.Int("depth", 2, "entries per queue")
	pin := fl.Bool("pin", true, "pin queue threads")
	nodp := fl.Bool("nodp", false, "mount without default_permissions")
	fl.BoolVar(&idlePolicy, "idle", false, "queue threads SCHED_IDLE (experiment)")
	fl.Parse(args)
	mnt2, _ := filepath.Abs(*mnt)
	root, err := fs.NewLoopbackRoot(*src)
	if err != nil {
		log.Fatal(err)
	}
	hour := time.Hour
	opts := &fs.Options{EntryTimeout: &hour, AttrTimeout: &hour}
	opts.DirectMount = true
	if !*nodp {
		opts.Options = []string{"default_permissions"}
	}
	opts.FsName = "spike-" + *mode
	if *mode == "uring" {
		opts.ExtraCapabilities |= fuse.CAP_OVER_IO_URING
	}
	rawFS := fs.NewNodeFS(root, opts)
	before := fuseFds()
	srv, err := fuse.NewServer(rawFS, mnt2, &opts.MountOptions)
	if err != nil {
		log.Fatal(err)
	}
	var wg sync.WaitGroup
	ks := srv.KernelSettings()
	negotiated := false
	if *mode == "uring" && ks.Flags64()&fuse.CAP_OVER_IO_URING != 0 {
		negotiated = true
		fd := -1
		for f := range fuseFds() {
			if !before[f] {
				fd = f
			}
		}
		if fd < 0 {
			log.Fatal("no /dev/fuse fd found")
		}
		ps := fuse.NewProtocolServer(rawFS, &opts.MountOptions)
		if err := syntheticInit(ps, ks); err != nil {
			log.Fatal(err)
		}
		maxWrite := opts.MaxWrite
		if maxWrite == 0 {
			maxWrite = 128 << 10
		}
		payloadSz := max(8192, maxWrite, ((maxWrite-1)/4096+1)*4096)
		ncpu := possibleCPUs()
		ready := make(chan error, ncpu)
		for q := 0; q < ncpu; q++ {
			wg.Add(1)
			go queue(q, fd, *depth, payloadSz, *pin, ps, ready, &wg)
		}
		for q := 0; q < ncpu; q++ {
			if err := <-ready; err != nil {
				log.Printf("queue: %v", err)
			}
		}
		log.Printf("fd %d, %d queues x %d, payload %d, kernel minor %d", fd, ncpu, *depth, payloadSz, ks.Minor)
	}
	go srv.Serve()
	done := make(chan error, 1)
	go func() { done <- srv.WaitMount() }()
	select {
	case err := <-done:
		if err != nil {
			log.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		if n, err := mountDev(mnt2); err == nil {
			os.WriteFile("/sys/fs/fuse/connections/"+n+"/abort", []byte("1"), 0)
		}
		log.Fatal("mount stuck; aborted")
	}
	fmt.Printf("ready %s negotiated=%v pid=%d\n", *mode, negotiated, os.Getpid())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	if err := srv.Unmount(); err != nil {
		log.Printf("unmount: %v", err)
	}
	srv.Wait()
	wg.Wait()
	log.Printf("%s: ring requests %d, bad op sizes %d, errors %d", *mode, stats.reqs.Load(), stats.badOpSize.Load(), stats.errs.Load())
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "bench" {
		benchMain(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "rtt" {
		rttMain(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		serveMain(os.Args[2:])
		return
	}
	fmt.Fprintln(os.Stderr, "usage: spike serve|bench ...")
	os.Exit(2)
}

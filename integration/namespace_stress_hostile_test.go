package integration

// The stress test's hostile client: while the writers, readers and the
// mutator run, an unprivileged user (uid 65534) sends, on a file of the
// mount it may write, what used to take the daemon down or cost it
// memory without bound (oversized strided batches on made-up buffer ids
// and on its own buffer, REGISTERs of huge sparse memfds), and the largest
// batch that is allowed, while hostileWaiters lock owners wait for a lock
// it holds (each used to hold a daemon thread). Every answer must be the errno docs/abi.md
// promises; the daemon must live through it (runStress checks).

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/connector/emu"
)

// stressHostileName is the hostile client's file: 64 KiB of writePattern,
// the hostile user's own; its name passes the readers' listing check.
const stressHostileName = "qhostile"

const stressHostileSize = 64 << 10

// stressPopulateHostile makes the hostile client's file under the backing
// directory root.
func stressPopulateHostile(t interface {
	Helper()
	Fatal(...any)
}, root string) {
	t.Helper()
	p := filepath.Join(root, stressHostileName)
	if err := os.WriteFile(p, patternBytes(stressHostileSize), 0644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, nobody, nobody); err != nil {
		t.Fatal(err)
	}
}

// hostileTally counts the hostile client's requests and the answers that
// were not the promised ones.
type hostileTally struct {
	calls, bad int
	first      string
}

func (h *hostileTally) want(what, got, want string) {
	h.calls++
	if got != want {
		h.bad++
		if h.first == "" {
			h.first = fmt.Sprintf("%s: %s, want %s", what, got, want)
		}
	}
}

func (h *hostileTally) String() string {
	return fmt.Sprintf("calls=%d first=%q bad=%d", h.calls, h.first, h.bad)
}

// stressHostileChild is the body of the hostile child: args are the
// file's path through the mount and the milliseconds to run.
func stressHostileChild(args []string) {
	ms, _ := strconv.Atoi(args[1])
	// Done a little before the readers: the stress must take no longer
	// with the hostile client than without it.
	until := time.Now().Add(time.Duration(ms)*time.Millisecond - 500*time.Millisecond)
	var h hostileTally
	defer func() { fmt.Printf("HOSTILE %s\n", &h) }()
	f, err := client.OpenFile(args[0], unix.O_RDWR)
	if err != nil {
		h.want("open", err.Error(), "OK")
		return
	}
	defer f.Close()
	conn, _ := emu.New(emu.Config{})
	m, err := conn.Alloc(0, 1<<20)
	if err != nil {
		h.want("alloc", err.Error(), "OK")
		return
	}
	hd, _ := m.Export()
	own, err := f.Register(client.VendorEmu, 0, hd, m.Size())
	h.want("REGISTER of allocated memory", errnoName(err), "OK")
	if err != nil {
		return
	}
	release := hostileLockWaiters(args[0], &h)
	const madeUp = 0xBAD0BAD0
	for i := 0; time.Now().Before(until); i++ {
		h.want("strided write, count 2^32, made-up id", stridedIoctl(f, true, []client.IOReq{{ID: madeUp, Count: 1 << 32}}), "E2BIG")
		h.want("strided write, 2^32 one-byte pieces", stridedIoctl(f, true, []client.IOReq{{ID: madeUp, Length: 1, Count: 1 << 32, FileStride: 1, BufStride: 1}}), "E2BIG")
		h.want("strided read, 2^26 one-byte pieces", stridedIoctl(f, false, []client.IOReq{{ID: own.ID, Length: 1, Count: 1 << 26, FileStride: 1, BufStride: 1}}), "E2BIG")
		h.want("strided read, MaxPieces+1 over 255 extents", stridedIoctl(f, false, hostileSpread(own.ID)), "E2BIG")
		h.want("REGISTER of a sparse 1 TiB memfd", errnoName(hostileSparseRegister(f, 1<<40)), "EFAULT")
		if i%8 == 0 && time.Until(until) > time.Second {
			// The largest batch allowed: every other byte of the file, one by one.
			h.want("the largest strided read", hostileLargest(f, own, m.(*emu.Memory).Bytes()), "OK")
		}
	}
	f.Deregister(own)
	release()
}

// hostileWaiters is how many lock owners of the hostile client wait at
// once.
const hostileWaiters = 256

// hostileLockWaiters takes a lock of the whole file and has
// hostileWaiters owners (an open each) wait for it with F_OFD_SETLKW; the
// function it returns lets go and tallies whether every waiter got the
// lock within 10 s.
func hostileLockWaiters(path string, h *hostileTally) func() {
	holder, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err == nil {
		err = unix.FcntlFlock(uintptr(holder), unix.F_OFD_SETLK, &unix.Flock_t{Type: unix.F_WRLCK})
	}
	h.want("a lock of the whole file", errnoName(err), "OK")
	if err != nil {
		return func() {}
	}
	done := make(chan error, hostileWaiters)
	for range hostileWaiters {
		go func() {
			fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err == nil {
				err = unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLKW, &unix.Flock_t{Type: unix.F_RDLCK})
				unix.Close(fd)
			}
			done <- err
		}()
	}
	return func() {
		err := unix.FcntlFlock(uintptr(holder), unix.F_OFD_SETLK, &unix.Flock_t{Type: unix.F_UNLCK})
		h.want("the holder's unlock", errnoName(err), "OK")
		granted, timeout := 0, time.After(10*time.Second)
	wait:
		for range hostileWaiters {
			select {
			case err := <-done:
				if err == nil {
					granted++
				}
			case <-timeout:
				break wait
			}
		}
		h.want("lock waiters granted after the release", strconv.Itoa(granted), strconv.Itoa(hostileWaiters))
		unix.Close(holder)
	}
}

// hostileSpread is 255 extents whose counts sum to MaxPieces + 1.
func hostileSpread(id uint64) []client.IOReq {
	reqs := make([]client.IOReq, client.MaxStridedExtents)
	for k := range reqs {
		reqs[k] = client.IOReq{ID: id, Length: 1, Count: client.MaxPieces / client.MaxStridedExtents, FileStride: 2, BufStride: 1}
	}
	var sum uint64
	for _, r := range reqs[1:] {
		sum += r.Count
	}
	reqs[0].Count = client.MaxPieces + 1 - sum
	return reqs
}

// hostileLargest reads MaxPieces one-byte pieces, every other byte of the
// file from the start (wrapping), into the buffer, and checks them.
func hostileLargest(f *client.File, own client.Buffer, mem []byte) string {
	const n = stressHostileSize / 2
	reqs := make([]client.IOReq, client.MaxPieces/n)
	for k := range reqs {
		reqs[k] = client.IOReq{ID: own.ID, BufOffset: uint64(k * n), Length: 1, Count: n, FileStride: 2, BufStride: 1}
	}
	b, err := client.EncodeStridedBatch(len(reqs), reqs)
	if err != nil {
		return err.Error()
	}
	if err := f.Ioctl(client.CmdStridedBatch(false, len(reqs)), b); err != nil {
		return errnoName(err)
	}
	res := make([]int64, len(reqs))
	if failed, err := client.DecodeStridedBatchResp(b, res); err != nil || failed != 0 {
		return fmt.Sprintf("failed %d (%v): %v", failed, err, res[:1])
	}
	file := patternBytes(stressHostileSize)
	got := mem[:client.MaxPieces]
	for j := range got {
		if got[j] != file[2*(j%n)] {
			return fmt.Sprintf("piece %d is %#x, want %#x", j, got[j], file[2*(j%n)])
		}
	}
	if !bytes.Equal(got[:n], got[n:2*n]) {
		return "the runs differ"
	}
	return "OK"
}

// hostileSparseRegister ftruncates a new emu memfd to size bytes and
// registers it, never writing it.
func hostileSparseRegister(f *client.File, size int64) error {
	fd, err := unix.MemfdCreate("phxemu-hostile", unix.MFD_CLOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		return err
	}
	return registerFd(f, fd, size)
}

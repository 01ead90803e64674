package phxfs

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dirtyPages is cachestat(2)'s count of the dirty pages of [off, off+n) of
// fd; ok is false where the kernel cannot tell.
func dirtyPages(t *testing.T, fd int, off, n int64) (dirty uint64, ok bool) {
	t.Helper()
	r := cachestatRange{off: uint64(off), len: uint64(n)}
	var cs cachestatResult
	_, _, e := unix.Syscall6(sysCachestat, uintptr(fd), uintptr(unsafe.Pointer(&r)), uintptr(unsafe.Pointer(&cs)), 0, 0, 0)
	if e != 0 {
		return 0, false
	}
	return cs.nrDirty, true
}

// writesBack reports why the file system of dir keeps no dirty pages to
// write back (tmpfs, ramfs), or "" when it has them.
func writesBack(t *testing.T, dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	switch st.Type {
	case unix.TMPFS_MAGIC, unix.RAMFS_MAGIC:
		return "its file system (tmpfs or ramfs) has no writeback"
	}
	return ""
}

// newFile makes an empty file in a fresh directory on the tests' disk and
// returns its path and a descriptor (O_RDWR).
func newFile(t *testing.T) (string, int) {
	dir, err := os.MkdirTemp("/var/tmp", "phxfs-wb-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	name := filepath.Join(dir, "out")
	return name, openFile(t, name, unix.O_RDWR|unix.O_CREAT)
}

// TestWritebackStartsForLargeWrites: a staged write cut into bounce-sized
// operations starts the kernel's writeback of each one as it is written,
// so no page is left dirty for a later fsync; one whose descriptor is
// closed right after the batch still gets its writeback (the kicker has a
// descriptor of its own); small scattered writes (KV-cache blocks) get
// none. The file holds the bytes written, after fsync as before.
func TestWritebackStartsForLargeWrites(t *testing.T) {
	const size = 4 * mib
	for _, s := range setups() {
		if s.transport != Staged {
			continue // the kicks belong to the staged write path
		}
		t.Run(s.String(), func(t *testing.T) {
			l, c := newLib(t, s, 1) // bounce buffers of 256 KiB
			if got := l.WritebackStats().Min; got != 256<<10 {
				t.Fatalf("WritebackStats().Min %d, want the bounce size (%d)", got, 256<<10)
			}
			m := alloc(t, c, 0, size)
			want := make([]byte, size)
			fillPattern(want, 7<<20)
			fillDevice(t, c, m, 0, want)
			r := register(t, l, m)
			name, fd := newFile(t)

			write := func(fd int, reqs []Request) {
				t.Helper()
				if failed, err := l.WriteBatch(reqs); failed != 0 || err != nil {
					t.Fatalf("%d failed (%s), %v", failed, describe(reqs), err)
				}
			}
			write(fd, []Request{{Fd: fd, Device: 0, DevAddr: r.Addr(), Len: size}})
			l.wb.pending.Wait()
			st := l.WritebackStats()
			if st.Kicks != size/(256<<10) || st.Bytes != size || st.Dropped != 0 || st.Failed != 0 {
				t.Fatalf("after a %d-byte write: %+v, want %d kicks of the whole range", size, st, size/(256<<10))
			}
			if why := writesBack(t, filepath.Dir(name)); why != "" {
				t.Logf("dirty pages not checked: %s", why)
			} else if dirty, ok := dirtyPages(t, fd, 0, size); !ok {
				t.Logf("dirty pages not checked: no cachestat(2) on this kernel")
			} else if dirty != 0 {
				t.Fatalf("%d pages still dirty after every kick was issued: writeback was not started", dirty)
			}

			// The second half again, the descriptor closed at once.
			fd2 := openFile(t, name, unix.O_WRONLY)
			write(fd2, []Request{{Fd: fd2, Device: 0, DevAddr: r.Addr(), BufOffset: size / 2, Len: size / 2, FileOffset: size / 2}})
			unix.Close(fd2)
			l.wb.pending.Wait()
			if st2 := l.WritebackStats(); st2.Kicks != st.Kicks+size/2/(256<<10) || st2.Failed != 0 {
				t.Fatalf("after a write whose descriptor closed: %+v", st2)
			}

			// KV-cache blocks: 16 KiB each, scattered; no kick.
			blocks := kvWrites(rand.New(rand.NewPCG(3, 4)), 64, size/(16<<10), 16<<10)
			for i := range blocks {
				blocks[i].Fd, blocks[i].DevAddr = fd, r.Addr()
			}
			before := l.WritebackStats().Kicks
			write(fd, blocks)
			l.wb.pending.Wait()
			if got := l.WritebackStats().Kicks; got != before {
				t.Fatalf("16 KiB blocks started %d kicks", got-before)
			}
			dev := bytes.Clone(want)
			for _, b := range blocks {
				copy(want[b.FileOffset:], dev[b.BufOffset:b.BufOffset+b.Len])
			}

			if err := unix.Fsync(fd); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("the file differs from what was written")
			}
		})
	}
}

// TestWritebackKnob: PHX_WRITEBACK sets the least size (bounded by the
// bounce size) or turns the kicks off; a bad value stops New; a negative
// Config.WritebackMin turns them off whatever the environment says.
func TestWritebackKnob(t *testing.T) {
	s := setup{"sync", Staged}
	for _, tc := range []struct {
		env  string
		cfg  int64
		want int64
	}{
		{"", 0, 256 << 10}, {"auto", 0, 256 << 10}, {"off", 0, -1}, {"64KiB", 0, 64 << 10}, {"100000", 0, 100000},
		{"1GiB", 0, 256 << 10}, {"64KiB", -1, -1}, {"off", 128 << 10, 128 << 10},
	} {
		t.Setenv(EnvWriteback, tc.env)
		l, _ := newLib(t, s, 1, func(c *Config) { c.WritebackMin = tc.cfg })
		if got := l.WritebackStats().Min; got != tc.want {
			t.Fatalf("%s=%q, Config.WritebackMin %d: Min %d, want %d", EnvWriteback, tc.env, tc.cfg, got, tc.want)
		}
		l.Close()
	}
	for _, bad := range []string{"yes", "0", "-4", "4MB", "MiB", "99999999999GiB"} {
		t.Setenv(EnvWriteback, bad)
		if _, err := New(Config{Connector: emuStaged(t, 1), Engine: "sync"}); !errors.Is(err, unix.EINVAL) {
			t.Fatalf("%s=%q: New gave %v, want EINVAL", EnvWriteback, bad, err)
		}
	}
}

// TestWritebackOffStartsNone: with the kicks off a large write leaves its
// pages to the flusher.
func TestWritebackOffStartsNone(t *testing.T) {
	l, c := newLib(t, setup{"io_uring", Staged}, 1, func(c *Config) { c.WritebackMin = -1 })
	m := alloc(t, c, 0, mib)
	r := register(t, l, m)
	_, fd := newFile(t)
	if failed, err := l.WriteBatch([]Request{{Fd: fd, Device: 0, DevAddr: r.Addr(), Len: mib}}); failed != 0 || err != nil {
		t.Fatalf("%d failed, %v", failed, err)
	}
	if st := l.WritebackStats(); st != (WritebackStats{Min: -1}) {
		t.Fatalf("kicks off: %+v", st)
	}
}

// TestWritebackOnlyRegularFiles: a large write to something other than a
// regular file (here /dev/null) is not reopened for a kick: a device's
// open may act on its own.
func TestWritebackOnlyRegularFiles(t *testing.T) {
	l, c := newLib(t, setup{"sync", Staged}, 1)
	m := alloc(t, c, 0, mib)
	r := register(t, l, m)
	fd := openFile(t, "/dev/null", unix.O_WRONLY)
	if failed, err := l.WriteBatch([]Request{{Fd: fd, Device: 0, DevAddr: r.Addr(), Len: mib}}); failed != 0 || err != nil {
		t.Fatalf("%d failed, %v", failed, err)
	}
	l.wb.pending.Wait()
	if st := l.WritebackStats(); st.Kicks != 0 || st.Failed != 0 || st.Dropped != 0 {
		t.Fatalf("a write to /dev/null: %+v, want no kick and no failure", st)
	}
}

func TestCheckEnvChecksWriteback(t *testing.T) {
	t.Setenv(EnvWriteback, "sometimes")
	if CheckEnv() == nil {
		t.Errorf("CheckEnv passed %s=sometimes", EnvWriteback)
	}
}

// The owner checks: a registration's device memory is its owner's. The
// udev rule gives /dev/phxfs_devN to the group phxfs (steps/65-owner.sh
// does what it does); two users of that group open the device. User A
// maps a range and lands file bytes in it; user B is refused a MAP of any
// part of it with EACCES, sees no byte of it, and cannot read it through
// A's VMA either; A's other processes and root (CAP_SYS_RAWIO) may map it,
// uid 0 without CAP_SYS_RAWIO may not, nor B with a descriptor root
// opened; root's own registrations (a daemon's) are refused to B too; A's memory stays A's while I/O still
// holds it after munmap, and is free once released.
//
// The users are children of "vmcheck owner" running this program again
// with their credentials (the owner-* commands below).
package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/faultsafe"
	"github.com/phxmount/phxmount/kmod"
)

// The VM's users: A and B are in the group phxfs and nothing else.
const (
	phxfsGID = 900 // /etc/group of the VM (steps/65-owner.sh)
	uidA     = 1001
	uidB     = 1002
)

// The range under test: 1 MiB at three quarters of the BAR (clear of what
// the other checks land), filled from file offset ownerFileOff.
const (
	ownerSize    = 1 << 20
	ownerFileOff = 5 << 20
	pageSize     = 4096
)

// ownerCommands are the commands of the children, by name.
var ownerCommands = map[string]struct {
	args int
	run  func(a []string) error
}{
	"owner-hold":    {4, func(a []string) error { return ownerHold(a[0], parseInt(a[1]), parseInt(a[2]), parseInt(a[3])) }},
	"owner-refused": {2, func(a []string) error { return ownerRefused(parseInt(a[0]), parseInt(a[1])) }},
	"owner-allowed": {3, func(a []string) error { return ownerAllowed(parseInt(a[0]), parseInt(a[1]), parseInt(a[2])) }},
	"owner-inherit": {2, func(a []string) error { return ownerInherited(parseInt(a[0]), parseInt(a[1])) }},
	"owner-peek":    {2, func(a []string) error { return ownerPeek(int(parseInt(a[0])), uintptr(parseInt(a[1]))) }},
	"owner-nocap":   {2, func(a []string) error { return ownerNoRawIO(parseInt(a[0]), parseInt(a[1])) }},
}

// ownerChecks is "vmcheck owner FILE", as root.
func ownerChecks(file string) error {
	if err := checkNode(); err != nil {
		return err
	}
	memSize, err := kmod.ReadAttrInt(0, "mem_size")
	if err != nil {
		return err
	}
	off := memSize / 4 * 3 &^ (ownerSize - 1)
	before := registrations()

	a, err := startHolder(file, off)
	if err != nil {
		return err
	}
	defer a.stop()
	if err := ownerWhileHeld(a, off); err != nil {
		return err
	}
	if err := rootDaemonRange(off + 2*ownerSize); err != nil {
		return err
	}
	if err := ownerWhileDraining(a, off, before); err != nil {
		return err
	}
	if err := a.stop(); err != nil {
		return err
	}
	ok("uid %d's holder exited cleanly", uidA)
	return waitRegistrations(before)
}

// checkNode: the device node is as the udev rule makes it.
func checkNode() error {
	var st unix.Stat_t
	if err := unix.Stat(kmod.DevicePath(0), &st); err != nil {
		return err
	}
	if st.Uid != 0 || st.Gid != phxfsGID || st.Mode&0o7777 != 0o660 {
		return fmt.Errorf("%s is %d:%d %#o, want 0:%d 0660 (steps/65-owner.sh)", kmod.DevicePath(0), st.Uid, st.Gid, st.Mode&0o7777, phxfsGID)
	}
	ok("%s is root:phxfs 0660, as the udev rule makes it", kmod.DevicePath(0))
	return nil
}

// ownerWhileHeld: with A's registration live, B is refused and cannot
// read A's VMA; A's other process, root, and not uid 0 without
// CAP_SYS_RAWIO, may map it.
func ownerWhileHeld(a *holder, off int64) error {
	steps := []struct {
		uid  int
		args []string
	}{
		{uidB, args("owner-refused", off, ownerSize)},
		{uidB, args("owner-peek", a.pid, int64(a.host))},
		{uidA, args("owner-allowed", off, ownerSize, ownerFileOff)},
		{0, args("owner-nocap", off, ownerSize)},
	}
	for _, s := range steps {
		if err := runAs(s.uid, s.args...); err != nil {
			return err
		}
	}
	if err := inheritedDescriptor(off); err != nil {
		return err
	}
	return rootMaps(off)
}

// inheritedDescriptor: B with a descriptor root opened is still B.
func inheritedDescriptor(off int64) error {
	f, err := os.OpenFile(kmod.DevicePath(0), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	c := childCmd(uidB, args("owner-inherit", off, ownerSize)...)
	c.ExtraFiles = []*os.File{f}
	if err := c.Run(); err != nil {
		return fmt.Errorf("uid %d: vmcheck owner-inherit: %w", uidB, err)
	}
	return nil
}

// ownerWhileDraining: after A's munmap a pipe still holds pages of A's
// registration: it stays A's until the pipe lets go, then anyone in the
// group may map the range.
func ownerWhileDraining(a *holder, off, before int64) error {
	if err := a.command("splice-munmap"); err != nil {
		return err
	}
	if err := runAs(uidB, args("owner-refused", off, ownerSize)...); err != nil {
		return fmt.Errorf("after A's munmap, with a pipe holding its pages: %w", err)
	}
	ok("uid %d's range stays its own after munmap while a pipe holds its pages", uidA)
	if err := a.command("let-go"); err != nil {
		return err
	}
	if err := waitRegistrations(before); err != nil {
		return err
	}
	if err := runAs(uidB, args("owner-allowed", off, ownerSize, -1)...); err != nil {
		return fmt.Errorf("after A's registration was released: %w", err)
	}
	ok("once uid %d's registration is released, uid %d may map the range", uidA, uidB)
	return nil
}

// rootMaps: root (CAP_SYS_RAWIO) maps A's range and sees A's bytes.
func rootMaps(off int64) error {
	if err := ownerAllowed(off, ownerSize, ownerFileOff); err != nil {
		return fmt.Errorf("root with CAP_SYS_RAWIO: %w", err)
	}
	return nil
}

// rootDaemonRange: a range root maps (as a root daemon does) is refused
// to B.
func rootDaemonRange(off int64) error {
	d, err := kmod.Open(0)
	if err != nil {
		return err
	}
	defer d.Close()
	mp, err := d.Map(kmod.EmuDevAddr(0, uint64(off)), 64<<10)
	if err != nil {
		return err
	}
	scribble(mp.Bytes())
	if err := runAs(uidB, args("owner-refused", off, 64<<10)...); err != nil {
		return fmt.Errorf("B on root's range: %w", err)
	}
	ok("root's registration (a daemon's) is refused to uid %d", uidB)
	return mp.Unmap()
}

func args(cmd string, nums ...int64) []string {
	out := []string{cmd}
	for _, n := range nums {
		out = append(out, strconv.FormatInt(n, 10))
	}
	return out
}

// childCmd runs this program as uid (in the group phxfs; uid 0 keeps
// root's credentials), its output on ours.
func childCmd(uid int, args ...string) *exec.Cmd {
	c := exec.Command("/proc/self/exe", args...)
	c.Stdout, c.Stderr = os.Stdout, os.Stderr
	if uid != 0 {
		c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{
			Uid: uint32(uid), Gid: uint32(uid), Groups: []uint32{phxfsGID},
		}}
	}
	return c
}

func runAs(uid int, args ...string) error {
	if err := childCmd(uid, args...).Run(); err != nil {
		return fmt.Errorf("uid %d: vmcheck %s: %w", uid, strings.Join(args, " "), err)
	}
	return nil
}

// holder is user A's process holding its registration; it obeys one
// command per line on its stdin and answers "DONE cmd".
type holder struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines <-chan string // its stdout, each line also echoed to ours
	pid   int64
	host  uintptr
	done  bool
}

func startHolder(file string, off int64) (*holder, error) {
	c := childCmd(uidA, "owner-hold", file, strconv.FormatInt(off, 10),
		strconv.Itoa(ownerSize), strconv.Itoa(ownerFileOff))
	c.Stdout = nil
	in, err := c.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := c.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.Start(); err != nil {
		return nil, err
	}
	h := &holder{cmd: c, in: in, lines: echoLines(out)}
	line, err := h.expect("HOLDING ")
	if err != nil {
		return nil, errors.Join(err, h.stop())
	}
	var host uint64
	if _, err := fmt.Sscanf(line, "HOLDING %d %d", &h.pid, &host); err != nil {
		h.stop()
		return nil, fmt.Errorf("holder said %q: %w", line, err)
	}
	h.host = uintptr(host)
	return h, nil
}

// echoLines copies r to our stdout line by line and hands the lines on.
func echoLines(r io.Reader) <-chan string {
	ch := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			fmt.Println(sc.Text())
			ch <- sc.Text()
		}
		close(ch)
	}()
	return ch
}

// expect waits for the holder's line starting with prefix.
func (h *holder) expect(prefix string) (string, error) {
	for line := range h.lines {
		if strings.HasPrefix(line, prefix) {
			return line, nil
		}
	}
	return "", fmt.Errorf("uid %d's holder ended without saying %q", uidA, prefix)
}

func (h *holder) command(cmd string) error {
	if _, err := fmt.Fprintln(h.in, cmd); err != nil {
		return fmt.Errorf("holder %s: %w", cmd, err)
	}
	if _, err := h.expect("DONE " + cmd); err != nil {
		return errors.Join(err, h.stop())
	}
	return nil
}

// stop ends the holder (EOF on its stdin) and returns how it exited.
func (h *holder) stop() error {
	if h.done {
		return nil
	}
	h.done = true
	h.in.Close()
	for range h.lines {
	}
	if err := h.cmd.Wait(); err != nil {
		return fmt.Errorf("uid %d's holder: %w", uidA, err)
	}
	return nil
}

// --- the children --------------------------------------------------------

// ownerHold (user A): map [off, off+size) of the BAR, land file bytes in
// it by O_DIRECT, say "HOLDING PID HOST", then obey commands until EOF.
func ownerHold(file string, off, size, fileOff int64) error {
	d, err := kmod.Open(0)
	if err != nil {
		return err
	}
	defer d.Close()
	b, err := rawMap(d, int(size), int(size), kmod.EmuDevAddr(0, uint64(off)))
	if err != nil {
		return fmt.Errorf("MAP of its own range: %w", err)
	}
	if err := landFile(file, b, fileOff); err != nil {
		return err
	}
	ok("uid %d (group phxfs, not root) maps BAR %#x+%d and O_DIRECT lands file bytes in it", os.Geteuid(), off, size)
	landed(off, fileOff, size)
	fmt.Printf("HOLDING %d %d\n", os.Getpid(), uintptr(unsafe.Pointer(&b[0])))
	return obey(d, b, fileOff)
}

func landFile(file string, b []byte, fileOff int64) error {
	fd, err := unix.Open(file, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	scribble(b)
	if n, err := unix.Pread(fd, b, fileOff); err != nil || n != len(b) {
		return fmt.Errorf("O_DIRECT pread into its registration: %d, %v", n, err)
	}
	return checkPattern(b, fileOff, "its registration")
}

// obey runs the holder's commands: "splice-munmap" has a pipe take
// references on the first pages and munmaps the VMA (the registration
// then waits for the pipe), "let-go" reads the pipe; EOF unmaps what is
// still mapped.
func obey(d *kmod.Device, b []byte, fileOff int64) error {
	var pp *pagePipe
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var err error
		switch sc.Text() {
		case "splice-munmap":
			if pp, err = holdPages(b[:held]); err == nil {
				err = unix.Munmap(b)
				b = nil
			}
		case "let-go":
			err = letGoOf(pp, fileOff)
			pp = nil
		default:
			err = fmt.Errorf("unknown command %q", sc.Text())
		}
		if err != nil {
			return err
		}
		fmt.Printf("DONE %s\n", sc.Text())
	}
	if pp != nil {
		pp.close()
	}
	if b != nil {
		args := mapArgs(d, b, len(b), 0)
		if err := d.Ioctl(kmod.IoctlUnmap, &args); err != nil {
			return err
		}
		return unix.Munmap(b)
	}
	return nil
}

func letGoOf(pp *pagePipe, fileOff int64) error {
	if pp == nil {
		return errors.New("let-go without splice-munmap")
	}
	got, err := pp.read(held)
	pp.close()
	if err != nil {
		return err
	}
	return checkPattern(got, fileOff, "bytes the pipe held")
}

// ownerRefused (another user): a MAP of [off, off+size), or of a range
// sharing one page with either end of it, fails with EACCES and shows no
// byte; a MAP of the range next to it succeeds (the device is usable).
func ownerRefused(off, size int64) error {
	d, err := kmod.Open(0)
	if err != nil {
		return fmt.Errorf("open as a member of the group phxfs: %w", err)
	}
	defer d.Close()
	who := fmt.Sprintf("uid %d", os.Geteuid())
	for _, r := range []struct {
		off, size int64
		what      string
	}{
		{off, size, "another owner's range"},
		{off - pageSize, 2 * pageSize, "the first page of another owner's range and the page before"},
		{off + size - pageSize, 2 * pageSize, "the last page of another owner's range and the page after"},
	} {
		if err := refusedMap(d.Fd(), r.off, r.size); err != nil {
			return fmt.Errorf("%s, MAP of %s: %w", who, r.what, err)
		}
	}
	ok("%s: MAP of another owner's range, whole or one page of it, fails with EACCES and shows no byte", who)
	mp, err := d.Map(kmod.EmuDevAddr(0, uint64(off+size)), 64<<10)
	if err != nil {
		return fmt.Errorf("%s, MAP of the free range after another owner's: %w", who, err)
	}
	scribble(mp.Bytes())
	if mp.Bytes()[4095] != 0xa5 {
		return fmt.Errorf("%s: its own mapping does not keep its bytes", who)
	}
	ok("%s maps the free range next to it", who)
	return mp.Unmap()
}

// ownerInherited (another user, with a descriptor of phxfs_dev0 that root
// opened as its fd 3): the caller's uid counts, not the opener's.
func ownerInherited(off, size int64) error {
	const fd = 3 // exec.Cmd.ExtraFiles[0]
	if err := refusedMap(fd, off, size); err != nil {
		return fmt.Errorf("uid %d with root's descriptor, MAP of another owner's range: %w", os.Geteuid(), err)
	}
	ok("uid %d with a descriptor root opened: MAP of another owner's range fails with EACCES", os.Geteuid())
	return nil
}

// refusedMap: MAP of [off, off+size) of phxfs_dev0 (open as fd) in a VMA
// of its own fails with EACCES, and the VMA then faults (no byte of the
// device shows).
func refusedMap(fd int, off, size int64) error {
	b, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap: %w", err)
	}
	defer unix.Munmap(b)
	a := kmod.MapArgs{
		HostAddr: uint64(uintptr(unsafe.Pointer(&b[0]))),
		HostSize: uint64(size),
		DevAddr:  kmod.EmuDevAddr(0, uint64(off)),
		DevSize:  uint64(size),
	}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), kmod.IoctlMap, uintptr(unsafe.Pointer(&a)))
	if errno == 0 {
		word := make([]byte, 8)
		faultsafe.Copy("device memory", b, word, b[:8])
		return fmt.Errorf("MAP succeeded, want EACCES; its first word reads %#x", binary.LittleEndian.Uint64(word))
	}
	if errno != unix.EACCES {
		return fmt.Errorf("MAP: %v, want EACCES", errno)
	}
	if err := faultsafe.Copy("refused VMA", b, make([]byte, size), b); !errors.Is(err, unix.EFAULT) {
		return fmt.Errorf("reading the VMA of a refused MAP: %v, want a fault", err)
	}
	return nil
}

// ownerAllowed: MAP of [off, off+size) succeeds; with fileOff >= 0 it
// shows the file bytes landed there.
func ownerAllowed(off, size, fileOff int64) error {
	d, err := kmod.Open(0)
	if err != nil {
		return err
	}
	defer d.Close()
	mp, err := d.Map(kmod.EmuDevAddr(0, uint64(off)), size)
	if err != nil {
		return fmt.Errorf("uid %d, MAP of BAR %#x+%d: %w", os.Geteuid(), off, size, err)
	}
	if fileOff >= 0 {
		if err := checkPattern(mp.Bytes(), fileOff, "the owner's bytes"); err != nil {
			mp.Unmap()
			return err
		}
		ok("uid %d maps BAR %#x+%d and sees the bytes landed there", os.Geteuid(), off, size)
	} else {
		ok("uid %d maps BAR %#x+%d", os.Geteuid(), off, size)
	}
	return mp.Unmap()
}

// ownerPeek (another user): reading the owner's VMA with
// process_vm_readv fails with EPERM (the kernel's ptrace rule).
func ownerPeek(pid int, host uintptr) error {
	buf := make([]byte, pageSize)
	local := []unix.Iovec{{Base: &buf[0]}}
	local[0].SetLen(len(buf))
	remote := []unix.RemoteIovec{{Base: host, Len: len(buf)}}
	n, err := unix.ProcessVMReadv(pid, local, remote, 0)
	if !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("uid %d, process_vm_readv of process %d's mapping: %d, %v, want EPERM", os.Geteuid(), pid, n, err)
	}
	ok("uid %d cannot read another user's mapping with process_vm_readv (EPERM)", os.Geteuid())
	return nil
}

// ownerNoRawIO (uid 0): without CAP_SYS_RAWIO, root is an owner like any
// other: refused.
func ownerNoRawIO(off, size int64) error {
	if err := dropRawIO(); err != nil {
		return err
	}
	return ownerRefused(off, size)
}

// dropRawIO takes CAP_SYS_RAWIO out of every thread's effective and
// permitted sets (capabilities are per thread).
func dropRawIO() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	bit := uint32(1) << unix.CAP_SYS_RAWIO
	data[0].Effective &^= bit
	data[0].Permitted &^= bit
	_, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	if e != 0 {
		return fmt.Errorf("capset without CAP_SYS_RAWIO: %w", e)
	}
	ok("uid 0 dropped CAP_SYS_RAWIO")
	return nil
}

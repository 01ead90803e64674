package fusefs

import (
	"errors"
	"os"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/client"
	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/internal/errs"
	"github.com/phxmount/phxmount/phxfs"
)

// buffer is what the protocol adds to a phxfs registration: its id, its
// token, its owner and the open file it was registered on. The
// registration owns the memory and its hold/drain lifecycle; a buffer
// found in the maps below is live, and a transfer holds its registration
// (taken under s.mu, where release unlinks it) until it is done.
type buffer struct {
	id     uint64
	token  client.Token
	tgid   int
	uid    uint32
	fileID uint64 // the open file it was registered on
	reg    *phxfs.Registration
}

func (b *buffer) ownedBy(c Caller) bool { return b.tgid == c.Tgid && b.uid == c.UID }

// proc is a process owning buffers, followed by the reaper through its pidfd.
type proc struct {
	tgid  int
	pidfd int
	bufs  map[*buffer]struct{}
}

type releaseReason int

const (
	releaseDeregister releaseReason = iota
	releaseClose
	releaseDeath
	releaseShutdown
)

func (r releaseReason) String() string {
	return [...]string{"deregistered", "file closed", "owner died", "unmount"}[r]
}

func (s *ControlServer) register(c Caller, f *OpenFile, req client.RegisterReq) (client.RegisterResp, unix.Errno) {
	log := s.log.WithFields(logrus.Fields{"pid": c.Tgid, "uid": c.UID, "file": f.Name, "device": req.Device, "size": req.Size})
	if e := s.checkRegister(c, req, log); e != 0 {
		return client.RegisterResp{}, e
	}
	dev, size := int(req.Device), int64(req.Size)
	if err := s.openDevice(dev); err != nil {
		return client.RegisterResp{}, errs.Errno(err)
	}
	s.reapIfExited(c.Tgid)
	if e := s.reserve(c, size); e != 0 {
		limitedLog(&s.logRefused, log, logrus.WarnLevel, "register refused: %v (limits: %d buffers per process; %d buffers and %d bytes per user; %d buffers and %d bytes per mount)",
			e, s.cfg.MaxBuffersPerProcess, s.cfg.MaxBuffersPerUser, s.cfg.MaxRegisteredBytesPerUser, s.cfg.MaxBuffers, s.cfg.MaxRegisteredBytes)
		return client.RegisterResp{}, e
	}
	b, e := s.importBuffer(c, f, dev, size, req.Handle, log)
	if e == 0 {
		e = s.publish(c, f, b, log)
	}
	if e != 0 {
		s.mu.Lock()
		s.unreserve(c.Tgid, size)
		s.userGives(c.UID, size)
		s.mu.Unlock()
		return client.RegisterResp{}, e
	}
	s.stats.registered.Add(1)
	t := b.reg.Transport()
	limitedLog(&s.logRegistered, log.WithFields(logrus.Fields{"id": b.id, "transport": string(t)}), logrus.InfoLevel,
		"registered %d-byte %s buffer %d: transport %s", size, s.conn.Vendor(), b.id, t)
	return client.RegisterResp{ID: b.id, Token: b.token, Transport: client.TransportByName(string(t))}, 0
}

// reapIfExited releases, before a REGISTER by process tgid, the buffers
// of an earlier process of that number that exited before the reaper
// took its event: the new process must neither have the dead one's
// buffers counted as its own nor lose its own with them when the event
// comes (ownerExited then finds another pidfd and leaves them).
func (s *ControlServer) reapIfExited(tgid int) {
	s.mu.Lock()
	p := s.procs[tgid]
	s.mu.Unlock()
	if p != nil && exited(p.pidfd) {
		s.ownerExited(tgid, p.pidfd)
	}
}

// checkRegister refuses a REGISTER whose fields cannot be served.
func (s *ControlServer) checkRegister(c Caller, req client.RegisterReq, log *logrus.Entry) unix.Errno {
	switch {
	case req.Vendor != client.VendorAny && req.Vendor != s.vendor:
		limitedLog(&s.logRefused, log, logrus.WarnLevel, "register refused: handle of vendor %s on a %s mount", req.Vendor, s.conn.Vendor())
		return unix.ENODEV
	case req.Device > client.MaxDevice:
		return unix.ENODEV
	case req.Size == 0 || req.Size > client.MaxOffset:
		return unix.EINVAL
	case c.Tgid <= 0:
		return unix.ESRCH
	}
	return 0
}

// reserve counts a registration in progress against the limits, so that
// concurrent REGISTERs cannot pass them together: EMFILE past the
// process's buffers, EDQUOT past its user's buffers or bytes, ENFILE past
// the mount's buffers (max_buffers, or what the daemon has room for:
// daemonRoom), ENOMEM past its bytes. The user's count holds from here
// until the buffer is released (or the registration fails: userGives).
func (s *ControlServer) reserve(c Caller, size int64) unix.Errno {
	s.mu.Lock()
	defer s.mu.Unlock()
	live := s.pending[c.Tgid]
	if p := s.procs[c.Tgid]; p != nil {
		live += len(p.bufs)
	}
	u := s.users[c.UID]
	switch {
	case s.shutdown:
		return unix.ESHUTDOWN
	case live >= s.cfg.MaxBuffersPerProcess:
		return unix.EMFILE
	case c.UID != 0 && (u.bufs >= s.cfg.MaxBuffersPerUser || size > s.cfg.MaxRegisteredBytesPerUser-u.bytes):
		return unix.EDQUOT
	case len(s.bufs)+s.pendingCount >= min(s.cfg.MaxBuffers, daemonRoom()):
		return unix.ENFILE
	case size > s.cfg.MaxRegisteredBytes-s.liveBytes-s.pendingBytes:
		return unix.ENOMEM
	}
	s.pending[c.Tgid]++
	s.pendingCount++
	s.pendingBytes += size
	if c.UID != 0 {
		s.users[c.UID] = userUse{bufs: u.bufs + 1, bytes: u.bytes + size}
	}
	return 0
}

// userUse is what one user holds: its live buffers and those being
// registered, and their bytes.
type userUse struct {
	bufs  int
	bytes int64
}

// userGives takes a buffer of size bytes off uid's count (released, or
// its registration failed); the caller holds s.mu.
func (s *ControlServer) userGives(uid uint32, size int64) {
	u, ok := s.users[uid]
	if !ok {
		return // root's are not counted
	}
	if u.bufs <= 1 {
		delete(s.users, uid)
		return
	}
	s.users[uid] = userUse{bufs: u.bufs - 1, bytes: u.bytes - size}
}

// daemonRoom is how many buffers the daemon can hold and still serve:
// a quarter of its RLIMIT_NOFILE and a quarter of vm.max_map_count. Every
// registration maps the memory it imports (emu: once, twice on the staged
// transport; its descriptor is closed once mapped), and every process
// owning buffers is followed through a pidfd. Past the descriptors every
// open through the mount, by any user, fails with EMFILE; past the
// mappings the Go runtime cannot grow its heap and the daemon dies. The
// rest is the overlay's (a descriptor for every inode the kernel holds)
// and the runtime's. Read at each REGISTER: either may change while the
// daemon runs. A variable: tests stand in for it.
var daemonRoom = func() int {
	room := shareOfNoFile(4, 0)
	if b, err := os.ReadFile("/proc/sys/vm/max_map_count"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			room = min(room, n/4)
		}
	}
	return room
}

// unreserve takes back a reservation; the caller holds s.mu.
func (s *ControlServer) unreserve(tgid int, size int64) {
	if s.pending[tgid]--; s.pending[tgid] == 0 {
		delete(s.pending, tgid)
	}
	s.pendingCount--
	s.pendingBytes -= size
}

// importBuffer imports the caller's memory and registers it with phxfs.
func (s *ControlServer) importBuffer(c Caller, f *OpenFile, dev int, size int64, h [client.HandleSize]byte, log *logrus.Entry) (*buffer, unix.Errno) {
	reg, err := s.lib.Import(dev, connector.Handle(h), size, c.Tgid)
	if err != nil {
		limitedLog(&s.logRefused, log, logrus.WarnLevel, "register refused: %v", err)
		return nil, errs.Errno(err)
	}
	b := &buffer{tgid: c.Tgid, uid: c.UID, fileID: f.ID, reg: reg}
	if b.token, err = randomToken(); err != nil {
		reg.Close()
		return nil, unix.EIO
	}
	return b, 0
}

// publish makes b findable by id, token, owner and file, turning its
// reservation into a live buffer, and has the reaper follow its owner.
func (s *ControlServer) publish(c Caller, f *OpenFile, b *buffer, log *logrus.Entry) unix.Errno {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown {
		b.reg.Close()
		return unix.ESHUTDOWN
	}
	p := s.procs[c.Tgid]
	if p == nil {
		pidfd, err := unix.PidfdOpen(c.Tgid, 0)
		if err == nil {
			if err = s.reaper.add(pidfd, c.Tgid); err != nil {
				unix.Close(pidfd)
			}
		}
		if err != nil {
			b.reg.Close()
			limitedLog(&s.logRefused, log, logrus.WarnLevel, "register refused: cannot follow the registering process: %v", err)
			if errors.Is(err, unix.ESRCH) {
				return unix.ESRCH
			}
			return errs.Errno(err)
		}
		p = &proc{tgid: c.Tgid, pidfd: pidfd, bufs: map[*buffer]struct{}{}}
		s.procs[c.Tgid] = p
	}
	s.unreserve(c.Tgid, b.reg.Size())
	s.nextID++
	b.id = s.nextID
	s.bufs[b.id] = b
	s.tokens[b.token] = b
	s.liveBytes += b.reg.Size()
	p.bufs[b] = struct{}{}
	fb := s.byFile[f.ID]
	if fb == nil {
		fb = map[*buffer]struct{}{}
		s.byFile[f.ID] = fb
	}
	fb[b] = struct{}{}
	return 0
}

func (s *ControlServer) deregister(c Caller, id uint64) unix.Errno {
	s.mu.Lock()
	b := s.bufs[id]
	switch {
	case b == nil:
		s.mu.Unlock()
		return unix.ENOENT
	case !b.ownedBy(c):
		s.mu.Unlock()
		return unix.EPERM
	}
	s.mu.Unlock()
	if err := s.release(b, releaseDeregister); err != nil {
		if errors.Is(err, errAlreadyReleasing) {
			return unix.ENOENT
		}
		return errs.Errno(err)
	}
	return 0
}

var errAlreadyReleasing = errs.New(unix.ENOENT, "buffer is already being released")

// release unlinks b so no new transfer can find it, then closes its
// registration, which waits for the transfers that hold it.
func (s *ControlServer) release(b *buffer, why releaseReason) error {
	s.mu.Lock()
	if s.bufs[b.id] != b {
		s.mu.Unlock()
		return errAlreadyReleasing
	}
	s.liveBytes -= b.reg.Size()
	s.userGives(b.uid, b.reg.Size())
	delete(s.bufs, b.id)
	delete(s.tokens, b.token)
	if fb := s.byFile[b.fileID]; fb != nil {
		delete(fb, b)
		if len(fb) == 0 {
			delete(s.byFile, b.fileID)
		}
	}
	var unfollow *proc
	if p := s.procs[b.tgid]; p != nil {
		delete(p.bufs, b)
		if len(p.bufs) == 0 && why != releaseDeath {
			delete(s.procs, b.tgid)
			unfollow = p
		}
	}
	s.mu.Unlock()

	if unfollow != nil {
		s.reaper.remove(unfollow.pidfd)
	}
	first := b.reg.Close()
	switch why {
	case releaseDeregister:
		s.stats.relDereg.Add(1)
	case releaseClose:
		s.stats.relClose.Add(1)
	case releaseDeath:
		s.stats.relDeath.Add(1)
	}
	l := s.log.WithFields(logrus.Fields{"id": b.id, "pid": b.tgid})
	if first != nil {
		limitedLog(&s.logReleased, l, logrus.WarnLevel, "released buffer %d (%s) with an error: %v", b.id, why, first)
	} else if why == releaseDeath {
		limitedLog(&s.logReleased, l, logrus.InfoLevel, "released buffer %d: its owner, process %d, died", b.id, b.tgid)
	} else {
		l.Debugf("released buffer %d (%s)", b.id, why)
	}
	return first
}

// Released implements Control: buffers registered through f die with it.
func (s *ControlServer) Released(f *OpenFile) {
	s.mu.Lock()
	var bs []*buffer
	for b := range s.byFile[f.ID] {
		bs = append(bs, b)
	}
	s.mu.Unlock()
	for _, b := range bs {
		s.release(b, releaseClose)
	}
}

// ownerExited releases every buffer of a process that exited.
func (s *ControlServer) ownerExited(tgid, pidfd int) {
	s.mu.Lock()
	p := s.procs[tgid]
	if p == nil || p.pidfd != pidfd || !exited(pidfd) {
		s.mu.Unlock()
		return
	}
	delete(s.procs, tgid)
	var bs []*buffer
	for b := range p.bufs {
		bs = append(bs, b)
	}
	s.mu.Unlock()
	for _, b := range bs {
		s.release(b, releaseDeath)
	}
	s.reaper.remove(pidfd)
}

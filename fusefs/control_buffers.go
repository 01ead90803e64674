package fusefs

import (
	"errors"
	"runtime"
	"sync"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"phxmount/client"
	"phxmount/connector"
	"phxmount/internal/errs"
	"phxmount/phxfs"
)

// buffer is one live registration.
type buffer struct {
	id        uint64
	token     client.Token
	tgid      int
	uid       uint32
	fileID    uint64 // the open file it was registered on
	dev       int
	mem       connector.Memory // the daemon's import of the application's memory
	addr      uint64           // mem.Addr(): what phxfs requests name
	size      int64
	transport phxfs.Transport

	inflight int  // transfers using it right now
	dying    bool // release began: no new transfer may start
}

func (b *buffer) ownedBy(c Caller) bool { return b.tgid == c.Tgid && b.uid == c.UID }

// proc is a process owning buffers, watched through its pidfd.
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
	if req.Vendor != client.VendorAny && req.Vendor != s.vendor {
		log.Warnf("register refused: handle of vendor %s on a %s mount", req.Vendor, s.conn.Vendor())
		return client.RegisterResp{}, unix.ENODEV
	}
	if req.Device > 1<<16 {
		return client.RegisterResp{}, unix.ENODEV
	}
	if req.Size == 0 || req.Size > client.MaxOffset {
		return client.RegisterResp{}, unix.EINVAL
	}
	if c.Tgid <= 0 {
		return client.RegisterResp{}, unix.ESRCH
	}
	dev, size := int(req.Device), int64(req.Size)
	if err := s.openDevice(dev); err != nil {
		return client.RegisterResp{}, errs.Errno(err)
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return client.RegisterResp{}, unix.ESHUTDOWN
	}
	if p := s.procs[c.Tgid]; p != nil && len(p.bufs) >= s.cfg.MaxBuffersPerProcess {
		s.mu.Unlock()
		return client.RegisterResp{}, unix.EMFILE
	}
	s.mu.Unlock()

	mem, err := s.conn.Import(dev, connector.Handle(req.Handle), size, c.Tgid)
	if err != nil {
		log.Warnf("register refused: import: %v", err)
		return client.RegisterResp{}, errs.Errno(err)
	}
	reg, err := s.lib.RegMem(dev, mem.Addr(), size)
	if err != nil {
		mem.Close()
		log.Warnf("register refused: %v", err)
		return client.RegisterResp{}, errs.Errno(err)
	}
	undo := func() {
		s.lib.DeregMem(dev, reg.Addr, reg.Size)
		mem.Close()
	}
	tok, err := randomToken()
	if err != nil {
		undo()
		return client.RegisterResp{}, unix.EIO
	}
	b := &buffer{token: tok, tgid: c.Tgid, uid: c.UID, fileID: f.ID, dev: dev, mem: mem,
		addr: reg.Addr, size: reg.Size, transport: reg.Transport}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		undo()
		return client.RegisterResp{}, unix.ESHUTDOWN
	}
	p := s.procs[c.Tgid]
	if p == nil {
		pidfd, err := unix.PidfdOpen(c.Tgid, 0)
		if err == nil {
			err = s.watch.add(pidfd, c.Tgid)
			if err != nil {
				unix.Close(pidfd)
			}
		}
		if err != nil {
			s.mu.Unlock()
			undo()
			log.Warnf("register refused: cannot watch the registering process: %v", err)
			if errors.Is(err, unix.ESRCH) {
				return client.RegisterResp{}, unix.ESRCH
			}
			return client.RegisterResp{}, errs.Errno(err)
		}
		p = &proc{tgid: c.Tgid, pidfd: pidfd, bufs: map[*buffer]struct{}{}}
		s.procs[c.Tgid] = p
	}
	s.nextID++
	b.id = s.nextID
	s.bufs[b.id] = b
	s.tokens[b.token] = b
	p.bufs[b] = struct{}{}
	fb := s.byFile[f.ID]
	if fb == nil {
		fb = map[*buffer]struct{}{}
		s.byFile[f.ID] = fb
	}
	fb[b] = struct{}{}
	s.mu.Unlock()

	s.stats.registered.Add(1)
	log.WithFields(logrus.Fields{"id": b.id, "transport": string(b.transport)}).
		Infof("registered %d-byte %s buffer %d: transport %s", size, s.conn.Vendor(), b.id, b.transport)
	return client.RegisterResp{ID: b.id, Token: tok, Transport: client.TransportByName(string(b.transport))}, 0
}

func (s *ControlServer) deregister(c Caller, id uint64) unix.Errno {
	s.mu.Lock()
	b := s.bufs[id]
	switch {
	case b == nil || b.dying:
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

// release unlinks b so no new transfer can find it, waits for the transfers
// in flight, and then deregisters and unmaps it.
func (s *ControlServer) release(b *buffer, why releaseReason) error {
	s.mu.Lock()
	if b.dying {
		s.mu.Unlock()
		return errAlreadyReleasing
	}
	b.dying = true
	delete(s.bufs, b.id)
	delete(s.tokens, b.token)
	if fb := s.byFile[b.fileID]; fb != nil {
		delete(fb, b)
		if len(fb) == 0 {
			delete(s.byFile, b.fileID)
		}
	}
	var unwatch *proc
	if p := s.procs[b.tgid]; p != nil {
		delete(p.bufs, b)
		if len(p.bufs) == 0 && why != releaseDeath {
			delete(s.procs, b.tgid)
			unwatch = p
		}
	}
	for b.inflight > 0 {
		s.changed.Wait()
	}
	s.mu.Unlock()

	if unwatch != nil {
		s.watch.remove(unwatch.pidfd)
	}
	var first error
	if err := s.lib.DeregMem(b.dev, b.addr, b.size); err != nil {
		first = err
	}
	if err := b.mem.Close(); err != nil && first == nil {
		first = err
	}
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
		l.Warnf("released buffer %d (%s) with an error: %v", b.id, why, first)
	} else if why == releaseDeath {
		l.Infof("released buffer %d: its owner, process %d, died", b.id, b.tgid)
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

// ownerDied releases every buffer of a process that exited.
func (s *ControlServer) ownerDied(tgid, pidfd int) {
	s.mu.Lock()
	p := s.procs[tgid]
	if p == nil || p.pidfd != pidfd {
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
	s.watch.remove(pidfd)
}

// deathWatch waits, on one goroutine, for watched processes to exit.
type deathWatch struct {
	epfd, evfd int
	died       func(tgid, pidfd int)

	mu      sync.Mutex
	watched map[int]int // pidfd -> tgid
	done    chan struct{}
}

func newDeathWatch(died func(tgid, pidfd int)) (*deathWatch, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, errs.New(errs.Errno(err), "control: epoll_create1: %v", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, errs.New(errs.Errno(err), "control: eventfd: %v", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(evfd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &ev); err != nil {
		unix.Close(epfd)
		unix.Close(evfd)
		return nil, errs.New(errs.Errno(err), "control: epoll_ctl: %v", err)
	}
	w := &deathWatch{epfd: epfd, evfd: evfd, died: died, watched: map[int]int{}, done: make(chan struct{})}
	go w.loop()
	return w, nil
}

func (w *deathWatch) add(pidfd, tgid int) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.watched[pidfd] = tgid
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(pidfd)}
	if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, pidfd, &ev); err != nil {
		delete(w.watched, pidfd)
		return errs.New(errs.Errno(err), "control: watch pidfd: %v", err)
	}
	return nil
}

// remove stops watching pidfd and closes it.
func (w *deathWatch) remove(pidfd int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.watched[pidfd]; !ok {
		return
	}
	delete(w.watched, pidfd)
	unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, pidfd, nil)
	unix.Close(pidfd)
}

func (w *deathWatch) loop() {
	defer close(w.done)
	// The goroutine spends its life in epoll_wait; keep it off the threads
	// that serve requests.
	runtime.LockOSThread()
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(w.epfd, events, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return
		}
		var dead [][2]int
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			if fd == w.evfd {
				return
			}
			w.mu.Lock()
			tgid, ok := w.watched[fd]
			if ok {
				// Level-triggered: stop reporting it while it is handled.
				unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, fd, nil)
			}
			w.mu.Unlock()
			if ok {
				dead = append(dead, [2]int{tgid, fd})
			}
		}
		for _, d := range dead {
			go w.died(d[0], d[1])
		}
	}
}

func (w *deathWatch) close() {
	var one [8]byte
	one[0] = 1
	unix.Write(w.evfd, one[:])
	<-w.done
	w.mu.Lock()
	for fd := range w.watched {
		unix.Close(fd)
	}
	w.watched = map[int]int{}
	w.mu.Unlock()
	unix.Close(w.epfd)
	unix.Close(w.evfd)
}

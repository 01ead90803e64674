package fusefs

import (
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// The reaper waits, on one goroutine, for the processes that registered
// buffers to exit, so that their registrations are released: it follows
// each through a pidfd in one epoll set. ("watch" is the fanotify
// watcher's word, watch.go; the reaper is this.)
//
// A pidfd's number is reused once it is closed, and epoll_wait may return
// an event for a pidfd that was removed (and its number given to a newly
// followed process) after the kernel queued the event. So every followed
// process carries a generation in the event's data, an event whose
// generation is not the current one's is dropped, and an exit is reported
// only when the pidfd itself says its process exited.
type reaper struct {
	epfd, evfd int
	exited     func(tgid, pidfd int)

	mu       sync.Mutex
	followed map[int]followed // by pidfd
	gen      uint32
	done     chan struct{}
}

// followed is a process the reaper waits for.
type followed struct {
	tgid int
	gen  uint32
}

func newReaper(exited func(tgid, pidfd int)) (*reaper, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, errs.Wrapf(err, "control: epoll_create1")
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, errs.Wrapf(err, "control: eventfd")
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(evfd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &ev); err != nil {
		unix.Close(epfd)
		unix.Close(evfd)
		return nil, errs.Wrapf(err, "control: epoll_ctl")
	}
	r := &reaper{epfd: epfd, evfd: evfd, exited: exited, followed: map[int]followed{}, done: make(chan struct{})}
	go r.loop()
	return r, nil
}

// add follows the process tgid through pidfd (which it then owns).
func (r *reaper) add(pidfd, tgid int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	if r.gen == 0 {
		r.gen = 1 // 0 marks the eventfd
	}
	r.followed[pidfd] = followed{tgid: tgid, gen: r.gen}
	// The event's 64-bit data: the descriptor and the generation.
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(pidfd), Pad: int32(r.gen)}
	if err := unix.EpollCtl(r.epfd, unix.EPOLL_CTL_ADD, pidfd, &ev); err != nil {
		delete(r.followed, pidfd)
		return errs.Wrapf(err, "control: follow pidfd %d of process %d", pidfd, tgid)
	}
	return nil
}

// remove stops following pidfd and closes it.
func (r *reaper) remove(pidfd int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.followed[pidfd]; !ok {
		return
	}
	delete(r.followed, pidfd)
	unix.EpollCtl(r.epfd, unix.EPOLL_CTL_DEL, pidfd, nil)
	unix.Close(pidfd)
}

// exited reports whether the process behind pidfd has exited: a pidfd is
// readable exactly then.
func exited(pidfd int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n == 1 && fds[0].Revents&unix.POLLIN != 0
}

// take claims the followed process an event names, if it still is the
// current one and really exited; it stops the level-triggered event
// meanwhile.
func (r *reaper) take(ev unix.EpollEvent) (tgid int, ok bool) {
	fd := int(ev.Fd)
	r.mu.Lock()
	defer r.mu.Unlock()
	p, found := r.followed[fd]
	if !found || p.gen != uint32(ev.Pad) || !exited(fd) {
		return 0, false // stale: removed, or its number reused by a live process
	}
	unix.EpollCtl(r.epfd, unix.EPOLL_CTL_DEL, fd, nil)
	return p.tgid, true
}

func (r *reaper) loop() {
	defer close(r.done)
	// The goroutine spends its life in epoll_wait; keep it off the threads
	// that serve requests.
	runtime.LockOSThread()
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(r.epfd, events, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return
		}
		var gone [][2]int
		for _, ev := range events[:n] {
			if int(ev.Fd) == r.evfd && ev.Pad == 0 {
				return
			}
			if tgid, ok := r.take(ev); ok {
				gone = append(gone, [2]int{tgid, int(ev.Fd)})
			}
		}
		for _, g := range gone {
			go r.exited(g[0], g[1])
		}
	}
}

func (r *reaper) close() {
	var one [8]byte
	one[0] = 1
	unix.Write(r.evfd, one[:])
	<-r.done
	r.mu.Lock()
	for fd := range r.followed {
		unix.Close(fd)
	}
	r.followed = map[int]followed{}
	r.mu.Unlock()
	unix.Close(r.epfd)
	unix.Close(r.evfd)
}

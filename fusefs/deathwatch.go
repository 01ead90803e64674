package fusefs

import (
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// deathWatch waits, on one goroutine, for watched processes to exit: each
// is watched through a pidfd in one epoll set.
//
// A pidfd's number is reused once it is closed, and epoll_wait may return
// an event for a pidfd that was removed (and its number given to a new
// watch) after the kernel queued the event. So every watch carries a
// generation in the event's data, an event whose generation is not the
// current watch's is dropped, and a death is reported only when the pidfd
// itself says its process exited.
type deathWatch struct {
	epfd, evfd int
	died       func(tgid, pidfd int)

	mu      sync.Mutex
	watched map[int]watch // by pidfd
	gen     uint32
	done    chan struct{}
}

type watch struct {
	tgid int
	gen  uint32
}

func newDeathWatch(died func(tgid, pidfd int)) (*deathWatch, error) {
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
	w := &deathWatch{epfd: epfd, evfd: evfd, died: died, watched: map[int]watch{}, done: make(chan struct{})}
	go w.loop()
	return w, nil
}

// add watches the process tgid through pidfd (which it then owns).
func (w *deathWatch) add(pidfd, tgid int) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gen++
	if w.gen == 0 {
		w.gen = 1 // 0 marks the eventfd
	}
	w.watched[pidfd] = watch{tgid: tgid, gen: w.gen}
	// The event's 64-bit data: the descriptor and the watch's generation.
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(pidfd), Pad: int32(w.gen)}
	if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, pidfd, &ev); err != nil {
		delete(w.watched, pidfd)
		return errs.Wrapf(err, "control: watch pidfd %d of process %d", pidfd, tgid)
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

// exited reports whether the process behind pidfd has exited: a pidfd is
// readable exactly then.
func exited(pidfd int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n == 1 && fds[0].Revents&unix.POLLIN != 0
}

// take claims the watch an event names, if it still is the current one and
// its process really exited; it stops the level-triggered event meanwhile.
func (w *deathWatch) take(ev unix.EpollEvent) (tgid int, ok bool) {
	fd := int(ev.Fd)
	w.mu.Lock()
	defer w.mu.Unlock()
	wt, found := w.watched[fd]
	if !found || wt.gen != uint32(ev.Pad) || !exited(fd) {
		return 0, false // stale: removed, or its number reused by a live watch
	}
	unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, fd, nil)
	return wt.tgid, true
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
			if int(ev.Fd) == w.evfd && ev.Pad == 0 {
				return
			}
			if tgid, ok := w.take(ev); ok {
				dead = append(dead, [2]int{tgid, int(ev.Fd)})
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
	w.watched = map[int]watch{}
	w.mu.Unlock()
	unix.Close(w.epfd)
	unix.Close(w.evfd)
}

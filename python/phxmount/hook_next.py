"""A loop over a checkpoint's files: the next file's first reads start
while the caller is still taking the last tensors of this one.

Engines load a sharded checkpoint one file after another, in the order of
the files' names (`model-00001-of-00004.safetensors`, ...): open, every
key with get_tensor, close, the next. A file's read-ahead (hook_ahead)
ends with its last key, so its last window of tensors is taken at the
loop's own speed with nothing in flight, and the next file's reads begin
only when the caller opens it: run 58's MoE engines' loop had no read in
flight for 119 ms of its 366, most of it at the files' ends and opens.

So once a file's reads near their end, the hook opens the next file of its
series (the same name with the next number, where it exists) with the
caller's own arguments and starts its first reads (warm): when get_tensor's
read-ahead holds the last key (the next file's first window), when
get_tensors (load_file) has started the file (the next file whole), and
when a get_slice loop is half way through the file (the next file's first
slices, guessed as this one's). The caller's safe_open of that file with
equal arguments gets that object (claim), and its reads go on from there.
The hook's open of the next file runs on a thread of the process's chores
(threadpools), not the caller's, which goes on taking this file's last
tensors; a caller that opens the file while that open is under way waits
for it (up to CLAIM_WAIT seconds) rather than open it twice.
A file the caller has open already is not warmed (a loader that opens
every file first would never claim it). What the hook read is
the file's bytes where the caller asks for them: a warm file is handed
only while its path still names the file the hook opened, unchanged
(device, inode, size, modification and change times), else it is closed
and the caller's open is an ordinary one. A warm file nobody claims
(the caller stopped, or opened another file) is closed: by the next
safe_open of any other file, or CLAIM_WITHIN seconds after the file that
warmed it was closed. Each file's read-ahead holds up to its window
(PHXMOUNT_HOOK_WINDOW): while one is warm, two windows' worth may be in
device memory (for load_file, the next file's tensors, which its own
load_file allocates in any case). A child made by fork forgets its
parent's warm files. PHXMOUNT_HOOK_NEXT=0 turns this off. No torch.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Callable, Dict, Optional, Set, Tuple

from . import hook_spec, threadpools
from .hook_report import report
from .hook_whole import start_whole

NEXT_ENV = "PHXMOUNT_HOOK_NEXT"
# A warm file not claimed this long after the file that warmed it closed
# is closed: the caller's loop would have opened it by then (an engine
# opens the next file within milliseconds of closing one).
CLAIM_WITHIN = 2.0
# How long a caller's open waits for the same file's open ahead, under way
# on another thread, before it opens the file itself.
CLAIM_WAIT = 5.0
_SERIES = re.compile(r"^(?P<head>.*-)(?P<i>\d+)(?P<of>-of-)(?P<n>\d+)(?P<tail>\.safetensors)$")


def next_enabled() -> bool:
    return os.environ.get(NEXT_ENV, "1").strip().lower() not in ("0", "off", "no", "false")


def next_in_series(path: str) -> Optional[str]:
    """The path of the file after path in its series (name-0000i-of-0000n
    .safetensors -> i+1, zero-padded alike), None after the last or for a
    name of no series."""
    d, base = os.path.split(path)
    m = _SERIES.match(base)
    if m is None:
        return None
    i, n = int(m["i"]), int(m["n"])
    if not 1 <= i < n:
        return None
    nxt = f"{m['head']}{i + 1:0{len(m['i'])}d}{m['of']}{m['n']}{m['tail']}"
    return os.path.join(d, nxt)


def identity(path: str) -> Optional[tuple]:
    """What makes a file the same file: device, inode, size, mtime, ctime
    (None: it cannot be stat'ed)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class Warm:
    """One warm file: the hooked file (its key: the arguments a claim
    must give) and the identity of what its path named then."""

    def __init__(self, f, ident: tuple):
        self.f, self.ident = f, ident
        self.timer: Optional[threadpools.Later] = None


class NextFiles:
    """The process's warm files, by path (at most one at a time: an
    engine's loop is on one file at once)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.warm: Dict[str, Warm] = {}
        # The file being opened ahead, off the caller's thread (offer), and
        # what is set when it is warm or given up; forget counts in gen, so
        # that an open that ends after it is let go.
        self.opening: Dict[str, threading.Event] = {}
        self.orphans: Set[str] = set()  # being opened, the file that warmed it closed
        self.gen = 0

    def settle(self, timeout: float = CLAIM_WAIT) -> bool:
        """Waits until no file is being opened ahead (False: still one
        after timeout seconds)."""
        with self.lock:
            evs = list(self.opening.values())
        return all(ev.wait(timeout) for ev in evs)

    def claim(self, path: str, key: tuple):
        """The warm file of path opened with key (the caller's arguments
        and the device the hook chose), where its path still names that
        file unchanged; None otherwise. Every other warm file is closed
        (the caller has moved on). Where path is being opened ahead now,
        the caller waits for that open (up to CLAIM_WAIT seconds) rather
        than open it a second time."""
        with self.lock:
            ev = self.opening.get(path)
        if ev is not None:
            ev.wait(CLAIM_WAIT)
        with self.lock:
            w = self.warm.pop(path, None)
            others, self.warm = list(self.warm.values()), {}
        for o in others:
            _drop(o)
        if w is None:
            return None
        if w.timer is not None:
            w.timer.cancel()
        if w.f.key != key or identity(path) != w.ident:
            _drop(w)
            return None
        return w.f

    def offer(self, path: str, open_it: Callable[[], Optional[object]], start: Callable) -> None:
        """Opens path (open_it: the hooked file, its key the arguments a
        claim must give, or None where the hook would not serve it) and
        starts its first reads (start(f)), unless a file is warm or being
        opened already, on a thread of the process's chores: the open (a
        header read through the mount, the file's plans, its first
        memory and registration) cost the caller's thread ~9 ms a file
        on the GPU host (docs/gpu-notes.md, run 69), while the caller
        still had this file's last tensors to take."""
        with self.lock:
            if self.warm or self.opening:
                return
            ev = self.opening[path] = threading.Event()
            gen = self.gen

        def run():
            try:
                self._open(path, open_it, start, gen)
            finally:
                with self.lock:
                    if self.opening.get(path) is ev:
                        del self.opening[path]
                        self.orphans.discard(path)
                ev.set()
        threadpools.soon(run)

    def _open(self, path: str, open_it: Callable[[], Optional[object]], start: Callable, gen: int) -> None:
        ident = identity(path)
        if ident is None:
            return
        f = None
        try:
            f = open_it()
            if f is None:
                return
            start(f)
        except Exception as e:  # noqa: BLE001: the caller's own open reads it (or fails) the ordinary way
            if f is not None:
                f.discard()
            report.say(f"next {e.__class__.__name__}", f"{path}: not started ahead of its open ({e}); "
                                                        "it is read when opened")
            return
        with self.lock:
            # Another thread's warm file, meanwhile, or forget since.
            busy = bool(self.warm) or gen != self.gen
            if not busy:
                w = self.warm[path] = Warm(f, ident)
                if path in self.orphans:  # the file that warmed it is closed already
                    self._expire_later(path, w)
        if busy:
            f.discard()

    def closed(self, path: str) -> None:
        """The file at path was closed: a file it warmed (the next in its
        series) is closed unless claimed within CLAIM_WITHIN seconds."""
        nxt = next_in_series(path)
        with self.lock:
            if nxt is not None and nxt in self.opening:
                self.orphans.add(nxt)  # its open arms the timer when it ends
                return
            w = self.warm.get(nxt) if nxt is not None else None
            if w is not None:
                self._expire_later(nxt, w)

    def _expire_later(self, path: str, w: Warm) -> None:
        """Closes w in CLAIM_WITHIN seconds unless claimed; caller holds
        self.lock."""
        if w.timer is None:
            w.timer = threadpools.later(CLAIM_WITHIN, lambda: self._expire(path, w))

    def _expire(self, path: str, w: Warm) -> None:
        with self.lock:
            if self.warm.get(path) is not w:
                return
            del self.warm[path]
        _drop(w)

    def forget(self) -> None:
        """Closes every warm file (a caller that opens a file phxmount does
        not serve has moved on; the hook's uninstall)."""
        with self.lock:
            ws, self.warm = list(self.warm.values()), {}
            self.gen += 1
        for w in ws:
            if w.timer is not None:
                w.timer.cancel()
            _drop(w)


def _drop(w: Warm) -> None:
    try:
        w.f.discard()
    except Exception:  # noqa: BLE001: what it read is let go with it either way
        pass


def warm_next(path: str, args: tuple, kwargs: dict, open_file: Callable, start: Callable,
              is_open: Callable[[str], bool]) -> None:
    """The file at path (opened with args and kwargs) has started its last
    reads: the next file of its series, opened by open_file(args, kwargs)
    with the same arguments, starts its first reads (start(f)) and waits
    for the caller's claim; not where is_open(next) says the caller has it
    open already (a loader that opens every file first would never claim
    it, and its reads would only compete with the caller's)."""
    nxt = next_in_series(path) if next_enabled() else None
    if nxt is not None and not is_open(nxt):
        a, kw = with_filename(args, kwargs, nxt)
        next_files.offer(nxt, lambda: open_file(a, kw), start)


class Warming:
    """hook.HookedFile's side of a loop over a series (it holds path,
    header, _args, _kwargs, _lock, _counted, _closed, _whole, _warmed,
    warming, _read_ahead, _regions, _guesses, _starts, _ahead, _reader,
    start_deferred and open_next, the hook's own open of a file)."""

    def warm_next_after_read_ahead(self, dev: int) -> None:
        """get_tensor's reads are under way: where its read-ahead holds the
        file's last key, the next file starts its first window (warm).
        Called once this file's own reads have started, never before: the
        next file's window must not go to the daemon ahead of the keys
        this caller waits for."""
        if not self._warmed and self._read_ahead.reached_end():
            self._warm_next(lambda g: g.warm(dev))

    def _warm_next(self, start: Callable) -> None:
        """This file's last reads started: the next file of its series
        starts its own (start(g): warm, warm_whole or warm_slices)."""
        if not self._warmed:
            self._warmed = True
            warm_next(self.path, self._args, self._kwargs, self.open_next, start,
                      lambda p: any(g.path == p and not g._closed for g in hook_spec.open_files.live()))

    def warm(self, dev: int) -> None:
        """Starts the first window of reads ahead, from the first key, as
        the caller's first get_tensor would."""
        self._regions.ahead_of(None, dev, None)
        self.start_deferred(dev)

    def warm_whole(self, dev: int) -> None:
        """Starts every tensor onto dev, for the caller's get_tensors."""
        pends = start_whole(self, dev, [t.name for t in self.header.tensors])
        with self._lock:
            self._whole[dev] = pends

    def warm_slices(self, dev: int) -> None:
        """Starts the guessed slices of the first keys onto dev."""
        self._guesses.first(self._reader(dev), dev, self._starts, self._ahead)

    def claimed(self) -> None:
        """The caller opened this warm file: counted as its own from now on."""
        with self._lock:
            counted, self.warming = self._counted, False
        if counted:
            report.opened(ahead=True)


def call_key(args: tuple, kwargs: dict, device) -> Tuple:
    """What a claim compares: the caller's arguments but the filename, and
    the device the hook serves the file onto."""
    rest = args if "filename" in kwargs else args[1:]
    kw = tuple(sorted((k, repr(v)) for k, v in kwargs.items() if k != "filename"))
    return tuple(repr(a) for a in rest), kw, repr(device)


def with_filename(args: tuple, kwargs: dict, path: str) -> Tuple[tuple, dict]:
    """args and kwargs with the filename replaced by path."""
    if "filename" in kwargs or not args:
        return args, dict(kwargs, filename=path)
    return (path,) + tuple(args[1:]), dict(kwargs)


next_files = NextFiles()
# A child made by fork has none of the parent's threads: a warm file's
# reads would never land there, and its lock may have been held at the
# fork. The child forgets the parent's warm files (they are the parent's
# to close) and opens its files as they come.
os.register_at_fork(after_in_child=next_files.__init__)

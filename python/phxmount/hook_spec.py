"""Whole files ahead of a loader's binds (transformers' from_pretrained).

A loader that takes every tensor of its files asks get_slice(k) of every
key of every file first, then binds each slice to where it goes (its
spawn_materialize, hook_slice.bind) in key order, from the main thread,
while a pool of threads materializes them. The binds come slowly (the
loader's own loop: ~0.3 s for 2,000 keys) and every read started from the
pool's threads waits for the interpreter's lock behind that loop: a
torch allocation gives the lock up, and taking it back beside a busy
thread costs the switch interval, 5 ms (scripts/gpu-probes/gilprobe.py;
docs/perf-notes.md §10). So at the first bind of such a file onto a GPU,
in the file's own dtype (the SPECULATE_AFTER-th such bind in a row), every
such file's tensors not started yet start there at once, on the binding
thread: the reads land while the loader's
loop runs, and the pool finds them landed.

It is a guess, made only where it is cheap to be wrong: every key of the
file was sliced (the loader takes the whole file), and the device has room
for all of it (HookedFile's backend says: free memory and torch's cached
blocks, with a margin). A tensor later bound elsewhere (the host, another
device, another dtype) lets its read go when the read returns; what no
one asked for is let go when its file closes. PHXMOUNT_HOOK_SPECULATE=0
turns it off. No torch.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Dict, List

from .hook_report import report

SPECULATE_ENV = "PHXMOUNT_HOOK_SPECULATE"


def speculate_enabled() -> bool:
    return os.environ.get(SPECULATE_ENV, "1").strip().lower() not in ("0", "off", "no", "false")


class Speculation:
    """A hooked file's: the keys get_slice was asked for, the devices its
    whole start was tried for, per device the names it started ahead of
    their binds, and the devices it has binds onto not started yet
    (OpenFiles.bound_to, under OpenFiles' lock)."""

    def __init__(self):
        self.sliced: set = set()
        self.tried: set = set()
        self.on: Dict[int, set] = {}
        self.waiting: set = set()


class OpenFiles:
    """The hooked files open in this process (weakly), in the order they
    were opened: the one registry of them.

    It also says which have tensors a caller bound to a device
    (transformers' spawn_materialize says where each get_slice(k) goes:
    hook_slice.bind) and not started yet. The first read onto a device
    starts every such file's (bound_to): a loader that asks in key order
    from a pool of threads reaches a checkpoint's files one after
    another, and each later file's bytes would wait until its first
    tensor is asked for (docs/perf-notes.md §10: a MoE from_pretrained's
    third and fourth files started 0.6 s into the call)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.files: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
        self.n = 0
        # Whether any open file may be marked: bound_to is asked at every
        # read (a MoE engine's loop: 2,000 times), and the files are looked
        # through only while a bind is left.
        self.marked = False

    def add(self, f) -> None:
        with self.lock:
            self.n += 1
            self.files[self.n] = f

    def live(self) -> List:
        with self.lock:
            return [f for _, f in sorted(self.files.items())]

    def bind(self, f, dev: int) -> None:
        """f has a tensor bound to dev, to start with the next read there."""
        with self.lock:
            f.spec.waiting.add(dev)
            self.marked = True

    def bound_to(self, dev: int) -> List:
        """The open files with binds onto dev, in the order they were
        opened, no longer marked (a later bind marks a file again)."""
        if not self.marked:  # (per get_tensor, a look without the lock: a file marked meanwhile starts with the next read)
            return []
        with self.lock:
            if not self.marked:
                return []
            files = [f for _, f in sorted(self.files.items())]
            out = [f for f in files if dev in f.spec.waiting]
            for f in out:
                f.spec.waiting.discard(dev)
            self.marked = any(f.spec.waiting for f in files)
            return out

    def forget(self) -> None:
        with self.lock:
            self.files.clear()
        streak.broken()


open_files = OpenFiles()


# Binds onto one device in the files' own dtype, in a row, before the
# whole files start there: one bind alone (a loader that casts or
# quantizes most tensors may bind a few in the file's dtype first) is not
# taken as the loader's pattern.
SPECULATE_AFTER = 8


class Streak:
    """The binds in a row onto one device in the file's dtype, in any file
    (a loader binds its files' keys in its own order)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.dev, self.n = None, 0

    def bind(self, dev: int) -> int:
        with self.lock:
            self.dev, self.n = dev, (self.n + 1 if dev == self.dev else 1)
            return self.n

    def broken(self) -> None:
        with self.lock:
            self.dev, self.n = None, 0


streak = Streak()


def bound(f, dev: int, name: str) -> None:
    """name of hooked file f was bound to dev in the file's dtype: a read
    started ahead onto another device lets go, and the SPECULATE_AFTER-th
    such bind onto dev in a row starts the whole files (ahead_of_binds)."""
    for d in list(f.spec.on):
        if d != dev:
            unbound(f, name)
    if streak.bind(dev) >= SPECULATE_AFTER and dev not in f.spec.tried:
        f.spec.tried.add(dev)
        ahead_of_binds(dev, f)


def unbound(f, name: str) -> None:
    """name of hooked file f goes elsewhere than where its whole file was
    started ahead (the host, another device, another dtype): its read lets
    go (its memory is free once the read returns)."""
    streak.broken()
    for dev, names in f.spec.on.items():
        if name not in names:
            continue
        names.discard(name)
        with f._lock:
            f._starts.started.get(dev, set()).discard(name)
            r = f._res.readers.get(dev)
        if r is not None:
            r.drop(r.fetcher.plan(name).key)


def taken_whole(f, dev: int) -> bool:
    """Whether a loader takes f whole: every key sliced, f open and
    phxmount's, and nothing of it started onto dev but by its binds."""
    return (not f._closed and f._fallen is None and len(f.spec.sliced) == len(f.tensors)
            and dev not in f.spec.on and f.destination(dev) == dev)


def unstarted(f, dev: int) -> List[str]:
    with f._lock:
        started = f._starts.started.get(dev, ())
        return [t.name for t in f.header.tensors if t.name not in started]


def ahead_of_binds(dev: int, first) -> None:
    """first's first bind onto dev: every open file that a loader takes
    whole (first among them) starts what it has not started onto dev, if
    dev has room for all of it (each file is tried once a device)."""
    if not speculate_enabled():
        return
    files = [f for f in open_files.live() if taken_whole(f, dev)]
    if first not in files:
        return
    files.remove(first)
    files.insert(0, first)
    names = [unstarted(f, dev) for f in files]
    need = sum(f.tensors[n].nbytes for f, ns in zip(files, names) for n in ns)
    for f in files:
        f.spec.tried.add(dev)  # tried: not again for this device
    if need == 0:
        return
    try:
        if not room_for(first._reader(dev), need):
            return
    except Exception:  # noqa: BLE001: no reader: the binds' own reads say why
        return
    for f, ns in zip(files, names):
        start_whole(f, dev, ns)


def room_for(reader, nbytes: int) -> bool:
    """Whether reader's device has room for nbytes more (its backend's
    room(); a backend without one, the emulated device's, always has)."""
    room = getattr(reader.fetcher.backend, "room", None)
    return room is None or room(nbytes)


def start_whole(f, dev: int, names: List[str]) -> None:
    """Starts names of f onto dev ahead of their binds; a failure makes f
    safetensors' (as its own read's would)."""
    report.asked()  # the span of the hook's reads begins with these
    f.spec.on[dev] = set(names)
    for n in names:
        f._starts.defer(dev, n)
    f.start_deferred(dev)

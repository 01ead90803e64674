"""Registrations reused across loads.

A REGISTER costs an IPC export here and an import in the daemon (about
0.2 ms on the GPU machine); a load that registers every tensor's memory
afresh pays that per tensor. RegCache keeps one registration per device
allocation, keyed by the allocation's base address AND its identity (CUDA:
CU_POINTER_ATTRIBUTE_BUFFER_ID, unique per allocation for the life of the
process), so an address that was freed and handed out again is never
served by the stale registration: it is deregistered and the new
allocation registered.

Registrations are made on a descriptor of the mount's root directory that
the cache owns: close() (or the process's exit, or its death: the daemon
watches it) releases them all. Pure Python; the CUDA or emu specifics come
in as Alloc records (torch_mem.py builds them from a tensor's pointer).
"""

from __future__ import annotations

import atexit
import errno
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple, Union

from .client import PhxError, PhxFile

PAGE = 64 << 10  # registrations: a multiple of the device page


@dataclass(frozen=True)
class Alloc:
    """A device allocation: where it starts, its size, an identity that
    changes when its address is reused, and how to export its handle."""
    base: int
    size: int
    key: int
    export: Callable[[], bytes] = field(compare=False, repr=False)


@dataclass(frozen=True)
class Entry:
    id: int  # the daemon's buffer id
    base: int
    size: int  # bytes registered from base (the allocation, rounded down to 64 KiB)
    key: int
    transport: str


class RegCache:
    """One registration per live allocation, with one mount and device.
    probe(base) says which allocation lives at base now (its key, or None
    when none does); prune() uses it to let go of freed allocations."""

    def __init__(self, root: Union[str, os.PathLike], vendor: int, device: int,
                 probe: Optional[Callable[[int], Optional[int]]] = None):
        self.root = os.fspath(root)
        self.vendor, self.device, self.probe = vendor, device, probe
        self.ctl = PhxFile(self.root)
        self._by_base: Dict[int, Entry] = {}
        self._lock = threading.RLock()
        self.hits = self.registered = self.stale = 0
        self.register_seconds = 0.0  # spent in REGISTER ioctls (the export and the daemon's import)
        self._pruned = 0.0  # time.monotonic() of the last prune

    def get(self, alloc: Alloc) -> Entry:
        """The registration of alloc: cached, or made now."""
        with self._lock:
            e = self._by_base.get(alloc.base)
            if e is not None and e.key == alloc.key:
                self.hits += 1
                return e
            if e is not None:
                self.stale += 1
                self._drop(e)
            size = alloc.size // PAGE * PAGE
            if size == 0 or alloc.base % PAGE:
                raise ValueError(f"allocation {alloc.base:#x}+{alloc.size} cannot be registered: it must start "
                                 f"on a 64 KiB boundary and hold at least 64 KiB")
            t0 = time.perf_counter()
            r = self.ctl.register(self.vendor, self.device, alloc.export(), size)
            self.register_seconds += time.perf_counter() - t0
            e = Entry(r.id, alloc.base, size, alloc.key, r.transport_name)
            self._by_base[alloc.base] = e
            self.registered += 1
            return e

    def entry(self, base: int) -> Optional[Entry]:
        """The registration of the allocation at base, if any (not made)."""
        return self._by_base.get(base)

    def current(self, e: Entry) -> bool:
        """Whether e is still its allocation's registration (not dropped
        or replaced since get gave it): a caller that remembers entries
        may use one without asking get again."""
        return self._by_base.get(e.base) is e  # one dict lookup: atomic, no lock needed

    def locate(self, alloc: Alloc, ptr: int, nbytes: int) -> Tuple[int, int]:
        """(buffer id, offset) of the nbytes at address ptr in alloc."""
        e = self.get(alloc)
        off = ptr - alloc.base
        if off < 0 or off + nbytes > e.size:
            raise ValueError(f"[{off}, +{nbytes}) of the allocation at {alloc.base:#x} is not inside its "
                             f"registration of {e.size} bytes (the allocation rounded down to 64 KiB)")
        return e.id, off

    def forget(self, base: int) -> None:
        """Deregisters the allocation at base (it is about to be freed)."""
        with self._lock:
            e = self._by_base.get(base)
            if e is not None:
                self._drop(e)

    def prune(self, every: float = 0.0) -> int:
        """Deregisters every allocation that no longer lives (or whose
        address now holds another one); returns how many. every: skip
        when the last prune was less than that many seconds ago (a load
        that starts many requests asks before each; probing every cached
        allocation each time cost as much as the requests' ioctls)."""
        if self.probe is None:
            return 0
        now = time.monotonic()
        if every > 0 and now - self._pruned < every:
            return 0
        self._pruned = now
        n = 0
        with self._lock:
            for e in list(self._by_base.values()):
                if self.probe(e.base) != e.key:
                    self._drop(e)
                    n += 1
        return n

    def __len__(self) -> int:
        return len(self._by_base)

    def _drop(self, e: Entry) -> None:
        del self._by_base[e.base]
        try:
            self.ctl.deregister(e.id)
        except PhxError as err:
            if err.errno not in (errno.ENOENT, errno.ENOTCONN, errno.EBADF):
                raise

    def alive(self) -> bool:
        """The mount this cache registered on still serves it."""
        try:
            st, now = os.fstat(self.ctl.fd), os.stat(self.root)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)

    def close(self) -> None:
        """Releases every registration (the daemon drops the buffers of a
        closed descriptor)."""
        with self._lock:
            self._by_base.clear()
            self.ctl.close()


def mount_root(path: Union[str, os.PathLike]) -> str:
    """The root directory of the file system holding path."""
    p = os.path.realpath(os.fspath(path))
    dev = os.stat(p).st_dev
    if not os.path.isdir(p):
        p = os.path.dirname(p)
    while True:
        parent = os.path.dirname(p)
        if parent == p or os.stat(parent).st_dev != dev:
            return p
        p = parent


_caches: Dict[Tuple[str, int, int], RegCache] = {}
_caches_lock = threading.Lock()


def cache_for(path: Union[str, os.PathLike], vendor: int, device: int,
              probe: Optional[Callable[[int], Optional[int]]] = None) -> RegCache:
    """The process's cache for the mount holding path, vendor and device
    (made on first use; a cache whose mount went away is replaced)."""
    root = mount_root(path)
    k = (root, vendor, device)
    with _caches_lock:
        c = _caches.get(k)
        if c is not None and c.alive():
            return c
        if c is not None:
            c.close()
        c = _caches[k] = RegCache(root, vendor, device, probe)
        return c


def prune_caches() -> int:
    """Lets go of the registrations of freed allocations, in every cache."""
    with _caches_lock:
        caches = list(_caches.values())
    return sum(c.prune() for c in caches)


def close_caches() -> None:
    """Releases every cached registration (also run at exit)."""
    with _caches_lock:
        caches = list(_caches.values())
        _caches.clear()
    for c in caches:
        c.close()


atexit.register(close_caches)

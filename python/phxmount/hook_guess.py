"""get_slice in key order (an engine loading its tensor-parallel rank):
the slices of the next keys are guessed from the last slice asked of the
same role (the name without its layer numbers) and shape, in this file or
the files before, and read while the caller's request is. No torch."""

from __future__ import annotations

import re
import threading
from typing import Dict, List, Optional

from .hook_plan import Ahead, Held, Starts

SLICE_SCAN = 64  # keys ahead a slice's guesses look at
# The guesses a request starts go to the daemon in tasks of about this many
# bytes, not as one: the next slice asked for lands with its own task
# rather than when the whole scan's have (on the emulated device, a first
# file's loop: 15-19 ms against 27-32).
GUESS_TASK = 8 << 20
_NUMBER = re.compile(r"(?<=\.)\d+(?=\.)")


def role(name: str) -> str:
    """A tensor's role: its name with the layer (and expert) numbers taken
    out ("model.layers.#.self_attn.o_proj.weight")."""
    return _NUMBER.sub("#", name)


class RoleMemory:
    """What was last learned of each role and shape for each device, in any
    file. slices_seen holds the last slice asked: an engine loading its
    tensor-parallel rank asks the same slices of every file of a
    checkpoint, so a file's first request starts the guesses of its roles at once, rather than after the first slice of each
    role in that file has been read, one at a time. A file whose own
    requests taught it otherwise follows its own (Guesses.after)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.index: Dict[tuple, object] = {}

    def get(self, role: str, shape: tuple, dev: int):
        # No lock: one dict lookup is atomic, and learn() replaces a value
        # whole (asked per key of every read-ahead).
        return self.index.get((role, shape, dev))

    def learn(self, role: str, shape: tuple, dev: int, index) -> None:
        with self.lock:
            self.index[(role, shape, dev)] = index

    def forget(self) -> None:
        with self.lock:
            self.index.clear()


slices_seen = RoleMemory()


class Guesses:
    """A file's slice guesses: each role's last slice (shape, index), None
    once a guess for it was wrong; the guesses being planned; the guesses
    started are held in the file's Ahead, kind "guess". Shares its file's
    lock."""

    def __init__(self, keys: List[str], shapes: Dict[str, tuple], lock: threading.RLock):
        self.keys, self.lock = keys, lock
        self.index = {n: i for i, n in enumerate(keys)}
        self.roles: Dict[str, Optional[tuple]] = {}
        self.role_of = {n: role(n) for n in keys}
        self.shape_of = shapes
        self.planning: set = set()  # guesses being planned (another thread's scan leaves them)
        self.asked: set = set()

    def after(self, reader, plan, index, dev: int, had: Optional[Held], starts: Starts, ahead: Ahead) -> None:
        """The caller asked plan (name[index]) onto dev, and had is what
        was held ahead for name (taken): the slices of the next keys,
        guessed from the last slice of the same role and shape (in this
        file, or, for a role this file has not been asked for yet, in the
        files before: slices_seen), start while this one is read, as many
        as the window has room for. A guess the caller does not take is
        dropped with the rest of its role's; one this file's own requests
        taught stops the guessing for the role in this file, one the files
        before taught is replaced by what the caller asked."""
        name = plan.name
        with self.lock:
            late = ahead.take(name)
            if late is not None:  # another thread's guess, started after this request took what was held
                reader.drop(late.key)
            rl, shape = self.role_of[name], self.shape_of[name]
            slices_seen.learn(rl, shape, dev, index)
            if had is not None and had.kind == "guess" and had.key != plan.key:
                # Wrong: so are the role's other guesses.
                for k in [k for k, h in ahead.held.items() if h.kind == "guess" and self.role_of[k] == rl]:
                    reader.drop(ahead.take(k).key)
                if rl in self.roles:  # this file's own guess: its slices of the role vary
                    self.roles[rl] = None
                # else the files before guessed it (another rank's, say): this request teaches the file
            if rl in self.roles and self.roles[rl] is None:
                return
            self.roles[rl] = (shape, index)
            items = self._candidates(self.index[name] + 1, dev, starts, ahead)
        self._start(reader, dev, items, ahead)

    def first(self, reader, dev: int, starts: Starts, ahead: Ahead) -> None:
        """Starts the guesses of the first keys onto dev before any was
        asked for (a warm file, hook_next): the slices the files before
        taught (slices_seen), as many as the window has room for."""
        with self.lock:
            items = self._candidates(0, dev, starts, ahead)
        self._start(reader, dev, items, ahead)

    def _start(self, reader, dev: int, items: list, ahead: Ahead) -> None:
        """Plans each (key, index) of items, and starts those still wanted
        that fit the window."""
        plans, room = [], ahead.room()
        for k, idx in items:
            try:
                p = reader.fetcher.plan(k, idx)
            except (IndexError, TypeError, ValueError):
                continue  # the planner does not take it: the request will go to safetensors
            if p.read_bytes > room:
                break
            room -= p.read_bytes
            plans.append(p)
        with self.lock:
            # Started: what is still being planned (neither asked for nor
            # dropped with its role meanwhile) and still fits the window.
            live = {k for k, _ in items if k in self.planning}
            self.planning -= {k for k, _ in items}
            plans = [p for p in plans if p.name in live and
                     ahead.hold(p.name, Held(dev, p.read_bytes, "guess", p.key, p))]
            if plans:  # under the lock: a request that takes a guess finds it started
                reader.prefetch_planned(plans, flush_bytes=GUESS_TASK)

    def _candidates(self, i: int, dev: int, starts: Starts, ahead: Ahead) -> list:
        """(key, index) of the keys from the i-th on whose slices can be
        guessed, each marked as being planned. Under the lock."""
        items = []
        started, deferred = starts.of(dev)
        held = ahead.held
        for k in self.keys[i:i + SLICE_SCAN]:
            if k in held or k in self.planning or k in self.asked or k in started or k in deferred:
                continue
            kr, ks = self.role_of[k], self.shape_of[k]
            if kr in self.roles:
                seen = self.roles[kr]
                idx = seen[1] if seen is not None and seen[0] == ks else None
            else:
                idx = slices_seen.get(kr, ks, dev)
            if idx is not None:
                items.append((k, idx))
                self.planning.add(k)
        return items

    def asking(self, name: str) -> None:
        """A request for name is being made: no scan guesses it (one planning
        its guess leaves it)."""
        with self.lock:
            self.planning.discard(name)
            self.asked.add(name)


def guessed_plan(had: Optional[Held], index):
    """The plan of the guess had, when it guessed index: a request the
    guess answers is not planned again."""
    if had is None or had.kind != "guess" or index is None:
        return None
    try:
        hit = had.plan.index == index
    except Exception:  # noqa: BLE001: an index whose == is not a truth (an array)
        return None
    return had.plan if hit is True else None

"""The drop-in: safetensors' own `safe_open` (and so `safetensors.torch.load_file`,
which calls it) served by phxmount for files on a phxmount mount, with no
change to the program that calls them (docs/python.md says what each call gets).

    PHXMOUNT_HOOK=1 python serve.py     # pip install ./python puts phxmount-hook.pth in
                                        # site-packages: at interpreter start it reads the
                                        # variable, and imports nothing else when it is off
    import phxmount.hook                # in code: the same as PHXMOUNT_HOOK=1
    python -m phxmount check [PATH...]  # what the hook would do here, and why

PHXMOUNT_HOOK is 0/off (or unset), 1/on/auto, or a CUDA device (`cuda`, the
calling thread's current device as torch reads it, or `cuda:N`) that
tensors asked for on the cpu land on.

This module is an exact adapter over the installed safetensors: a call is
bound to the installed safe_open's signature and goes to the real one,
with the caller's own arguments, wherever phxmount does not serve it
(hook_route); a served file's object has the installed one's methods, and
whatever phxmount does not serve of it reaches the real object (get_slice's
answer: hook_slice). Below it:
what starts together (hook_plan), get_tensor's read-ahead (hook_ahead),
get_slice's guesses (hook_guess), sharing PHXMOUNT_HOOK_WINDOW bytes a
file, and the next file of a series started ahead of its open
(hook_next). Nothing fails where safetensors would have worked: whatever
phxmount cannot do is done by the real safetensors, with what the file
read ahead released, and said once on stderr; at exit the hook says what
it did.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
import threading
import weakref
from typing import Callable, Dict, List, Optional

from .hook_ahead import ReadAhead
from .hook_close import Resources, closing
from .hook_defer import Deferrals, RegionReads, uses_seen
from .hook_fileroute import Routed
from .hook_env import ENV, TASK_ENV, WINDOW_ENV, Mode, cuda_index, describe, parse_mode, task, window
from .hook_guess import GUESS_TASK, Guesses, guessed_plan, slices_seen
from .hook_import import Patcher, patch_spawn, unpatch_spawn
from .hook_next import Warming, call_key, next_files
from .hook_plan import Ahead, Held, Starts
from .hook_report import Report, report
from .hook_route import Call, Installed, Stock, decide, if_installed, mounts, served_index
from . import hook_spec
from .hook_slice import HookedSlice
from .hook_whole import read_whole
from .stformat import Header, TensorInfo, read_header
from .slicing import selects_whole

__all__ = ["cuda_index", "safe_open", "install", "uninstall", "install_from_env", "Mode", "parse_mode", "HookedFile", "HookedSlice",
           "report", "Report", "closing", "mounts", "slices_seen", "uses_seen", "describe", "ENV", "WINDOW_ENV", "TASK_ENV", "GUESS_TASK"]


class HookedFile(Routed, Warming):
    """What the hooked safe_open returns for a file on a phxmount mount: the
    interface of the installed safetensors' safe_open, thread-safe, with
    the GPU reads through phxmount (torch_load.open_reader, one per device)
    and every host read, and whatever phxmount does not serve, through the
    real one, opened with the caller's own arguments."""

    def __init__(self, call: Call, device, args: tuple, kwargs: dict, header: Header, fd: Optional[int],
                 installed: Installed, mode: Mode, open_reader: Callable):
        self.path, self.device, self.backend = os.fspath(call.filename), device, call.backend
        self.header, self.mode, self._installed, self._open_reader = header, mode, installed, open_reader
        self._lock = threading.RLock()
        self._real = Stock(installed, args, kwargs, self._lock)
        self._res = Resources(fd, self._lock)
        weakref.finalize(self, self._res.release)
        self.tensors: Dict[str, TensorInfo] = {t.name: t for t in header.tensors}
        self._sorted = sorted(self.tensors)
        self._closed = False
        self._fallen: Optional[BaseException] = None
        self._counted = False  # in report.files
        self.task = task()
        self._starts = Starts(self._lock)
        self._ahead = Ahead(window(), self._lock)
        self._read_ahead = ReadAhead(self._sorted, {n: t.nbytes for n, t in self.tensors.items()}, self._lock)
        self._guesses = Guesses(self._sorted, {t.name: tuple(t.shape) for t in header.tensors}, self._lock)
        self._defer = Deferrals(self._guesses.shape_of, self._guesses.role_of, self._read_ahead.sizes)
        self._regions = RegionReads(self)
        self._args, self._kwargs = args, kwargs
        self.key = call_key(args, kwargs, device)  # what a claim of it as a warm file compares (hook_next)
        self.warming = False  # opened by the hook as the next file of a loop, not claimed yet
        self._warmed = False  # this file warmed its next one
        self._whole: Dict[int, list] = {}  # per device, the Pendings of a warm file's whole start
        self.spec = hook_spec.Speculation()
        hook_spec.open_files.add(self)

    # safetensors' interface
    @if_installed
    def keys(self) -> List[str]:
        return list(self._sorted)

    @if_installed
    def offset_keys(self) -> List[str]:
        return [t.name for t in self.header.tensors]

    @if_installed
    def metadata(self):
        m = self.header.metadata
        return None if m is None else dict(m)

    @if_installed
    def get_slice(self, name: str):
        info = self.tensors.get(name)
        if info is None:
            return self.stock().get_slice(name)  # its own error
        self.spec.sliced.add(name)
        return HookedSlice(self, info)

    @if_installed
    def get_tensor(self, name: str):
        info = self.tensors.get(name)
        dev = self.destination(None)
        if info is None or dev is None:
            return self.stock().get_tensor(name)
        had = self._take(name)  # before the read-ahead counts the window's room
        t = src = None  # a deferred tensor (hook_defer), made before the read-ahead asks what it reads whole
        if had is not None and had.kind == "deferred":
            t = self._regions.hand(info, dev, had)  # its region read ahead
            had = None
        elif (had is None or had.kind == "guess") and self._defer.wants(name, dev):
            made = self._regions.make(info, dev)
            if made is not None:
                t, src = made
                self._drop(name, had)  # a slice guessed for it: the deferred tensor reads its own
                self._defer.handed(t)
        if t is None:
            self.defer(dev, name)
        self._regions.ahead_of(name, dev, src)
        if t is None:  # the next file starts once this one's reads have (hook_next)
            return self._gpu(info, None, dev, had, lambda: self.warm_next_after_read_ahead(dev))
        self.warm_next_after_read_ahead(dev)
        return t

    @staticmethod
    def open_next(args: tuple, kwargs: dict) -> Optional["HookedFile"]:
        """The hook's own open of the next file of a loop (hook_next):
        marked warming until the caller claims it."""
        inst = _installed
        f = _open(inst, args, kwargs, ahead=True) if inst is not None else None
        if f is not None:
            f.warming = True
        return f

    @if_installed
    def get_tensors(self):
        dev = self.destination(None)
        if dev is None:
            return self.stock().get_tensors()
        names = [t.name for t in self.header.tensors]
        with self._lock:
            warm = self._whole.pop(dev, None)  # started whole as a warm file (hook_next)
            fresh = warm is None and not self._ahead.held and not any(self._starts.of(dev))
        if warm is not None or fresh:
            return self._whole_file(dev, names, warm)
        for n in names:
            self.defer(dev, n)
        return {n: self._gpu(self.tensors[n], None, dev, self._take(n)) for n in names}

    def _whole_file(self, dev: int, names: List[str], pends: Optional[list] = None) -> dict:
        """Every tensor of a file nothing was read of yet (load_file), or
        started whole as a warm file (pends): hook_whole.read_whole; the
        next file of its series starts once this one's reads have."""
        return read_whole(self, dev, names, pends, lambda: self._warm_next(lambda g: g.warm_whole(dev)))

    @if_installed
    def close(self) -> None:
        self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._close()
        return False

    def _close(self) -> None:
        """Closes the file (_let_go) and the real object, if opened."""
        with self._lock:
            self._closed = True
        self._let_go()
        self._real.close()
        next_files.closed(self.path)

    discard = _close  # the hook's own close of a warm file nobody claimed (hook_next)

    def _let_go(self) -> None:
        """Drops what the file read ahead (its memory is free once its reads
        have returned) and closes its readers' descriptors of the mount on
        a thread of their own (hook_close)."""
        with self._lock:
            self._ahead.clear()
            self._starts.clear()
            self._whole.clear()
        self._res.release()

    def defer(self, dev: int, name: str) -> None:
        """name will be read onto dev: it starts with the next read there."""
        self._starts.defer(dev, name)

    def bind(self, dev: int, name: str) -> None:
        """name goes to dev in the file's dtype (hook_slice.bind): it starts with the
        next read onto dev of any file (hook_spec.open_files), or now (hook_spec)."""
        self._starts.defer(dev, name)
        hook_spec.open_files.bind(self, dev)
        hook_spec.bound(self, dev, name)

    def unbind(self, name: str) -> None:
        """name goes elsewhere (the host, another dtype): hook_spec.unbound."""
        hook_spec.unbound(self, name)

    def start_deferred(self, dev: int) -> None:
        """Starts what is deferred onto dev (hook_spec: its binds); a
        failure makes this file safetensors'."""
        if self._closed or self.destination(dev) != dev:
            return
        try:
            self._ahead.started(self._starts.start(self._reader(dev), dev, self.task))
        except Exception as e:  # noqa: BLE001: never fail where safetensors works
            self._fall_back(e)

    def read_slice(self, info: TensorInfo, index, bound: Optional[int]):
        dev = self.destination(bound)
        if dev is None:
            return self.stock_slice(info.name)[index]
        if not served_index(index, info.shape, self.backend):
            return self.stock_slice(info.name)[index].to(f"cuda:{dev}")
        had = self._take(info.name)
        if index is not None and had is None and self._starts.reads(dev, info.name) and selects_whole(index, info.shape):
            # The whole tensor, its read started with the file's (what
            # transformers binds it asks with [...], from a pool of
            # threads): that read, its plan made once, no slice guessed.
            return self._gpu(info, None, dev, None)
        t = self._gpu(info, (None,) if index is None else index, dev, had)  # [None]: a new axis
        if not self._warmed and index is not None and 2 * self._guesses.index[info.name] >= len(self._sorted):
            self._warm_next(lambda g: g.warm_slices(dev))  # half way: the roles' slices are known
        return t

    def _take(self, name: str) -> Optional[Held]:
        """What was read ahead for name: the caller's now (or dropped)."""
        with self._lock:
            self._guesses.asking(name)
            return self._ahead.take(name)

    def _gpu(self, info: TensorInfo, index, dev: int, had: Optional[Held], started: Optional[Callable] = None):
        """info[index] on dev through phxmount (had: what was read ahead for
        it; started(), when given, runs once its read and those deferred
        are under way); the real safetensors (and a copy to dev) where
        phxmount cannot, and for an index phxmount's planner does not take
        (safetensors' own answer, or its error)."""
        report.asked()
        try:
            reader = self._reader(dev)
        except Exception as e:  # noqa: BLE001: never fail where safetensors works
            self._fall_back(e)
            return self._stock_to(info, index, dev)
        try:
            plan = guessed_plan(had, index) or reader.fetcher.plan(info.name, index)
        except (IndexError, TypeError, ValueError):
            self._drop(info.name, had)
            return self._stock_to(info, index, dev)
        try:
            # Not under the file's lock: a whole file's start plans and
            # allocates hundreds of tensors, and the other threads of a
            # pool (transformers') would wait for it in every _take.
            self._ahead.started(self._starts.start(reader, dev, self.task))
            for g in hook_spec.open_files.bound_to(dev):  # the other files' bound tensors, after this one's
                if g is not self:
                    g.start_deferred(dev)
            then = started if index is None else (
                lambda: self._guesses.after(reader, plan, index, dev, had, self._starts, self._ahead))
            t, at = reader.get_planned_at(plan, then)
        except Exception as e:  # noqa: BLE001
            self._fall_back(e)
            return self._stock_to(info, index, dev)
        if had is not None and had.key != plan.key:
            self._drop(info.name, had)  # read ahead whole, asked as a slice (or guessed wrong)
        report.landed(dev, t.nbytes, at=at)
        return t

    def _drop(self, name: str, had: Optional[Held]) -> None:
        """Lets go of a read held ahead that the caller will not take."""
        if had is None:
            return
        with self._lock:
            self._starts.deferred.get(had.dev, {}).pop(name, None)
            r = self._res.readers.get(had.dev)
        if r is not None and had.key is not None:
            r.drop(had.key)

    def _reader(self, dev: int):
        r = self._res.opened(dev)
        if r is not None:
            return r
        r, new = self._res.reader(dev, lambda fd: self._open_new(dev, fd), lambda: self._fallen)
        if new:
            with self._lock:
                first, self._counted = not self._counted, True
            if first and not self.warming:  # a warm file counts when claimed
                report.opened()
            report.say("engaged", f"{self.path}: tensors for cuda:{dev} through phxmount "
                                  f"({self._transport}); {describe(self.mode)}")
        return r


# --- the hooked functions ---------------------------------------------------------------

_installed: Optional[Installed] = None  # the real safe_open, as the hook adapts it
_mode = Mode(False)


def safe_open(*args, **kwargs):
    """safetensors.safe_open, served by phxmount where it can (see the
    module's doc); every other call gets the installed safetensors' own,
    with exactly the caller's arguments."""
    inst = _installed
    if inst is None:
        raise RuntimeError("phxmount.hook.safe_open: the hook found no safetensors (phxmount.hook.install)")
    f = None
    try:
        f = _open(inst, args, kwargs)
    except Exception as e:  # noqa: BLE001: the real one decides what is an error
        report.fell_back(str(args[0] if args else kwargs.get("filename")), e)
    return f if f is not None else inst.real(*args, **kwargs)


def _open(inst: Installed, args: tuple, kwargs: dict, ahead: bool = False) -> Optional[HookedFile]:
    """The hooked file for the caller's safe_open (None: the real one
    serves it); ahead: the hook's own open of a file ahead of the caller
    (hook_next), which claims no warm file and forgets none."""
    try:
        call = inst.bind(args, kwargs)
    except TypeError:
        return None  # the installed safe_open refuses the call: its own error
    r = decide(dataclasses.replace(call, others=()), _mode, "transformers" in sys.modules)
    if not r.serve:
        if not ahead:
            next_files.forget()  # the caller moved on: a warm file is nobody's
        return None
    warm = None if ahead else next_files.claim(os.fspath(call.filename), call_key(args, kwargs, r.device))
    if warm is not None:
        warm.claimed()
        return warm
    fd = mounts.open_if_phxmount(os.fspath(call.filename))
    if fd is None:
        return None
    if call.others:  # a file phxmount would serve, and an argument it does not know
        os.close(fd)
        why = decide(call, _mode, True).why
        report.say(f"others {call.others}", f"{call.filename}: {why}: safetensors reads it" +
                   (f" (the installed safe_open's signature was not read: {inst.unread})" if inst.unread else ""))
        return None
    try:
        header = read_header(fd)
    except BaseException:
        os.close(fd)
        raise
    return HookedFile(call, r.device, args, kwargs, header, fd, inst, _mode, _open_reader)


def _open_reader(path: str, dev: int, availability=None, header=None, fd=None):
    from .torch_load import open_reader
    return open_reader(path, dev, owned=True, availability=availability, header=header, fd=fd)


# --- installing -------------------------------------------------------------------------

def _patch_safetensors(mod) -> None:
    global _installed
    real = getattr(mod, "safe_open", None)
    if real is None or real is safe_open:
        return
    real = _patches.replace("safe_open", real, safe_open)
    if _installed is None or _installed.real is not real:
        _installed = Installed(real, str(getattr(mod, "__version__", "?")))


# The real extension module keeps its own; so does this one.
_patches = Patcher({"safetensors": _patch_safetensors,
                    "transformers.core_model_loading": lambda m: patch_spawn(m, lambda t: isinstance(t, HookedSlice))},
                   skip=("safetensors._safetensors_rust", __name__))
atexit.register(lambda: report.at_exit())


def install(mode: Optional[Mode] = None) -> Mode:
    """Turns the hook on (idempotent): patches safetensors and transformers
    now if they are imported, else as soon as they are."""
    global _mode
    _mode = mode or Mode(True)
    _patches.on()
    return _mode


def uninstall() -> None:
    """Turns the hook off and puts the real functions back (tests)."""
    global _mode, _installed
    _mode, _installed = Mode(False), None
    hook_spec.open_files.forget()
    next_files.forget()
    slices_seen.forget()
    uses_seen.forget()
    _patches.off({"safe_open": safe_open})
    unpatch_spawn(sys.modules.get("transformers.core_model_loading"))


def install_from_env() -> None:
    """What phxmount-hook.pth runs at interpreter start when PHXMOUNT_HOOK
    is set: never fails the interpreter."""
    try:
        mode = parse_mode(os.environ.get(ENV))
    except ValueError as e:
        print(f"phxmount hook: {e}: the hook is off", file=sys.stderr)
        return
    if mode.on:
        install(mode)


# `import phxmount.hook` turns the hook on, unless PHXMOUNT_HOOK says
# otherwise (PHXMOUNT_HOOK=0 turns it off without a change to the code).
if ENV in os.environ:
    install_from_env()
else:
    install()

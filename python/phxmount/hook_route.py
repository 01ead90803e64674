"""Which safe_open calls the hook serves, read as the installed safetensors
reads them: a PyTorch file on a phxmount mount, read onto a CUDA device (or
the CPU, where a loader or PHXMOUNT_HOOK says the tensors go to a GPU).
Every other call, every argument phxmount does not know, and every index
whose meaning it cannot be sure of are the real safetensors'. No torch."""

from __future__ import annotations

import errno
import inspect
import os
import threading
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from .availability import NOT_A_MOUNT
from .hook_env import Mode, safetensors_device
from .hook_report import report

FUSE_SUPER_MAGIC = 0x65735546
PT = ("pt", "torch", "pytorch")  # safetensors' names of PyTorch (it matches them exactly)
BACKENDS = ("mmap", "pread")  # safetensors 0.8's; phxmount reads through the mount either way
SERVED = ("filename", "framework", "device", "backend")
# safetensors' defaults, where its signature shows none (pyo3 shows `...`).
DEFAULTS = {"device": "cpu", "backend": "mmap"}
_P = inspect.Parameter
# Where the installed signature cannot be read: the oldest one, and any
# other keyword (backend= too) is the real one's to take or refuse.
OLDEST = inspect.Signature([_P("filename", _P.POSITIONAL_OR_KEYWORD), _P("framework", _P.POSITIONAL_OR_KEYWORD),
                            _P("device", _P.POSITIONAL_OR_KEYWORD, default="cpu"), _P("others", _P.VAR_KEYWORD)])


@dataclass(frozen=True)
class Call:
    """A safe_open call as the installed safetensors binds it."""
    filename: object
    framework: object
    device: object
    backend: object
    others: Tuple[str, ...] = ()  # arguments the caller passed that phxmount does not serve


class Installed:
    """The installed safetensors' safe_open, as the hook adapts it: the
    signature its calls are bound to (inspect's, where it can read it: a
    pyo3 class shows its text signature) and the methods its objects have
    (dir of the class; None: a function, whose objects' methods are known
    only once one is open)."""

    def __init__(self, real, version: str = "?"):
        self.real, self.version = real, version
        self.signature, self.unread = OLDEST, ""
        try:
            sig = inspect.signature(real)
            if "filename" in sig.parameters and "framework" in sig.parameters:
                self.signature = sig
            else:
                self.unread = f"it takes {sig}"
        except (TypeError, ValueError) as e:
            self.unread = f"{e.__class__.__name__}: {e}"
        self.methods = frozenset(dir(real)) if isinstance(real, type) else None

    def has(self, method: str) -> bool:
        return self.methods is None or method in self.methods

    def bind(self, args, kwargs) -> Call:
        """The call, bound as the installed signature binds it (a TypeError
        where it would refuse it: the real one then says so itself)."""
        sig = self.signature
        ba = sig.bind(*args, **kwargs)
        passed: Dict[str, object] = {}
        others = []
        for name, value in ba.arguments.items():
            kind = sig.parameters[name].kind
            if kind is _P.VAR_KEYWORD:
                others += sorted(value)
            elif kind is _P.VAR_POSITIONAL:
                others += [f"*{name}"] if value else []
            elif name in SERVED:
                passed[name] = value
            else:
                others.append(name)

        def value(name):
            if name in passed:
                return passed[name]
            p = sig.parameters.get(name)
            if p is None or p.default is _P.empty or p.default is Ellipsis:
                return DEFAULTS.get(name)
            return p.default
        return Call(value("filename"), value("framework"), value("device"), value("backend"), tuple(others))

    def describe(self) -> str:
        s = f"safe_open{self.signature}" if not self.unread else f"safe_open (signature not read: {self.unread})"
        return s + ("" if self.methods is None else
                    "; methods " + ", ".join(sorted(m for m in self.methods if not m.startswith("_"))))


class Stock:
    """The real safetensors object of a hooked file: opened at first need
    with the caller's own arguments and closed with the file; one closed
    (what safetensors answers once the file is closed); its slices, which
    outlive it. Shares its file's lock."""

    def __init__(self, installed: Installed, args: tuple, kwargs: dict, lock):
        self.installed, self.args, self.kwargs, self.lock = installed, args, kwargs, lock
        self.obj = self.closed_obj = None

    def _new(self):
        return self.installed.real(*self.args, **self.kwargs)

    def open(self):
        with self.lock:
            if self.obj is None:
                self.obj = self._new()
            return self.obj

    def closed(self):
        with self.lock:
            if self.closed_obj is None:
                s = self._new()
                s.__exit__(None, None, None)
                self.closed_obj = s
            return self.closed_obj

    def slice(self, name: str, file_closed: bool):
        if not file_closed:
            return self.open().get_slice(name)
        s = self._new()
        try:
            return s.get_slice(name)
        finally:
            s.__exit__(None, None, None)

    def close(self) -> None:
        with self.lock:
            s, self.obj = self.obj, None
        if s is not None:
            s.__exit__(None, None, None)


@dataclass(frozen=True)
class Route:
    """What the hook does with a call: serve it (device: "cpu" or the
    CUDA ordinal safetensors reads its device argument as) or not, and why."""
    serve: bool
    why: str
    device: object = None


def decide(call: Call, mode: Mode, loader_binds: bool) -> Route:
    """Whether the hook serves call, from its arguments alone (the file's
    mount is asked next: Mounts). loader_binds: a loader that tells each
    tensor's device is imported (transformers)."""
    if call.others:
        return Route(False, f"argument {', '.join(call.others)} of the installed safe_open is not phxmount's to serve")
    if not isinstance(call.framework, str) or call.framework not in PT:
        return Route(False, f"framework {call.framework!r}: phxmount serves PyTorch's ({', '.join(PT)})")
    dev = safetensors_device(call.device)
    if dev is None:
        return Route(False, f"device {call.device!r}: neither the cpu nor a CUDA device as safetensors names them")
    if call.backend not in BACKENDS:
        return Route(False, f"backend {call.backend!r}: not one phxmount knows ({', '.join(BACKENDS)})")
    if dev == "cpu" and mode.cpu_to is None and not loader_binds:
        return Route(False, "device 'cpu': host tensors, and no loader that says they go to a GPU "
                            "(PHXMOUNT_HOOK=cuda sends them to one)")
    try:
        path = os.fspath(call.filename)
    except TypeError:
        return Route(False, f"filename {call.filename!r}: not a path")
    if not isinstance(path, str) or not os.path.isfile(path):
        return Route(False, f"{path!r}: not a regular file")
    return Route(True, "a PyTorch file for " + ("the cpu" if dev == "cpu" else f"cuda:{dev}"), dev)


def served_index(index, shape, backend: str) -> bool:
    """Whether phxmount's planner gives what the installed safetensors
    gives for get_slice(name)[index]: no step (safetensors' answer to a
    stepped slice differs between releases and backends); with the mmap
    backend safetensors indexes a torch view (the planner's rules), with
    another it indexes with its own rules, which agree with torch's only on
    ints in range and step-less slices within the shape."""
    items = index if isinstance(index, tuple) else (index,)
    if any(isinstance(x, slice) and x.step not in (None, 1) for x in items):
        return False
    if backend == "mmap":
        return True
    if isinstance(index, list) or len(items) > len(shape):
        return False
    for x, n in zip(items, shape):
        if isinstance(x, int) and not isinstance(x, bool):
            if not -n <= x < n:
                return False
        elif isinstance(x, slice):
            a, b = x.start, x.stop
            if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in (a, b)):
                return False
            a, b = 0 if a is None else a, n if b is None else b
            if not 0 <= a < n or not a <= b <= n:
                return False
        else:
            return False
    return True


class Mounts:
    """Whether a file is on a phxmount mount (one INFO ioctl per file
    system, remembered by st_dev). What the INFO ioctl of another file
    system answers (ENOTTY and the like) is remembered; a failure (EIO, a
    daemon going away) is said on stderr, once for its errno and file
    system, and asked again at the next file. Whether a device of this
    process can load from a mount is availability.known's to remember."""

    def __init__(self):
        self.lock = threading.Lock()
        self.phx: Dict[int, bool] = {}

    def open_if_phxmount(self, path: str) -> Optional[int]:
        """A read-only descriptor of path when it is on a phxmount mount
        (the caller's to close), else None. A file system is asked once,
        with an INFO ioctl on that descriptor: an open of a file on a FUSE
        mount is a round trip to its daemon, made once here."""
        dev = os.stat(path).st_dev
        with self.lock:
            known = self.phx.get(dev)
        if known is False:
            return None
        if known is None:
            fstype = statfs_type(path)
            if fstype != FUSE_SUPER_MAGIC:
                if fstype is not None:  # statfs answered: not FUSE
                    with self.lock:
                        self.phx[dev] = False
                return None
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        if known is None:
            known = self._ask(path, dev, fd)
            if known is not None:
                with self.lock:
                    self.phx[dev] = known
            if not known:
                os.close(fd)
                return None
        return fd

    @staticmethod
    def _ask(path: str, dev: int, fd: int) -> Optional[bool]:
        """INFO on fd: True (a phxmount mount), False (a file system that
        is not one), None (the ioctl failed: said, and not remembered)."""
        from .client import PhxError, PhxFile
        try:
            PhxFile(fd).info(0)  # the caller's descriptor, left open
            return True
        except (OSError, PhxError) as e:
            if e.errno in NOT_A_MOUNT:
                return False
            name = errno.errorcode.get(e.errno, str(e.errno))
            report.say(f"info {dev} {e.errno}",
                       f"{path}: the INFO ioctl failed with {name} ({e.strerror or e}): reading it with "
                       f"safetensors; the next file on this file system asks again")
            return None

    def forget(self) -> None:
        with self.lock:
            self.phx.clear()


def statfs_type(path: str) -> Optional[int]:
    """statfs(2)'s f_type (None when it cannot be read): FUSE or not,
    without opening the file."""
    import ctypes
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on x86-64
    # The process's own libc (find_library would run ldconfig: tens of ms).
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.statfs(os.fsencode(path), buf) != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


mounts = Mounts()


class if_installed:  # noqa: N801: a decorator
    """A method of safetensors' safe_open that phxmount serves, there only
    where the installed safe_open has it (offset_keys came in safetensors
    0.6, get_tensors in 0.8): elsewhere an AttributeError, as the real
    object's. On a closed file, the real object's answer once closed.
    Decorates HookedFile's methods (_installed, _closed, _real: a Stock)."""

    def __init__(self, fn):
        self.fn, self.name = fn, fn.__name__

    def __get__(self, obj, cls=None):
        if obj is None:
            return self.fn
        if not obj._installed.has(self.name):
            raise AttributeError(f"'safe_open' object has no attribute {self.name!r}")
        if obj._closed:  # safetensors' error, as a rule
            return getattr(obj._real.closed(), self.name)
        return self.fn.__get__(obj, cls)


def stock_attr(get_stock: Callable, name: str, on_call: Callable):
    """name of the real object: as it is, or, where it is a method, one
    that calls on_call(name) first (which says so)."""
    attr = getattr(get_stock(), name)
    if not callable(attr):
        return attr

    def forwarded(*args, **kwargs):
        on_call(name)
        return getattr(get_stock(), name)(*args, **kwargs)
    return forwarded

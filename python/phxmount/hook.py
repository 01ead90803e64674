"""The drop-in: safetensors' own `safe_open` (and so `safetensors.torch.load_file`,
which calls it) served by phxmount for files on a phxmount mount, with no
change to the program that calls them.

Turning it on:
    PHXMOUNT_HOOK=1 python serve.py     # pip install ./python puts phxmount-hook.pth
                                        # in site-packages; it reads the variable at
                                        # interpreter start and imports nothing else
    import phxmount.hook                # in code: the same as PHXMOUNT_HOOK=1

PHXMOUNT_HOOK is 0/off (or unset), 1/on/auto, or a CUDA device: `cuda` (the
calling thread's current device) or `cuda:N`.

What a call safe_open(path, framework, device, backend=...) gets:
* the real safetensors, untouched, for a file off a phxmount mount, a
  framework other than PyTorch's, a device that is neither CUDA nor the
  CPU, or a mount whose device is not an NVIDIA GPU;
* device "cuda", "cuda:N" or N: tensors that land in that GPU's memory
  through the mount;
* device "cpu": host tensors from the real safetensors, except where the
  hook knows that the caller moves them to a GPU anyway:
    - transformers' from_pretrained tells its loader each tensor's device
      and dtype (core_model_loading.spawn_materialize); a tensor bound for
      a GPU in its own dtype lands there, and the .to() that follows has
      nothing left to do;
    - with PHXMOUNT_HOOK=cuda or cuda:N, every tensor asked for on the CPU
      lands on that GPU: for loaders that copy each tensor into GPU
      parameters (vLLM's and SGLang's default loaders), which must then
      accept CUDA tensors.
A reader that will read the whole file gets one plan for it at its first
read: get_tensors (load_file), or transformers, which asks for a slice of
every tensor before it reads any (the tensors bound to one GPU so far start
together), in tasks of PHXMOUNT_HOOK_TASK bytes (default 128 MiB) so that
the first tensors land first. get_tensor in key order reads ahead
PHXMOUNT_HOOK_WINDOW bytes (default 1 GiB) of the next tensors; get_slice
in key order (an engine loading its tensor-parallel rank) reads ahead the
slices it will ask for, guessed from the last slice of each role (a name
without its layer numbers) and shape, in this file or the ones before: a
wrong guess is dropped, and one the file's own requests taught is not made
again for that role in that file.

Nothing fails where safetensors would have worked: whatever phxmount cannot
do (no CUDA driver here, a registration refused, a read error) is done by
the real safetensors instead, and said once on stderr. The hook says once,
at its first file, what it does, and at exit what it did.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import os
import re
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from .stformat import Header, TensorInfo, read_header

ENV = "PHXMOUNT_HOOK"
WINDOW_ENV = "PHXMOUNT_HOOK_WINDOW"
DEFAULT_WINDOW = 1 << 30
# What starts together (a window of get_tensor's read-ahead, every tensor
# transformers bound) goes to the daemon in tasks of this many bytes
# (default Fetcher.in_order_task).
TASK_ENV = "PHXMOUNT_HOOK_TASK"
SLICE_SCAN = 64  # keys ahead a slice's guesses look at
# The guesses a request starts go to the daemon in tasks of about this many
# bytes, not as one: the next slice asked for lands with its own task
# rather than when the whole scan's have (on the emulated device, a first
# file's loop: 15-19 ms against 27-32).
GUESS_TASK = 8 << 20
_NUMBER = re.compile(r"(?<=\.)\d+(?=\.)")
FUSE_SUPER_MAGIC = 0x65735546
_PT = ("pt", "torch", "pytorch")


@dataclass(frozen=True)
class Mode:
    """What PHXMOUNT_HOOK asks for: on or off, and where tensors asked for
    on the CPU go (None: they stay host tensors)."""
    on: bool
    cpu_to: Optional[str] = None


def parse_mode(value: Optional[str]) -> Mode:
    v = (value or "").strip().lower()
    if v in ("", "0", "off", "no", "false"):
        return Mode(False)
    if v in ("1", "on", "yes", "true", "auto"):
        return Mode(True)
    if v == "cuda" or re.fullmatch(r"cuda:\d+", v):
        return Mode(True, v)
    raise ValueError(f"{ENV}={value!r}: want 0, 1 (auto), cuda or cuda:N")


# --- saying what happened -------------------------------------------------------

class Report:
    """What the hook did in this process: said once per kind of event on
    stderr, and summed up at exit."""

    def __init__(self, out=None):
        self.out = out
        self.lock = threading.Lock()
        self.said = set()
        self.files = self.tensors = self.bytes = self.fallbacks = self.starts = 0
        self.devices = set()
        self.first = self.last = None  # perf_counter of the first read asked for, and the last landed

    def say(self, key: str, msg: str) -> None:
        with self.lock:
            if key in self.said:
                return
            self.said.add(key)
        print(f"phxmount hook: {msg}", file=self.out or sys.stderr, flush=True)

    def asked(self) -> None:
        with self.lock:
            if self.first is None:
                self.first = time.perf_counter()

    def started(self) -> None:
        with self.lock:
            self.starts += 1

    def landed(self, dev: int, nbytes: int) -> None:
        with self.lock:
            self.tensors += 1
            self.bytes += nbytes
            self.devices.add(dev)
            self.last = time.perf_counter()

    def fell_back(self, path: str, why: BaseException) -> None:
        with self.lock:
            self.fallbacks += 1
        self.say(f"fallback {why.__class__.__name__}: {why}",
                 f"{path}: {why}; reading it with safetensors instead")

    def summary(self) -> str:
        with self.lock:
            devs = ", ".join(f"cuda:{d}" for d in sorted(self.devices)) or "no GPU"
            span = ""
            if self.first is not None and self.last is not None and self.last > self.first:
                secs = self.last - self.first
                span = (f" in {secs:.3f} s from the first read asked for to the last landed "
                        f"({self.bytes / secs / 1e9:.1f} GB/s)")
            return (f"{self.files} file(s) through phxmount, {self.tensors} tensor(s), "
                    f"{self.bytes / 1e9:.2f} GB onto {devs}{span}, {self.starts} start(s); "
                    f"{self.fallbacks} fallback(s) to safetensors")


report = Report()


def _at_exit() -> None:
    if report.files or report.fallbacks:
        print(f"phxmount hook: {report.summary()}", file=report.out or sys.stderr, flush=True)


# --- devices --------------------------------------------------------------------

def cuda_index(device) -> Optional[int]:
    """The CUDA ordinal device names (an int, "cuda", "cuda:N", a torch
    device), or None when it names no CUDA device."""
    if isinstance(device, bool):
        return None
    if isinstance(device, int):
        return device if device >= 0 else None
    s = str(device).strip().lower()
    m = re.fullmatch(r"cuda(?::(\d+))?", s)
    if not m:
        return None
    if m.group(1) is not None:
        return int(m.group(1))
    import torch
    return torch.cuda.current_device()


def is_cpu(device) -> bool:
    return device is None or str(device).strip().lower() == "cpu"


# --- which files are phxmount's ----------------------------------------------------

class Mounts:
    """Whether a file is on a phxmount mount (one INFO ioctl per file
    system, remembered by st_dev). Whether a device of this process can
    load from it is availability.known's to remember."""

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
        if known is None and _statfs_type(path) != FUSE_SUPER_MAGIC:
            with self.lock:
                self.phx[dev] = False
            return None
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        if known is None:
            known = _answers_info(fd)
            with self.lock:
                self.phx[dev] = known
            if not known:
                os.close(fd)
                return None
        return fd


def _statfs_type(path: str) -> int:
    """statfs(2)'s f_type (0 when it cannot be read): FUSE or not, without
    opening the file."""
    import ctypes
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on x86-64
    # The process's own libc (find_library would run ldconfig: tens of ms).
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.statfs(os.fsencode(path), buf) != 0:
        return 0
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def _answers_info(fd: int) -> bool:
    from .client import PhxError, PhxFile
    try:
        PhxFile(fd).info(0)  # the caller's descriptor, left open
        return True
    except (OSError, PhxError):
        return False


mounts = Mounts()


# --- the hooked objects -------------------------------------------------------------

class HookedSlice:
    """get_slice's answer: shape and dtype from the header; an index reads
    through phxmount when the tensor goes to a GPU, else through the real
    safetensors slice."""

    def __init__(self, file: "HookedFile", info: TensorInfo):
        self._file, self._info = file, info
        self._bound: Optional[int] = None

    def get_shape(self) -> List[int]:
        return list(self._info.shape)

    def get_dtype(self) -> str:
        return self._info.dtype

    def bind(self, device, dtype=None) -> None:
        """Where the caller will move the tensor (transformers says so):
        a GPU in the file's own dtype lands there directly."""
        dev = cuda_index(device) if not is_cpu(device) else None
        if dev is None:
            return
        self._bound = dev
        if dtype is None or _same_dtype(dtype, self._info.dtype):
            self._file.defer(dev, self._info.name)

    def __getitem__(self, index):
        return self._file.read_slice(self._info, index, self._bound)

    def __getattr__(self, name):
        return getattr(self._file.stock().get_slice(self._info.name), name)


def _same_dtype(dtype, st_dtype: str) -> bool:
    from .dtypes import torch_dtype
    try:
        return dtype == torch_dtype(st_dtype)
    except TypeError:
        return False


class HookedFile:
    """What the hooked safe_open returns for a file on a phxmount mount: the
    interface of safetensors' safe_open, thread-safe, with the GPU reads
    through phxmount (torch_load.open_reader, one per device) and every
    host read, and whatever phxmount could not do, through the real one."""

    def __init__(self, path: str, framework: str, device, backend: str, header: Header, mode: Mode,
                 real: Callable, open_reader: Callable, fd: Optional[int] = None):
        self.path, self.framework, self.device, self.backend = path, framework, device, backend
        self.header, self.mode, self._real, self._open_reader = header, mode, real, open_reader
        # The descriptor the header was read from (None: none kept): each
        # reader reads on a duplicate of it, as an open of a file on the
        # mount is a FUSE round trip and a dup is not. Closed by close(),
        # or when the file is collected unclosed.
        self._fd = [fd]
        weakref.finalize(self, _close_fd, self._fd)
        self.tensors: Dict[str, TensorInfo] = {t.name: t for t in header.tensors}
        self._sorted = sorted(self.tensors)
        self._lock = threading.RLock()
        self._stock = None
        self._readers: Dict[int, object] = {}
        self._deferred: Dict[int, Dict[str, None]] = {}  # per device, in order
        self._started: Dict[int, set] = {}
        self._fallen: Optional[BaseException] = None
        self._counted = False  # in report.files
        self._index = {n: i for i, n in enumerate(self._sorted)}
        self._expect = 0  # get_tensor in key order: the index of the next key
        self._ahead_to = 0  # keys before this index have been read ahead
        self.window = int(os.environ.get(WINDOW_ENV, DEFAULT_WINDOW))
        self.task = int(os.environ.get(TASK_ENV, 0))  # 0: the reader's (Fetcher.in_order_task)
        # Slices read ahead (_slices_ahead): each role's last slice (shape,
        # index), None once a guess for it was wrong; the guesses started
        # and not yet asked for, by name: (plan key, bytes).
        self._roles: Dict[str, Optional[tuple]] = {}
        self._role_of = {n: _role(n) for n in self._sorted}
        self._shape_of = {t.name: tuple(t.shape) for t in header.tensors}
        self._guessed: Dict[str, tuple] = {}
        self._guessed_bytes = 0
        self._asked: set = set()

    # safetensors' interface
    def keys(self) -> List[str]:
        return list(self._sorted)

    def offset_keys(self) -> List[str]:
        return [t.name for t in self.header.tensors]

    def metadata(self):
        return dict(self.header.metadata) or None

    def get_slice(self, name: str):
        info = self.tensors.get(name)
        if info is None:
            return self.stock().get_slice(name)  # its own error
        return HookedSlice(self, info)

    def get_tensor(self, name: str):
        info = self.tensors.get(name)
        dev = self.destination(None)
        if info is None or dev is None:
            return self.stock().get_tensor(name)
        self.defer(dev, name)
        self._read_ahead(name, dev)
        return self._gpu(info, None, dev)

    def get_tensors(self):
        dev = self.destination(None)
        if dev is None:
            return self.stock().get_tensors()
        names = self.offset_keys()
        for n in names:
            self.defer(dev, n)
        return {n: self._gpu(self.tensors[n], None, dev) for n in names}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        """Closes the file; the readers' descriptors of the mount close on
        a thread of their own (a close is a FLUSH the daemon answers after
        the ioctls queued before it: the caller need not wait for that)."""
        with self._lock:
            readers, self._readers = list(self._readers.values()), {}
            stock, self._stock = self._stock, None
            fd, self._fd[0] = self._fd[0], None
        if readers or fd is not None:
            closing.run(lambda: ([r.close() for r in readers], _close_fd([fd])))
        if stock is not None:
            stock.__exit__(None, None, None)

    def __getattr__(self, name):
        return getattr(self.stock(), name)

    # routing
    def stock(self):
        """The real safetensors handle of the file, opened at first need."""
        with self._lock:
            if self._stock is None:
                self._stock = self._real(self.path, self.framework, device=self.device, backend=self.backend)
            return self._stock

    def destination(self, bound: Optional[int]) -> Optional[int]:
        """The GPU a read lands on: the device the file was opened for, or
        where the caller said it goes, or PHXMOUNT_HOOK's; None: the host."""
        if self._fallen is not None:
            return None
        if not is_cpu(self.device):
            return cuda_index(self.device)
        if bound is not None:
            return bound
        if self.mode.cpu_to is not None:
            return cuda_index(self.mode.cpu_to)
        return None

    def defer(self, dev: int, name: str) -> None:
        """name will be read onto dev: it starts with the next read there."""
        with self._lock:
            if name not in self._started.get(dev, ()):
                self._deferred.setdefault(dev, {})[name] = None

    def read_slice(self, info: TensorInfo, index, bound: Optional[int]):
        dev = self.destination(bound)
        if dev is None:
            return self.stock().get_slice(info.name)[index]
        return self._gpu(info, index, dev)

    def _read_ahead(self, name: str, dev: int) -> None:
        """get_tensor in key order (an engine's loading loop): the reads of
        the next keys, up to the window's bytes, start with this one."""
        with self._lock:
            i = self._index[name]
            sequential, self._expect = i == self._expect, i + 1
            if not sequential:
                return
            k, j, ahead = self._sorted, i + 1, 0
            while j < len(k) and ahead + self.tensors[k[j]].nbytes <= self.window:
                ahead += self.tensors[k[j]].nbytes
                if j >= self._ahead_to:
                    self.defer(dev, k[j])
                j += 1
            self._ahead_to = max(self._ahead_to, j)

    def _slices_ahead(self, reader, plan, index, dev: int) -> None:
        """get_slice in key order (an engine loading its tensor-parallel
        rank): the slices of the next keys, guessed from the last slice of
        the same role (the name with its layer numbers taken out) and the
        same shape (in this file, or, for a role this file has not been
        asked for yet, in the files before: slices_seen), up to the
        window's bytes, start while this one is read. A guess the caller
        does not take is dropped with the rest of its role's; one this
        file's own requests taught stops the guessing for the role in this
        file, one the files before taught is replaced by what the caller
        asked."""
        name = plan.name
        with self._lock:
            self._asked.add(name)
            guess = self._guessed.pop(name, None)
            if guess:
                self._guessed_bytes -= guess[1]
                # Taken, or started after this request missed it (another
                # thread's guess): either way nothing of it is left to take.
                reader.drop(guess[0])
            role, shape = self._role_of[name], self._shape_of[name]
            slices_seen.learn(role, shape, dev, index)
            if guess and guess[0] != plan.key:  # wrong: so are the role's other guesses
                for k in [k for k in self._guessed if self._role_of[k] == role]:
                    other = self._guessed.pop(k)
                    if other:
                        self._guessed_bytes -= other[1]
                        reader.drop(other[0])
                if role in self._roles:  # this file's own guess: its slices of the role vary
                    self._roles[role] = None
                # else the files before guessed it (another rank's, say): this request teaches the file
            if role in self._roles and self._roles[role] is None:
                return
            self._roles[role] = (shape, index)
            started, deferred = self._started.get(dev, ()), self._deferred.get(dev, ())
            i = self._index[name]
            items = []
            for k in self._sorted[i + 1:i + 1 + SLICE_SCAN]:
                if k in self._guessed or k in self._asked or k in started or k in deferred:
                    continue
                kr, ks = self._role_of[k], self._shape_of[k]
                if kr in self._roles:
                    seen = self._roles[kr]
                    idx = seen[1] if seen is not None and seen[0] == ks else None
                else:
                    idx = slices_seen.get(kr, ks, dev)
                if idx is not None:
                    items.append((k, idx))
                    self._guessed[k] = ()  # being planned: another thread's scan leaves it
        plans, room = [], self.window - self._guessed_bytes
        for k, idx in items:
            try:
                p = reader.fetcher.plan(k, idx)
            except (IndexError, TypeError, ValueError):
                continue  # the planner does not take it: the request will go to safetensors
            if p.read_bytes > room:
                break
            room -= p.read_bytes
            plans.append(p)
        with self._lock:
            # Started: what is still marked as being planned (neither asked
            # for nor dropped with its role meanwhile).
            live = {k for k, _ in items if self._guessed.get(k) == ()}
            for k in live:
                del self._guessed[k]
            plans = [p for p in plans if p.name in live]
            for p in plans:
                self._guessed[p.name] = (p.key, p.read_bytes, p)
                self._guessed_bytes += p.read_bytes
            if plans:  # under the lock: a request that pops a guess finds it started
                reader.prefetch_planned(plans, flush_bytes=GUESS_TASK)

    def _guessed_plan(self, name: str, index):
        """The plan of the guess started for name, when it guessed index:
        a request the guess answers is not planned again."""
        with self._lock:
            g = self._guessed.get(name)
        if not g or index is None:
            return None
        try:
            hit = g[2].index == index
        except Exception:  # noqa: BLE001: an index whose == is not a truth (an array)
            return None
        return g[2] if hit is True else None

    def _gpu(self, info: TensorInfo, index, dev: int):
        """info[index] on dev through phxmount; the real safetensors (and a
        copy to dev) where phxmount cannot, and for an index phxmount's
        planner does not take (safetensors' own answer, or its error)."""
        report.asked()
        try:
            reader = self._reader(dev)
        except Exception as e:  # noqa: BLE001: never fail where safetensors works
            self._fall_back(e)
            return self._stock_to(info, index, dev)
        try:
            plan = self._guessed_plan(info.name, index) or reader.fetcher.plan(info.name, index)
        except (IndexError, TypeError, ValueError):
            return self._stock_to(info, index, dev)
        try:
            self._start_deferred(reader, dev)
            ahead = None if index is None else (lambda: self._slices_ahead(reader, plan, index, dev))
            t = reader.get_planned(plan, ahead)
        except Exception as e:  # noqa: BLE001
            self._fall_back(e)
            return self._stock_to(info, index, dev)
        report.landed(dev, t.nbytes)
        return t

    def _reader(self, dev: int):
        with self._lock:
            r = self._readers.get(dev)
            if r is not None:
                return r
        with self._lock:
            fd = self._fd[0]
            fd = os.dup(fd) if fd is not None else None
        from .availability import known
        try:
            av = known.get(self.path, dev, fd)
            if not av:
                raise RuntimeError(f"cuda:{dev}: {av.reason}")
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        r = self._open_reader(self.path, dev, av, self.header, fd)
        with self._lock:
            if dev in self._readers:
                r.close()
                return self._readers[dev]
            self._readers[dev] = r
            first, self._counted = not self._counted, True
        if first:
            with report.lock:
                report.files += 1
        report.say("engaged", f"{self.path}: tensors for cuda:{dev} through phxmount ({av.transport}); "
                              f"{describe(self.mode)}")
        return r

    def _start_deferred(self, reader, dev: int) -> None:
        with self._lock:
            names = list(self._deferred.pop(dev, {}))
            self._started.setdefault(dev, set()).update(names)
        if names:
            report.started()
            reader.prefetch(names, flush_bytes=self.task or reader.fetcher.in_order_task)

    def _fall_back(self, e: BaseException) -> None:
        with self._lock:
            first = self._fallen is None
            self._fallen = self._fallen or e
        if first:
            report.fell_back(self.path, e)

    def _stock_to(self, info: TensorInfo, index, dev: int):
        t = self.stock().get_slice(info.name)[index] if index is not None else self.stock().get_tensor(info.name)
        return t.to(f"cuda:{dev}")


def _role(name: str) -> str:
    """A tensor's role: its name with the layer (and expert) numbers taken
    out ("model.layers.#.self_attn.o_proj.weight")."""
    return _NUMBER.sub("#", name)


class SliceMemory:
    """The last slice asked of each role and shape for each device, in any
    file: an engine loading its tensor-parallel rank asks the same slices
    of every file of a checkpoint, so a file's first request starts the
    guesses of its roles at once, rather than after the first slice of each
    role in that file has been read, one at a time. A file whose own
    requests taught it otherwise follows its own (HookedFile._slices_ahead)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.index: Dict[tuple, object] = {}

    def get(self, role: str, shape: tuple, dev: int):
        with self.lock:
            return self.index.get((role, shape, dev))

    def learn(self, role: str, shape: tuple, dev: int, index) -> None:
        with self.lock:
            self.index[(role, shape, dev)] = index

    def forget(self) -> None:
        with self.lock:
            self.index.clear()


slices_seen = SliceMemory()


class Closing:
    """Closes readers off the caller's thread; drain() waits for them
    (tests, before they unmount; interpreter exit, through atexit)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.threads: List[threading.Thread] = []

    def run(self, fn) -> None:
        t = threading.Thread(target=fn, name="phxmount-close", daemon=True)
        with self.lock:
            self.threads = [x for x in self.threads if x.is_alive()] + [t]
        t.start()

    def drain(self, timeout: float = 30) -> None:
        with self.lock:
            ts, self.threads = self.threads, []
        for t in ts:
            t.join(timeout)


closing = Closing()
atexit.register(closing.drain)


def describe(mode: Mode) -> str:
    if mode.cpu_to:
        return f"tensors asked for on the cpu land on {mode.cpu_to} ({ENV}={mode.cpu_to})"
    return ("tensors asked for on the cpu stay host tensors unless their loader says they go to a GPU "
            f"(transformers' from_pretrained); {ENV}=cuda sends them all to the GPU")


# --- the hooked functions ---------------------------------------------------------------

_orig: Dict[str, Callable] = {}
_mode = Mode(False)


def safe_open(filename, framework, device="cpu", *, backend="mmap"):
    """safetensors.safe_open, served by phxmount where it can (see the module's doc)."""
    real = _orig["safe_open"]
    path = os.fspath(filename)
    try:
        f = _route(path, framework, device, backend, real)
    except Exception as e:  # noqa: BLE001: the real one decides what is an error
        report.fell_back(path, e)
        f = None
    return f if f is not None else real(filename, framework, device=device, backend=backend)


def _route(path: str, framework, device, backend, real) -> Optional[HookedFile]:
    if not isinstance(framework, str) or framework.lower() not in _PT:
        return None
    if not is_cpu(device) and cuda_index(device) is None:
        return None  # mps, xpu, ...: not ours
    if is_cpu(device) and _mode.cpu_to is None and "transformers" not in sys.modules:
        return None  # host tensors, and no loader that could say otherwise
    fd = mounts.open_if_phxmount(path) if os.path.isfile(path) else None
    if fd is None:
        return None
    try:
        header = read_header(fd)
    except BaseException:
        os.close(fd)
        raise
    return HookedFile(path, framework, device, backend, header, _mode, real, _open_reader, fd)


def _open_reader(path: str, dev: int, availability=None, header=None, fd=None):
    from .torch_load import open_reader
    return open_reader(path, dev, owned=True, availability=availability, header=header, fd=fd)


def _close_fd(box: list) -> None:
    """Closes the descriptor box holds, once."""
    fd, box[0] = box[0], None
    if fd is not None:
        os.close(fd)


def _bind_spawn(orig: Callable) -> Callable:
    """transformers' spawn_materialize, which first tells a hooked slice
    the device and dtype its tensor goes to."""

    def spawn_materialize(thread_pool, tensor, device=None, dtype=None, *args, **kw):
        if isinstance(tensor, HookedSlice):
            tensor.bind(device, dtype)
        return orig(thread_pool, tensor, device, dtype, *args, **kw)

    spawn_materialize.__wrapped__ = orig
    return spawn_materialize


# --- installing -------------------------------------------------------------------------

def _patch_safetensors(mod) -> None:
    real = getattr(mod, "safe_open", None)
    if real is None or real is safe_open:
        return
    _orig.setdefault("safe_open", real)
    _rebind(_orig["safe_open"], safe_open)


def _rebind(old, new) -> None:
    """Every module that holds old as safe_open gets new instead (but the
    real extension module, and this one)."""
    for name, m in list(sys.modules.items()):
        if m is None or name in ("safetensors._safetensors_rust", __name__):
            continue
        try:
            if getattr(m, "safe_open", None) is old:
                setattr(m, "safe_open", new)
        except Exception:  # noqa: BLE001: a module whose attributes misbehave
            continue


def _patch_transformers(mod) -> None:
    fn = getattr(mod, "spawn_materialize", None)
    if fn is None:
        report.say("no-spawn", "transformers has no core_model_loading.spawn_materialize here: "
                               f"tensors it asks for on the cpu stay host tensors ({ENV}=cuda sends them to a GPU)")
        return
    if getattr(fn, "__wrapped__", None) is None:
        mod.spawn_materialize = _bind_spawn(fn)


_AFTER_IMPORT = {"safetensors": _patch_safetensors, "transformers.core_model_loading": _patch_transformers}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, after):
        self.inner, self.after = inner, after

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        self.after(module)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches a watched module as soon as it has been imported, before
    anyone can take a name from it."""

    def __init__(self):
        self._busy = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        after = _AFTER_IMPORT.get(fullname)
        if after is None or getattr(self._busy, "name", None) == fullname:
            return None
        self._busy.name = fullname
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.name = None
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Loader(spec.loader, after)
        return spec


_finder: Optional[_AfterImport] = None
_summary_at_exit = False


def install(mode: Optional[Mode] = None) -> Mode:
    """Turns the hook on (idempotent): patches safetensors and transformers
    now if they are imported, else as soon as they are."""
    global _mode, _finder, _summary_at_exit
    _mode = mode or Mode(True)
    if _finder is None:
        _finder = _AfterImport()
        sys.meta_path.insert(0, _finder)
    if not _summary_at_exit:
        _summary_at_exit = True
        atexit.register(_at_exit)
    for name, after in _AFTER_IMPORT.items():
        if name in sys.modules:
            after(sys.modules[name])
    return _mode


def uninstall() -> None:
    """Turns the hook off and puts the real functions back (tests)."""
    global _mode, _finder
    _mode = Mode(False)
    slices_seen.forget()
    if _finder is not None:
        sys.meta_path.remove(_finder)
        _finder = None
    real = _orig.pop("safe_open", None)
    if real is not None:
        _rebind(safe_open, real)
    tcl = sys.modules.get("transformers.core_model_loading")
    fn = getattr(tcl, "spawn_materialize", None)
    if getattr(fn, "__wrapped__", None) is not None:
        tcl.spawn_materialize = fn.__wrapped__


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

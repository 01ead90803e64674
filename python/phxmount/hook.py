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
import os
import sys
import threading
import weakref
from typing import Callable, Dict, List, Optional

from .hook_ahead import ReadAhead
from .hook_close import close_fd, closing
from .hook_env import ENV, TASK_ENV, WINDOW_ENV, Mode, cuda_index, describe, is_cpu, parse_mode, task, window
from .hook_guess import GUESS_TASK, Guesses, slices_seen
from .hook_import import AfterImport, rebind
from .hook_plan import Starts
from .hook_report import Report, report
from .hook_route import mounts, route
from .stformat import Header, TensorInfo, read_header

__all__ = ["safe_open", "install", "uninstall", "install_from_env", "Mode", "parse_mode", "HookedFile",
           "HookedSlice", "report", "Report", "closing", "mounts", "slices_seen", "cuda_index", "is_cpu",
           "describe", "ENV", "WINDOW_ENV", "TASK_ENV", "GUESS_TASK"]


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
        weakref.finalize(self, close_fd, self._fd)
        self.tensors: Dict[str, TensorInfo] = {t.name: t for t in header.tensors}
        self._sorted = sorted(self.tensors)
        self._lock = threading.RLock()
        self._stock = None
        self._readers: Dict[int, object] = {}
        self._fallen: Optional[BaseException] = None
        self._counted = False  # in report.files
        self.window = window()
        self.task = task()
        self._starts = Starts(self._lock)
        self._ahead = ReadAhead(self._sorted, {n: t.nbytes for n, t in self.tensors.items()}, self._lock)
        self._guesses = Guesses(self._sorted, {t.name: tuple(t.shape) for t in header.tensors}, self._lock)

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
        self._ahead.after(name, self.window, lambda k: self.defer(dev, k))
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
        a thread of their own (hook_close)."""
        with self._lock:
            readers, self._readers = list(self._readers.values()), {}
            stock, self._stock = self._stock, None
            fd, self._fd[0] = self._fd[0], None
        if readers or fd is not None:
            closing.run(lambda: ([r.close() for r in readers], close_fd([fd])))
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
        self._starts.defer(dev, name)

    def read_slice(self, info: TensorInfo, index, bound: Optional[int]):
        dev = self.destination(bound)
        if dev is None:
            return self.stock().get_slice(info.name)[index]
        return self._gpu(info, index, dev)

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
            plan = self._guesses.plan_for(info.name, index) or reader.fetcher.plan(info.name, index)
        except (IndexError, TypeError, ValueError):
            return self._stock_to(info, index, dev)
        try:
            self._starts.start(reader, dev, self.task)
            ahead = None if index is None else (
                lambda: self._guesses.after(reader, plan, index, dev, self._starts, self.window))
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
            report.opened()
        report.say("engaged", f"{self.path}: tensors for cuda:{dev} through phxmount ({av.transport}); "
                              f"{describe(self.mode)}")
        return r

    def _fall_back(self, e: BaseException) -> None:
        with self._lock:
            first = self._fallen is None
            self._fallen = self._fallen or e
        if first:
            report.fell_back(self.path, e)

    def _stock_to(self, info: TensorInfo, index, dev: int):
        t = self.stock().get_slice(info.name)[index] if index is not None else self.stock().get_tensor(info.name)
        return t.to(f"cuda:{dev}")


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
    fd = route(path, framework, device, _mode)
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

_SKIP = ("safetensors._safetensors_rust", __name__)  # the real extension module, and this one


def _patch_safetensors(mod) -> None:
    real = getattr(mod, "safe_open", None)
    if real is None or real is safe_open:
        return
    _orig.setdefault("safe_open", real)
    rebind("safe_open", _orig["safe_open"], safe_open, _SKIP)


def _patch_transformers(mod) -> None:
    fn = getattr(mod, "spawn_materialize", None)
    if fn is None:
        report.say("no-spawn", "transformers has no core_model_loading.spawn_materialize here: "
                               f"tensors it asks for on the cpu stay host tensors ({ENV}=cuda sends them to a GPU)")
        return
    if getattr(fn, "__wrapped__", None) is None:
        mod.spawn_materialize = _bind_spawn(fn)


_AFTER_IMPORT = {"safetensors": _patch_safetensors, "transformers.core_model_loading": _patch_transformers}
_finder: Optional[AfterImport] = None
_summary_at_exit = False


def install(mode: Optional[Mode] = None) -> Mode:
    """Turns the hook on (idempotent): patches safetensors and transformers
    now if they are imported, else as soon as they are."""
    global _mode, _finder, _summary_at_exit
    _mode = mode or Mode(True)
    if _finder is None:
        _finder = AfterImport(_AFTER_IMPORT)
        sys.meta_path.insert(0, _finder)
    if not _summary_at_exit:
        _summary_at_exit = True
        atexit.register(lambda: report.at_exit())
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
        rebind("safe_open", safe_open, real, _SKIP)
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

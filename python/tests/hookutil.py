"""What the hook's tests share: stand-ins of the real safetensors' safe_open
of several releases (reading with pread, numpy results), and a mounted case
that puts one in a fake `safetensors` module, with the hook installed over
it and the emulated device standing in for cuda:N."""

import inspect
import io
import os
import shutil
import sys
import textwrap
import types
import unittest

from mountutil import WHY_NO_NUMPY, MountedCase, as_array, make_file, np, why_not

from phxmount import hook  # noqa: E402
from phxmount.availability import known  # noqa: E402
from phxmount.hostbackends import open_emu  # noqa: E402
from phxmount.stformat import read_header  # noqa: E402

PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHY = why_not() or WHY_NO_NUMPY

SPECS = [("a.w", "F32", (64, 300)), ("b.w", "BF16", (128, 129)), ("c.bias", "I64", (4099,)),
         ("d.flag", "BOOL", (7,)), ("e.big", "U8", (3, 70000)), ("f.none", "F16", (0, 3))]
# A model's layers: a rank of world 4 takes rows of q (dim 0), columns of o
# (dim 1), and the norm whole.
LAYERS = [(f"model.layers.{i}.{n}", dt, shape) for i in range(12) for n, dt, shape in
          (("attn.q.weight", "BF16", (64, 96)), ("attn.o.weight", "F32", (40, 256)), ("norm.weight", "F16", (96,)))]
RANK = {"attn.q.weight": (slice(32, 48),), "attn.o.weight": (slice(None), slice(128, 192)), "norm.weight": Ellipsis}


def write_tree(root, files):
    for rel, text in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(textwrap.dedent(text))


class Host(np.ndarray if np is not None else object):
    """A host tensor of the stand-in: a numpy array that can .to() a device
    (where the hook copies what safetensors read to the GPU asked for)."""

    def to(self, device):
        return self


class SafetensorError(Exception):
    """The stand-ins' own error, as safetensors raises its own."""


class Served:
    """What the stand-ins served: tensors read, and every open's arguments
    as the caller gave them ((args, kwargs))."""
    tensors = 0
    opens: list = []
    calls: list = []  # methods of the newest release, called


def _own_index(index, shape):
    """safetensors 0.8's own indexer (its pread backend): ints, Ellipsis,
    slices with bounds >= 0 (a negative one is an OverflowError), no None."""
    for x in index if isinstance(index, tuple) else (index,):
        if isinstance(x, slice):
            if any(v is not None and v < 0 for v in (x.start, x.stop)):
                raise OverflowError("can't convert negative int to unsigned")
            if x.step is not None and x.step < 1:
                raise SafetensorError(f"Slice step must be a positive integer, got {x.step}")
        elif x is None:
            raise SafetensorError("Unsupported slice index: expected slice, int, or ellipsis")


class _Base:
    """The methods every release has (0.4 on)."""

    def __init__(self, filename, framework, device="cpu", backend="mmap", **new):
        self.path, self.framework, self.device, self.backend = str(filename), framework, device, backend
        self.h = read_header(self.path)
        self.infos = {t.name: t for t in self.h.tensors}
        self.closed = False

    def _open(self):
        if self.closed:
            raise SafetensorError("File is closed")

    def _read(self, name):
        if name not in self.infos:
            raise SafetensorError(f"File does not contain tensor {name}")
        Served.tensors += 1
        t = self.infos[name]
        with open(self.path, "rb") as f:
            f.seek(self.h.data_start + t.begin)
            return as_array(t.dtype, t.shape, f.read(t.nbytes)).view(Host)

    def get_tensor(self, name):
        self._open()
        return self._read(name)

    def get_slice(self, name):
        self._open()
        parent, steps = self, self.STEPS

        class S:
            def get_shape(self):
                return list(parent.infos[name].shape)

            def __getitem__(self, index):
                items = index if isinstance(index, tuple) else (index,)
                if not steps and any(isinstance(x, slice) and x.step not in (None, 1) for x in items):
                    raise SafetensorError("this release slices without steps")
                if parent.backend == "pread":
                    _own_index(index, parent.infos[name].shape)
                return parent._read(name)[index]  # after a close too, as safetensors' slices
        return S()

    def keys(self):
        self._open()
        return sorted(self.infos)

    def metadata(self):
        self._open()
        return None if self.h.metadata is None else dict(self.h.metadata)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.closed = True


def _get_tensors(self):
    self._open()
    return {t.name: self._read(t.name) for t in self.h.tensors}


def _offset_keys(self):
    self._open()
    return [t.name for t in self.h.tensors]


def _prefetch_tensors(self, names):
    Served.calls.append(("prefetch_tensors", list(names)))


_P = inspect.Parameter
_ARGS = [_P("filename", _P.POSITIONAL_OR_KEYWORD), _P("framework", _P.POSITIONAL_OR_KEYWORD)]


def stand_in(release="0.8", steps=True):
    """A class standing in for that release's safe_open: "0.4" (filename,
    framework, device="cpu"; keys, get_tensor, get_slice, metadata), "0.8"
    (backend= too, shown as pyo3 shows it: `...` defaults; get_tensors,
    offset_keys), "next" (0.8 and a prefetch= keyword and a
    prefetch_tensors method), "opaque" (0.8 whose signature inspect cannot
    read). steps=False: its get_slice refuses a stepped index."""
    ns = {"STEPS": steps}
    if release == "0.4":
        sig = inspect.Signature(_ARGS + [_P("device", _P.POSITIONAL_OR_KEYWORD, default="cpu")])
    else:
        ns.update(get_tensors=_get_tensors, offset_keys=_offset_keys)
        sig = inspect.Signature(_ARGS + [_P("device", _P.POSITIONAL_OR_KEYWORD, default=Ellipsis),
                                         _P("backend", _P.KEYWORD_ONLY, default=Ellipsis)])
    if release == "next":
        ns["prefetch_tensors"] = _prefetch_tensors
        sig = sig.replace(parameters=list(sig.parameters.values()) + [_P("prefetch", _P.KEYWORD_ONLY, default=False)])
    ns["__signature__"] = "not a signature" if release == "opaque" else sig

    def __init__(self, *args, **kwargs):
        b = sig.bind(*args, **kwargs)  # the real one's TypeError for what its release does not take
        Served.opens.append((args, kwargs))
        _Base.__init__(self, **b.arguments)
    ns["__init__"] = __init__
    return type(f"safe_open_{release.replace('.', '_')}", (_Base,), ns)


StockFile = stand_in("0.8")


class Ok:
    ok, transport, reason = True, "staged", "stands in for a GPU"

    def __bool__(self):
        return True


@unittest.skipIf(WHY, f"SKIP: {WHY}")
class HookedCase(MountedCase):
    """An emu mount with m.safetensors (SPECS), layers.safetensors and a copy
    (LAYERS), a copy of m off the mount; the hook installed over a fake
    safetensors whose safe_open is self.real (StockFile unless a test
    installs another: self.use(cls))."""

    staged = True
    real = StockFile

    @classmethod
    def populate(cls, backing):
        cls.header, ts = make_file(os.path.join(backing, "m.safetensors"), specs=SPECS)
        cls.arrays = {n: as_array(*v) for n, v in ts.items()}
        shutil.copy(os.path.join(backing, "m.safetensors"), os.path.join(os.path.dirname(backing), "off.safetensors"))
        _, ts = make_file(os.path.join(backing, "layers.safetensors"), specs=LAYERS)
        cls.layers = {n: as_array(*v) for n, v in ts.items()}
        shutil.copy(os.path.join(backing, "layers.safetensors"), os.path.join(backing, "layers2.safetensors"))

    def setUp(self):
        self.saved = {k: sys.modules.get(k) for k in ("safetensors", "transformers")}
        self.fake = types.ModuleType("safetensors")
        self.fake.__version__ = "stand-in"
        sys.modules["safetensors"] = self.fake
        sys.modules["transformers"] = types.ModuleType("transformers")
        self.err = io.StringIO()
        hook.report.__init__(self.err)
        hook.mounts.__init__()
        known.forget()
        self.readers, self.reader_devs = [], []

        def open_reader(path, dev, availability=None, header=None, fd=None):  # the emulated device stands in for cuda:dev
            r = open_emu(path, fd=fd, header=header, availability=availability)
            self.readers.append(r)
            self.reader_devs.append(dev)
            return r
        self.orig_open_reader = hook._open_reader
        hook._open_reader = open_reader
        self.use(self.real)
        Served.tensors, Served.opens, Served.calls = 0, [], []

    def use(self, real, mode=None):
        """The hook over real (a stand-in class) as the installed safe_open."""
        hook.uninstall()
        self.fake.safe_open = real
        hook.install(mode or hook.Mode(True))

    def tearDown(self):
        hook.closing.drain()
        hook.uninstall()
        hook._open_reader = self.orig_open_reader
        hook.mounts.__init__()
        known.forget()
        for k, v in self.saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v

    def gpu_ok(self, dev=0):
        known._answers[(os.stat(self.path).st_dev, dev)] = Ok()  # the emulated device stands in for cuda:dev

    @property
    def path(self):
        return self.m.path("m.safetensors")

    def batches(self):
        return self.counters()["lib_batches"]

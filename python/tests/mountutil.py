"""Helpers of the tests that mount for real: an emu phxmount mount over a
backing directory (Mount), why the mount tests cannot run here (why_not),
numpy (need_numpy), and a safetensors file of varied tensors (make_file)."""

import contextlib
import os
import random
import signal
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
ROOT = os.path.dirname(os.path.dirname(HERE))

from phxmount import stformat as st  # noqa: E402
from phxmount.client import mount_counters  # noqa: E402
from phxmount.regcache import close_caches  # noqa: E402

PHXMOUNT = os.environ.get("PHXMOUNT_BIN", os.path.join(ROOT, "bin", "phxmount"))


def in_child(fn, seconds: int = 20) -> bool:
    """Runs fn() in a child made by fork and returns its truth: False when
    it raised, returned false, or outlived seconds (a child stuck on a
    lock held at the fork dies, and the test fails rather than hangs)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            signal.alarm(seconds)
            ok = bool(fn())
        finally:
            os.write(w, b"1" if ok else b"0")
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    return got == b"1"


def why_not():
    if os.geteuid() != 0:
        return "not root (mounting FUSE needs root)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if not os.access(PHXMOUNT, os.X_OK):
        return f"no {PHXMOUNT} (run make build)"
    return None


def debian_module(name: str):
    """The module, or None. A python3 that is not Debian's (pyenv, say)
    gets Debian's package (python3-numpy, python3-torch: scripts/deps.sh
    installs them) when this one is the same minor version."""
    import importlib
    try:
        return importlib.import_module(name)
    except ImportError:
        pass
    deb = "/usr/lib/python3/dist-packages"
    if os.path.isdir(os.path.join(deb, name)) and deb not in sys.path:
        sys.path.append(deb)
        try:
            return importlib.import_module(name)
        except ImportError:
            sys.path.remove(deb)
    elif deb in sys.path:
        try:
            return importlib.import_module(name)
        except ImportError:
            pass
    return None


def numpy_or_none():
    return debian_module("numpy")


def torch_or_none():
    return debian_module("torch")


np = numpy_or_none()
WHY_NO_NUMPY = None if np is not None else "numpy is not importable (scripts/deps.sh installs python3-numpy)"


class Mount:
    """phxmount --vendor emu over backing (staged: the emulated device's
    memory is not host-addressable, so the staged transport runs)."""

    def __init__(self, backing, staged=False, workers=3, extra=()):
        self.backing = backing
        self.mnt = tempfile.mkdtemp(prefix="phxpy-mnt-")
        self.log = open(os.path.join(os.path.dirname(backing), f"phxmount-{int(staged)}.log"), "w+")
        env = dict(os.environ, PHXMOUNT_EMU_STAGED="1" if staged else "0")
        self.p = subprocess.Popen([PHXMOUNT, "--vendor", "emu", "--workers", str(workers), *extra, backing, self.mnt],
                                  stdout=self.log, stderr=subprocess.STDOUT, env=env)
        # phxmount wait: the one readiness check (it returns once the mount
        # serves requests).
        if subprocess.run([PHXMOUNT, "wait", "--timeout", "15", self.mnt]).returncode == 0:
            return
        self.close()
        self.log.seek(0)
        raise RuntimeError("phxmount did not mount:\n" + self.log.read())

    def path(self, name):
        return os.path.join(self.mnt, name)

    def close(self):
        close_caches()  # the registration caches hold the mount's root open
        if os.path.ismount(self.mnt):
            subprocess.run(["umount", self.mnt], check=False)
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        os.rmdir(self.mnt)
        self.log.close()


class MountedCase(unittest.TestCase):
    """Tests on one emu mount (staged or not) over a fresh backing
    directory, which populate(backing) fills first."""

    staged = False

    @classmethod
    def populate(cls, backing):
        pass

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="phxpy-", dir="/var/tmp")
        cls.backing = os.path.join(cls.work, "backing")
        os.mkdir(cls.backing)
        cls.populate(cls.backing)
        cls.m = Mount(cls.backing, cls.staged)

    @classmethod
    def tearDownClass(cls):
        cls.m.close()
        shutil.rmtree(cls.work)

    def counters(self):
        return mount_counters(self.m.mnt)


def tensor_bytes(dtype, shape):
    n = st.DTYPE_SIZES[dtype]
    for s in shape:
        n *= s
    return n


# Shapes that exercise the planner: rows, columns, 3-D, a scalar, empty,
# odd sizes so later tensors start at offsets no element size divides.
SPECS = [("embed", "BF16", (300, 100)), ("odd", "U8", (13,)), ("w1", "F32", (129, 257)), ("flag", "BOOL", (7,)),
         ("none", "F16", (0, 3)), ("cube", "I16", (6, 7, 9)), ("bias", "I64", (4099,)), ("scalar", "F64", ()),
         ("w2", "F64", (77, 3, 5)), ("wide", "U8", (16, 70000))]


def make_file(path, seed=7, specs=SPECS, metadata=None):
    """Writes a safetensors file of random tensors; returns (header,
    {name: (dtype, shape, bytes)})."""
    rnd = random.Random(seed)
    ts = [(name, dt, shape, rnd.randbytes(tensor_bytes(dt, shape))) for name, dt, shape in specs]
    ts = [(n, dt, sh, bytes(b & 1 for b in data) if dt == "BOOL" else data) for n, dt, sh, data in ts]
    h = st.write_file(path, ts, metadata=metadata if metadata is not None else {"format": "pt"})
    return h, {name: (dt, shape, data) for name, dt, shape, data in ts}


@contextlib.contextmanager
def opens_counted():
    """Yields the list of paths os.open is called with meanwhile (an open
    of a file on the mount is a round trip to the daemon)."""
    real, opened = os.open, []

    def counting(path, *a, **k):
        opened.append(os.fspath(path))
        return real(path, *a, **k)
    os.open = counting
    try:
        yield opened
    finally:
        os.open = real


def as_array(dtype, shape, data):
    """The tensor as a numpy array (the dtypes of hostbackends.NP_DTYPES)."""
    from phxmount.hostbackends import NP_DTYPES
    return np.frombuffer(data, dtype=NP_DTYPES[dtype]).reshape(shape)


def same(a, b):
    """Equal shapes and bytes (NaNs included)."""
    return tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype and \
        np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()

"""The ioctl client of a phxmount mount: ioctl(2) over the ABI of abi.py.

Everything here works without torch and without a GPU; the emulated device
(EmuBuffer) stands in for GPU memory on a mount started with --vendor emu.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as _FutureTimeout
from typing import Dict, List, Optional, Sequence, Tuple, Union

from . import abi


class PhxError(OSError):
    """An ioctl the daemon refused, or an extent that failed."""


_libc = ctypes.CDLL(None, use_errno=True)
_libc.ioctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)
_libc.ioctl.restype = ctypes.c_int


def _ioctl(fd: int, cmd: int, buf: bytearray, what: str, path: str) -> None:
    """ioctl(2) through ctypes, which lets go of the GIL for the call:
    fcntl.ioctl holds it for buffers over 1 KiB (every BATCH), which would
    run one Python thread's ioctls at a time however many are in flight."""
    arg = (ctypes.c_char * len(buf)).from_buffer(buf)
    while True:
        if _libc.ioctl(fd, cmd, ctypes.addressof(arg)) >= 0:
            return
        e = ctypes.get_errno()
        if e != errno.EINTR:
            raise PhxError(e, f"phx {what} {path}: {os.strerror(e)}")


class PhxFile:
    """An open file (or directory) on a phxmount mount. Every command can be
    sent on any file of the mount; READ and the batches move bytes of this
    file. Buffers registered through it are released when it is closed."""

    def __init__(self, path: Union[str, os.PathLike, int], flags: int = os.O_RDONLY, *, fd: Optional[int] = None):
        """path opened with flags; or a descriptor: path an int (the
        caller's, left open), or fd (of path, closed with this file)."""
        if isinstance(path, int):
            self.fd, self.path, self._own = path, f"fd {path}", False
        else:
            self.path = os.fspath(path)
            self.fd = os.open(self.path, flags | os.O_CLOEXEC) if fd is None else fd
            self._own = True

    def close(self) -> None:
        if self._own and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> "PhxFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def fileno(self) -> int:
        return self.fd

    # --- commands -----------------------------------------------------------

    def info(self, device: int = 0) -> abi.Info:
        b = abi.encode_info_req(device)
        _ioctl(self.fd, abi.CMD_INFO, b, "INFO", self.path)
        return abi.decode_info(b)

    def device_by_pci(self, pci: str) -> int:
        """The mount's index of the device at PCI address pci (a client's
        CUDA ordinal is its own: CUDA_VISIBLE_DEVICES renumbers GPUs);
        ENODEV when no device of the mount is there."""
        want = normalize_pci(pci)
        info = self.info(0)
        for dev in range(info.devices):
            if dev:
                info = self.info(dev)
            if normalize_pci(info.pci_address) == want:
                return dev
        raise PhxError(errno.ENODEV, f"phx {self.path}: no device of the mount is at PCI address {want}")

    def register(self, vendor: int, device: int, handle: bytes, size: int) -> abi.Registered:
        b = abi.encode_register(vendor, device, size, handle)
        _ioctl(self.fd, abi.CMD_REGISTER, b, "REGISTER", self.path)
        return abi.decode_register_resp(b)

    def deregister(self, buf_id: int) -> None:
        _ioctl(self.fd, abi.CMD_DEREGISTER, abi.encode_deregister(buf_id), "DEREGISTER", self.path)

    def read(self, buf_id: int, buf_offset: int, length: int, file_offset: int) -> int:
        """READ: bytes moved (fewer only at end of file)."""
        b = abi.encode_io(buf_id, buf_offset, length, file_offset)
        _ioctl(self.fd, abi.CMD_READ, b, "READ", self.path)
        return abi.decode_io_resp(b)

    def write(self, buf_id: int, buf_offset: int, length: int, file_offset: int) -> int:
        b = abi.encode_io(buf_id, buf_offset, length, file_offset)
        _ioctl(self.fd, abi.CMD_WRITE, b, "WRITE", self.path)
        return abi.decode_io_resp(b)

    def batch(self, extents: Sequence[abi.Extent], write: bool = False) -> Tuple[int, List[int]]:
        """One BATCH ioctl (1..409 extents); returns (failed, results)."""
        cap = abi.batch_capacity_for(len(extents))
        b = abi.encode_batch(cap, extents)
        _ioctl(self.fd, abi.cmd_batch(write, cap), b, "BATCH_WRITE" if write else "BATCH_READ", self.path)
        failed, results = abi.decode_batch_resp(b, len(extents))
        for e, r in zip(extents, results):
            e.result = r
        return failed, results

    def batch_cols(self, cols, write: bool = False) -> None:
        """One BATCH ioctl of 1..409 extents given as columns (extents.Cols);
        raises PhxError naming the first extent that did not move exactly
        its length (the others have moved)."""
        self._batch(cols, write, abi.encode_batch_cols, abi.cmd_batch, abi.decode_batch_cols, "")

    def batch_strided_cols(self, cols, write: bool = False) -> None:
        """One BATCH_READ_STRIDED (or _WRITE) ioctl of 1..255 extents given
        as columns, counts and strides included; raises PhxError naming the
        first extent that did not move all its pieces' bytes (ENOTTY from a
        daemon that has no strided batches)."""
        self._batch(cols, write, abi.encode_strided_batch_cols, abi.cmd_strided_batch,
                    abi.decode_strided_batch_cols, "_STRIDED")

    def _batch(self, cols, write: bool, encode, cmd, decode, suffix: str) -> None:
        n = len(cols)
        b = encode(n, cols)  # capacity: exactly n (any 1..max is valid)
        what = ("BATCH_WRITE" if write else "BATCH_READ") + suffix
        _ioctl(self.fd, cmd(write, n), b, what, self.path)
        failed, res = decode(b, n)
        if failed:
            raise extent_error(f"phx {what.lower()} {self.path}", cols, res)

    def batch_read_all(self, extents: Sequence[abi.Extent], timeout: Optional[float] = None,
                       on_abandon=None) -> None:
        """Submits every extent (as many BATCH ioctls as needed, 409 each),
        waits up to timeout seconds and raises PhxError naming the first
        extent that did not move exactly its length. The ioctls run on a
        helper thread; on a timeout TimeoutError is raised and on_abandon (if
        given) is called once they have finished, since the daemon may still
        be writing into the buffer until then."""
        extents = list(extents)
        groups = [extents[i:i + abi.MAX_EXTENTS] for i in range(0, len(extents), abi.MAX_EXTENTS)]

        def run() -> None:
            for g in groups:
                self.batch(g)

        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="phx-batch")
        fut = pool.submit(run)
        pool.shutdown(wait=False)
        try:
            fut.result(timeout=timeout)
        except _FutureTimeout:
            if on_abandon is not None:
                fut.add_done_callback(lambda _f: on_abandon())
            raise TimeoutError(f"phx batch read of {len(extents)} extents on {self.path}: "
                               f"not done after {timeout} s") from None
        for e in extents:
            if e.result != e.length:
                if e.result < 0:
                    raise PhxError(-e.result, f"phx batch read {self.path}: extent {e.length} bytes at file offset "
                                              f"{e.file_offset}: {os.strerror(-e.result)}")
                raise PhxError(errno.EIO, f"phx batch read {self.path}: extent {e.length} bytes at file offset "
                                          f"{e.file_offset}: only {e.result} bytes (file shorter than its header says?)")


def normalize_pci(s: str) -> str:
    """A PCI address as sysfs writes it ("0000:3b:00.0"), from that or the
    CUDA driver's form ("00000000:3B:00.0"); other text only lower-cased."""
    try:
        dom, bus, rest = s.strip().split(":")
        dev, fn = rest.split(".")
        return f"{int(dom, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn, 16):x}"
    except ValueError:
        return s.strip().lower()


def extent_error(what: str, cols, results) -> PhxError:
    """The error of the first extent whose result is not its length."""
    for i, r in enumerate(results):
        buf_id, off, length, fo = cols.extent(i)
        want = cols.want(i)
        if r == want:
            continue
        pieces = f" ({cols.counts[i]} pieces of {length} bytes, strides {cols.fsteps[i]} and {cols.bsteps[i]})" \
            if cols.counts[i] > 1 else ""
        where = f"{what}: extent {want} bytes{pieces} at file offset {fo}, buffer {buf_id} offset {off}"
        if r < 0:
            return PhxError(-r, f"{where}: {os.strerror(-r)}")
        return PhxError(errno.EIO, f"{where}: only {r} bytes (end of file?)")
    return PhxError(errno.EIO, f"{what}: the daemon counted failed extents, none found")


def mount_counters(path: Union[str, os.PathLike], device: int = 0) -> Dict[str, int]:
    """The daemon's counters (INFO) of the mount holding path."""
    with PhxFile(path) as f:
        return dict(f.info(device).counters)


def phx_info_xattr(path: Union[str, os.PathLike, int]) -> Dict[str, str]:
    """user.phx.info of a file or directory on the mount (a path or a
    descriptor), as a dict."""
    raw = os.getxattr(path, "user.phx.info")
    out = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        k, sep, v = line.partition("=")
        if sep:
            out[k] = v
    return out


class EmuBuffer:
    """Device memory of the emulated device (--vendor emu): a memfd named
    phxemu-* that this process maps. It stands in for a GPU buffer in tests
    on machines without one; view is the "device" bytes. Its pages are
    allocated here, as a GPU buffer's are (the daemon registers only memory
    its exporter holds: EFAULT for a sparse memfd)."""

    PAGE = 64 << 10

    def __init__(self, size: int, device: int = 0):
        self.size = (max(size, 1) + self.PAGE - 1) // self.PAGE * self.PAGE
        self.device = device
        self.fd = os.memfd_create(f"phxemu-dev{device}", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.size)
        os.posix_fallocate(self.fd, 0, self.size)
        self.map = mmap.mmap(self.fd, self.size)
        self.view = memoryview(self.map)

    def handle(self) -> bytes:
        st = os.fstat(self.fd)
        return abi.emu_handle(os.getpid(), self.fd, self.size, st.st_ino, self.device)

    def close(self) -> None:
        if self.fd < 0:
            return
        self.view.release()
        self.map.close()
        os.close(self.fd)
        self.fd = -1

"""Whether (and how) a path can be loaded into GPU memory through
phxmount, asked of the daemon rather than guessed. No torch."""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple, Union

from . import abi, cuda
from .client import PhxError, PhxFile, phx_info_xattr

# What an INFO ioctl gets from a file system that is not a phxmount mount
# (another FUSE file system, or none that takes ioctls): an answer, not a
# failure.
NOT_A_MOUNT = (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS)


@dataclass
class Availability:
    ok: bool  # a load of this path lands in GPU memory through phxmount
    reason: str
    on_mount: bool = False
    vendor: str = ""
    transport: str = ""  # what a registration gets now: direct, host, staged
    transport_why: str = ""
    engine: str = ""
    workers: int = 0
    bounce_size: int = 0
    passthrough: bool = False
    cuda_error: Optional[str] = None
    fallback: str = ""  # how safe_open reads the file instead, where it is not ok
    mount_device: int = 0  # the mount's index of the device (INFO, REGISTER)
    info: Optional[abi.Info] = None
    xattr: Dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        s = ("available: " if self.ok else "NOT available: ") + self.reason
        return s + (f"; reading with {self.fallback} instead" if self.fallback else "")


def _mount_info(f: PhxFile, path, device: int):
    """(INFO of the mount's device serving this process's device, its
    index in the mount), or an Availability saying why not. On an NVIDIA
    mount the index is found by PCI address: CUDA ordinals are the
    process's own (CUDA_VISIBLE_DEVICES renumbers GPUs)."""
    try:
        info = f.info(0)
    except PhxError as e:
        if e.errno in NOT_A_MOUNT:
            return Availability(False, f"{os.fspath(path)} is not on a phxmount mount "
                                       f"(the INFO ioctl got {errno.errorcode.get(e.errno, e.errno)})")
        return Availability(False, f"INFO ioctl failed: {e}", on_mount=True)
    try:
        idx = device
        if info.vendor == "nvidia" and cuda.driver_error() is None:
            idx = f.device_by_pci(cuda.driver().pci_bus_id(device))
        return (info if idx == 0 else f.info(idx)), idx
    except PhxError as e:
        if e.errno == errno.ENODEV:
            return Availability(False, f"the mount serves no device of this process's device {device}: {e.strerror}",
                                on_mount=True)
        return Availability(False, f"INFO ioctl failed: {e}", on_mount=True)
    except cuda.CudaError as e:
        return Availability(False, f"CUDA device {device}: {e}", on_mount=True)


def available(path: Union[str, os.PathLike], device: int = 0, fd: Optional[int] = None) -> Availability:
    """Is path on a phxmount mount, with an NVIDIA device, and a CUDA driver
    here? Asks the daemon (INFO ioctl, user.phx.info) rather than guessing,
    and reports the transport a load would take. device is this process's
    CUDA ordinal; mount_device in the answer is the mount's index of it.
    fd: a descriptor of path to ask on (left open), saving an open."""
    try:
        f = PhxFile(path) if fd is None else PhxFile(fd)
    except OSError as e:
        return Availability(False, f"cannot open {os.fspath(path)}: {e.strerror}")
    try:
        r = _mount_info(f, path, device)
    finally:
        f.close()
    if isinstance(r, Availability):
        return r
    info, idx = r
    try:
        x = phx_info_xattr(path if fd is None else fd)
    except OSError:
        x = {}
    a = Availability(False, "", on_mount=True, vendor=info.vendor, transport=info.transport_name,
                     transport_why=x.get("transport_why", ""), engine=info.engine, workers=info.workers,
                     bounce_size=info.bounce_size, passthrough=info.passthrough, info=info, xattr=x, mount_device=idx)
    if info.vendor != "nvidia":
        a.reason = (f"the mount's device is {info.vendor!r}, not an NVIDIA GPU: its buffers are not GPU memory "
                    f"(start phxmount with --vendor nvidia on a machine with a GPU)")
        return a
    a.cuda_error = cuda.driver_error()
    if a.cuda_error:
        a.reason = f"the mount serves NVIDIA GPUs but this process has no CUDA driver: {a.cuda_error}"
        return a
    how = {"kmod": "GPU-direct DMA through the phxfs kernel module",
           "staged": "pinned host bounce buffers and host-to-device copies (no kernel module: not GPU-direct)",
           "host": "host-addressable device memory"}.get(info.transport_name, info.transport_name)
    a.ok = True
    a.reason = (f"{info.device_name or 'GPU'} cuda:{device} (the mount's device {idx}, {info.pci_address}) through "
                f"phxmount, transport {info.transport_name}: {how}; engine {info.engine}, {info.workers} workers"
                + (f", bounce {info.bounce_size >> 20} MiB" if info.transport_name == "staged" else ""))
    return a


class Known:
    """available()'s answers, remembered per file system (st_dev) and
    device for the life of the process: the loaders ask once, not on every
    file (an INFO ioctl per device of the mount to find this process's GPU
    by PCI address, and a user.phx.info read: about 0.3 ms a file, more
    with more GPUs). Only answers the daemon gave are remembered (ok, or
    the mount's INFO said why not): a file system that is not a mount, or
    a failure, is asked again next time. phxmount.available() always asks
    afresh."""

    def __init__(self):
        self._lock = threading.Lock()
        self._answers: Dict[Tuple[int, int], Availability] = {}

    def get(self, path: Union[str, os.PathLike], device: int = 0, fd: Optional[int] = None) -> Availability:
        """available(path, device, fd), or what it said of path's file
        system and device before."""
        try:
            key = (os.fstat(fd).st_dev if fd is not None else os.stat(path).st_dev, device)
        except OSError:
            return available(path, device, fd)  # says why, as it would have
        with self._lock:
            a = self._answers.get(key)
        if a is None:
            a = available(path, device, fd)
            if a.ok or a.info is not None:
                with self._lock:
                    self._answers[key] = a
        return a

    def forget(self) -> None:
        """Drops every remembered answer (a mount restarted on the same
        path with other devices, say)."""
        with self._lock:
            self._answers.clear()


known = Known()

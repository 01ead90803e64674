"""Which safe_open calls the hook serves: a PyTorch file on a phxmount
mount, read onto a CUDA device (or the CPU, where a loader or
PHXMOUNT_HOOK says the tensors go to a GPU). Everything else is the real
safetensors'. No torch."""

from __future__ import annotations

import os
import sys
import threading
from typing import Dict, Optional

from .hook_env import Mode, cuda_index, is_cpu

FUSE_SUPER_MAGIC = 0x65735546
PT = ("pt", "torch", "pytorch")


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
        if known is None and statfs_type(path) != FUSE_SUPER_MAGIC:
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


def statfs_type(path: str) -> int:
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


def route(path: str, framework, device, mode: Mode) -> Optional[int]:
    """A descriptor of path (the caller's to close) when the hook serves
    safe_open(path, framework, device); None: the real safetensors does."""
    if not isinstance(framework, str) or framework.lower() not in PT:
        return None
    if not is_cpu(device) and cuda_index(device) is None:
        return None  # mps, xpu, ...: not ours
    if is_cpu(device) and mode.cpu_to is None and "transformers" not in sys.modules:
        return None  # host tensors, and no loader that could say otherwise
    return mounts.open_if_phxmount(path) if os.path.isfile(path) else None

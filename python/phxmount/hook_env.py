"""What the safetensors hook is asked for: PHXMOUNT_HOOK and the sizes the
environment sets (phxmount.hook's doc), and the device names of safe_open's
callers. No torch."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

ENV = "PHXMOUNT_HOOK"
WINDOW_ENV = "PHXMOUNT_HOOK_WINDOW"
DEFAULT_WINDOW = 1 << 30
# What starts together (a window of get_tensor's read-ahead, every tensor
# transformers bound) goes to the daemon in tasks of this many bytes
# (default Fetcher.in_order_task).
TASK_ENV = "PHXMOUNT_HOOK_TASK"


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


def describe(mode: Mode) -> str:
    if mode.cpu_to:
        return f"tensors asked for on the cpu land on {mode.cpu_to} ({ENV}={mode.cpu_to})"
    return ("tensors asked for on the cpu stay host tensors unless their loader says they go to a GPU "
            f"(transformers' from_pretrained); {ENV}=cuda sends them all to the GPU")


def window() -> int:
    """PHXMOUNT_HOOK_WINDOW: bytes a file's reads ahead may hold."""
    return int(os.environ.get(WINDOW_ENV, DEFAULT_WINDOW))


def task() -> int:
    """PHXMOUNT_HOOK_TASK: bytes a task of what starts together (0: the
    reader's in-order task)."""
    return int(os.environ.get(TASK_ENV, 0))


def safetensors_device(device):
    """What safetensors' safe_open makes of its device argument, for the
    devices phxmount serves: "cpu" for "cpu" or None; 0 for "cuda" (cuda:0,
    as safetensors reads it, not the current device); N for "cuda:N" and
    for an int N >= 0 (which torch reads as cuda:N). None for anything else
    (another kind of device, a torch.device, "CUDA", " cuda", a bool): the
    real safetensors' to serve or to refuse."""
    if device is None:
        return "cpu"
    if isinstance(device, bool):
        return None
    if isinstance(device, int):
        return device if device >= 0 else None
    if not isinstance(device, str):
        return None
    if device == "cpu":
        return "cpu"
    if device == "cuda":
        return 0
    m = _CUDA_N.fullmatch(device)
    return int(m.group(1)) if m else None


_CUDA_N = re.compile(r"cuda:(\d+)")


def cuda_index(device) -> Optional[int]:
    """The CUDA ordinal a torch device name means (an int, "cuda", "cuda:N",
    a torch.device; "cuda" is the calling thread's current device, as in
    torch), or None when it names no CUDA device: where a loader says a
    tensor goes (transformers), and PHXMOUNT_HOOK=cuda[:N]."""
    if isinstance(device, bool):
        return None
    if isinstance(device, int):
        return device if device >= 0 else None
    if type(device) is str and device in _NAMED:
        return _NAMED[device]
    s = str(device).strip().lower()
    m = re.fullmatch(r"cuda(?::(\d+))?", s)
    if not m:
        got = None
    elif m.group(1) is not None:
        got = int(m.group(1))
    else:
        import torch
        return torch.cuda.current_device()  # the thread's, asked each time
    if type(device) is str and len(_NAMED) < 64:
        _NAMED[device] = got
    return got


# Device names whose answer does not depend on the thread (not "cuda"
# alone): a hooked get_tensor asks for PHXMOUNT_HOOK's device each time.
_NAMED: dict = {}


def is_cpu(device) -> bool:
    """Whether a torch device name names the CPU (None: the default, the CPU)."""
    return device is None or str(device).strip().lower() == "cpu"

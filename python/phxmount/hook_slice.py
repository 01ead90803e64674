"""get_slice's answer for a file the hook serves (hook.HookedFile): shape
and dtype from the header, an index read through the file. No torch."""

from __future__ import annotations

from typing import List, Optional

from .dtypes import is_torch_dtype
from .hook_env import cuda_index, is_cpu
from .hook_report import report
from .hook_route import stock_attr
from .stformat import TensorInfo


class HookedSlice:
    """get_slice's answer: shape and dtype from the header; an index reads
    through phxmount when the tensor goes to a GPU and phxmount gives what
    the installed safetensors gives for it, else through the real
    safetensors slice."""

    def __init__(self, file, info: TensorInfo):  # file: a hook.HookedFile
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
            self._file.unbind(self._info.name)
            return
        self._bound = dev
        if dtype is None or is_torch_dtype(dtype, self._info.dtype):
            self._file.bind(dev, self._info.name)
        else:
            self._file.unbind(self._info.name)

    def __getitem__(self, index):
        return self._file.read_slice(self._info, index, self._bound)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        f = self._file  # a method phxmount does not serve: the real slice's (said once)
        return stock_attr(lambda: f.stock_slice(self._info.name), name, lambda m: report.say(
            f"slice {m}", f"{f.path}: get_slice(...).{m}() is not phxmount's: safetensors serves it"))

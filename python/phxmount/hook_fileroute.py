"""Where a hooked file's reads go (hook.HookedFile's routing): the GPU a
read lands on, a reader onto it where the daemon says that GPU can load
from the mount, the real safetensors object for what phxmount does not
serve, and the fall-back to it, for good, after a failure. No torch."""

from __future__ import annotations

import os
from typing import Optional

from .hook_env import cuda_index
from .hook_report import report
from .hook_route import stock_attr
from .stformat import TensorInfo


class Routed:
    """hook.HookedFile's routing (it holds path, device, mode, header,
    _installed, _real, _lock, _closed, _fallen, _open_reader and _let_go)."""

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if not self._installed.has(name):
            raise AttributeError(f"'safe_open' object has no attribute {name!r}")
        return stock_attr(self.stock, name, self._hand_over)

    def stock(self):
        """The real safetensors object of the file (hook_route.Stock)."""
        return self._real.open()

    def stock_slice(self, name: str):
        return self._real.slice(name, self._closed)

    def destination(self, bound: Optional[int]) -> Optional[int]:
        """The GPU a read lands on: the device the file was opened for, or
        where the caller said it goes, or PHXMOUNT_HOOK's; None: the host."""
        if self._fallen is not None:
            return None
        if self.device != "cpu":
            return self.device
        if bound is not None:
            return bound
        if self.mode.cpu_to is not None:
            return cuda_index(self.mode.cpu_to)
        return None

    def _fall_back(self, e: BaseException) -> None:
        """From now on the real safetensors reads the file (_let_go)."""
        with self._lock:
            first = self._fallen is None
            self._fallen = self._fallen or e
        self._let_go()
        if first:
            report.fell_back(self.path, e)

    def _hand_over(self, method: str) -> None:
        """A method phxmount does not serve was called: the file is the
        real safetensors' from here on (said once)."""
        self._fall_back(RuntimeError(f"{method}() of the installed safetensors ({self._installed.version}) "
                                     f"is not phxmount's"))

    def _stock_to(self, info: TensorInfo, index, dev: int):
        """info[index] (index None: the whole tensor) from the real one, on dev."""
        t = self.stock_slice(info.name)[index] if index is not None else self.stock().get_tensor(info.name)
        return t.to(f"cuda:{dev}")

    def _open_new(self, dev: int, fd: Optional[int]):
        """A reader onto dev, on fd, where the daemon says dev can load from
        the mount (availability.known; fd is closed where not)."""
        from .availability import known
        try:
            av = known.get(self.path, dev, fd)
            if not av:
                raise RuntimeError(f"cuda:{dev}: {av.reason}")
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        self._transport = av.transport
        r = self._open_reader(self.path, dev, av, self.header, fd)
        r.fetcher.measure_soon()  # the planner's model, off the caller's thread
        return r

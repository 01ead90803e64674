"""The import machinery under the safetensors hook: a module it watches is
patched as soon as it has been imported, before anyone can take a name
from it, and a replaced function is replaced wherever a module took it."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from typing import Callable, Dict, Iterable, Optional


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


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs watch[name](module) as soon as module name has been imported
    (a meta path finder that wraps the real loader)."""

    def __init__(self, watch: Dict[str, Callable]):
        self.watch = watch
        self._busy = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        after = self.watch.get(fullname)
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


def rebind(attr: str, old, new, skip: Iterable[str] = ()) -> None:
    """Every module that holds old as attr gets new instead (but the
    modules skip names)."""
    skip = set(skip)
    for name, m in list(sys.modules.items()):
        if m is None or name in skip:
            continue
        try:
            if getattr(m, attr, None) is old:
                setattr(m, attr, new)
        except Exception:  # noqa: BLE001: a module whose attributes misbehave
            continue


class Patcher:
    """Functions replaced in watched modules as soon as they are imported
    (watch: module name -> what patches it) and wherever a module took
    them, and put back."""

    def __init__(self, watch: Dict[str, Callable], skip: Iterable[str]):
        self.watch, self.skip = watch, tuple(skip)
        self.finder: Optional[AfterImport] = None
        self.orig: Dict[str, Callable] = {}

    def on(self) -> None:
        """Watches the imports (idempotent) and patches what is imported."""
        if self.finder is None:
            self.finder = AfterImport(self.watch)
            sys.meta_path.insert(0, self.finder)
        for name, after in self.watch.items():
            if name in sys.modules:
                after(sys.modules[name])

    def replace(self, attr: str, real: Callable, new: Callable) -> Callable:
        """new wherever a module holds the original of attr (real, the
        first time); returns the original."""
        orig = self.orig.setdefault(attr, real)
        rebind(attr, orig, new, self.skip)
        return orig

    def off(self, replaced: Dict[str, Callable]) -> None:
        """Stops watching and puts the originals back where replaced[attr]
        is held."""
        if self.finder is not None:
            sys.meta_path.remove(self.finder)
            self.finder = None
        for attr, new in replaced.items():
            real = self.orig.pop(attr, None)
            if real is not None:
                rebind(attr, new, real, self.skip)



def patch_spawn(mod, hooked: Callable[[object], bool]) -> None:
    """transformers' core_model_loading.spawn_materialize, wrapped so that
    it first tells a hooked slice (hooked(tensor)) the device and dtype its
    tensor goes to (HookedSlice.bind)."""
    fn = getattr(mod, "spawn_materialize", None)
    if fn is None:
        from .hook_env import ENV
        from .hook_report import report
        report.say("no-spawn", "transformers has no core_model_loading.spawn_materialize here: "
                               f"tensors it asks for on the cpu stay host tensors ({ENV}=cuda sends them to a GPU)")
        return
    if getattr(fn, "__wrapped__", None) is not None:
        return

    def spawn_materialize(thread_pool, tensor, device=None, dtype=None, *args, **kw):
        if hooked(tensor):
            tensor.bind(device, dtype)
        return fn(thread_pool, tensor, device, dtype, *args, **kw)

    spawn_materialize.__wrapped__ = fn
    mod.spawn_materialize = spawn_materialize


def unpatch_spawn(mod) -> None:
    """Puts transformers' own spawn_materialize back."""
    fn = getattr(mod, "spawn_materialize", None)
    if getattr(fn, "__wrapped__", None) is not None:
        mod.spawn_materialize = fn.__wrapped__

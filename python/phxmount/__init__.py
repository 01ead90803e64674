"""phxmount's Python client: file bytes into GPU memory through the ioctls of
a phxmount mount (docs/abi.md). Pure Python: fcntl for the ioctls, ctypes
for the CUDA driver (libcuda.so.1), torch for the tensors.

    import phxmount
    print(phxmount.available("/mnt/models/model.safetensors"))  # how, or why not
    with phxmount.safe_open("/mnt/models/model.safetensors", "pt", device="cuda:0") as f:
        w = f.get_slice("layers.0.weight")[:, :1024]
    tensors = phxmount.load_safetensors("/mnt/models/model.safetensors", device=0,
                                        shard=(0, rank, world))     # only this rank's bytes
    phxmount.save_safetensors(tensors, "/mnt/models/out.safetensors", fsync=True)

The torch parts (torch_mem, torch_load, torch_save, replicate) are
imported lazily: the ABI, the client, the planner (slicing), the fetch
engine and the safetensors format (stformat: the header parser and
encoder) work without torch. docs/python.md has
the whole API.
"""

__version__ = "0.9.0"  # as python/pyproject.toml says (a test checks)

from . import abi, stformat
from .client import EmuBuffer, PhxError, PhxFile, mount_counters, phx_info_xattr
from .regcache import close_caches, prune_caches

__all__ = ["abi", "stformat", "PhxFile", "PhxError", "EmuBuffer", "phx_info_xattr", "mount_counters",
           "close_caches", "prune_caches", "available", "Availability", "read_into", "register_tensor",
           "register_tensors", "safe_open", "load_safetensors", "load_into", "iter_tensors", "save_safetensors",
           "load_sharded", "load_replicated", "LoadStats", "SaveStats", "PhxFallbackWarning", "load_safetensors_emu"]

_LAZY = {
    "availability": ("available", "Availability"),
    "torch_load": ("safe_open", "load_safetensors", "load_into", "iter_tensors", "load_sharded", "PhxFallbackWarning"),
    "torch_save": ("save_safetensors",),
    "torch_mem": ("read_into", "register_tensor", "register_tensors"),
    "replicate": ("load_replicated",),
    "loader": ("LoadStats", "load_safetensors_emu"),
    "savefile": ("SaveStats",),
}


def __getattr__(name):
    import importlib
    for mod, names in _LAZY.items():
        if name in names:
            return getattr(importlib.import_module(f".{mod}", __name__), name)
    raise AttributeError(name)

"""phxmount's Python client: file bytes into GPU memory through the ioctls of
a phxmount mount (docs/abi.md). Pure Python: fcntl for the ioctls, ctypes
for the CUDA handles (libcuda.so.1), torch for the tensors.

    from phxmount import available, load_safetensors
    ok = available("/mnt/models/model.safetensors")
    print(ok)                       # on the mount? which transport? why not?
    tensors = load_safetensors("/mnt/models/model.safetensors", device=0)

The torch helpers live in phxmount.torch_helpers and are imported lazily, so
the ABI, the client and the safetensors parser work without torch.
"""

from . import abi, safetensors
from .client import EmuBuffer, PhxError, PhxFile, phx_info_xattr

__all__ = ["abi", "safetensors", "PhxFile", "PhxError", "EmuBuffer", "phx_info_xattr",
           "available", "load_safetensors", "read_into", "register_tensor", "Availability", "load_sharded"]


def __getattr__(name):
    if name in ("available", "load_safetensors", "read_into", "register_tensor", "Availability", "load_safetensors_emu"):
        from . import torch_helpers
        return getattr(torch_helpers, name)
    if name == "load_sharded":
        from .sharded import load_sharded
        return load_sharded
    raise AttributeError(name)

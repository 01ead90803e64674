"""The few CUDA driver calls the client needs, through ctypes and
libcuda.so.1 (no compiled extension): device memory, its IPC handle and its
allocation range. Calls run in the device's primary context, the one the
CUDA runtime (and so torch) uses."""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Optional, Tuple

CUDA_SUCCESS = 0
IPC_HANDLE_SIZE = 64


class CudaError(RuntimeError):
    def __init__(self, fn: str, code: int, name: str):
        super().__init__(f"{fn}: {name} ({code})")
        self.code = code


class CUipcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_SIZE)]


# cuPointerGetAttributes attributes (cuda.h CUpointer_attribute) and the
# names pointer_info gives them; each answer fits the 8 bytes it is given.
CU_MEMORYTYPE_DEVICE = 2
_ATTRS = ((2, "memory_type"), (7, "buffer_id"), (9, "device"), (10, "ipc_capable"),
          (11, "base"), (12, "size"))


@dataclass(frozen=True)
class PointerInfo:
    memory_type: int  # 2: device memory
    buffer_id: int  # unique per allocation in this process; 0: no allocation here
    device: int  # ordinal
    base: int  # CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
    size: int  # CU_POINTER_ATTRIBUTE_RANGE_SIZE
    ipc_capable: bool  # CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE


_lock = threading.Lock()
_driver: Optional["Driver"] = None
_load_error: Optional[str] = None


class Driver:
    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        u64, sz, i32, vp = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p
        P = ctypes.POINTER
        sig = {
            "cuInit": [ctypes.c_uint],
            "cuDeviceGet": [P(i32), i32],
            "cuDeviceGetCount": [P(i32)],
            "cuDevicePrimaryCtxRetain": [P(vp), i32],
            "cuCtxSetCurrent": [vp],
            "cuCtxGetCurrent": [P(vp)],
            "cuMemAlloc_v2": [P(u64), sz],
            "cuMemFree_v2": [u64],
            "cuMemGetAddressRange_v2": [P(u64), P(sz), u64],
            "cuIpcGetMemHandle": [P(CUipcMemHandle), u64],
            "cuMemcpyDtoH_v2": [vp, u64, sz],
            "cuMemcpyHtoD_v2": [u64, vp, sz],
            "cuMemsetD8_v2": [u64, ctypes.c_ubyte, sz],
            "cuCtxSynchronize": [],
            "cuPointerGetAttributes": [ctypes.c_uint, P(ctypes.c_int), P(vp), u64],
            "cuMemGetInfo_v2": [P(sz), P(sz)],
            "cuDeviceGetPCIBusId": [ctypes.c_char_p, i32, i32],
            "cuGetErrorName": [ctypes.c_int, P(ctypes.c_char_p)],
        }
        for name, args in sig.items():
            f = getattr(lib, name)
            f.argtypes = args
            f.restype = ctypes.c_int
            setattr(self, name, f)
        self._ctx = {}
        self.check("cuInit", self.cuInit(0))

    def check(self, fn: str, code: int) -> None:
        if code != CUDA_SUCCESS:
            p = ctypes.c_char_p()
            name = "?"
            if self.cuGetErrorName(code, ctypes.byref(p)) == 0 and p.value:
                name = p.value.decode()
            raise CudaError(fn, code, name)

    def device_count(self) -> int:
        n = ctypes.c_int()
        self.check("cuDeviceGetCount", self.cuDeviceGetCount(ctypes.byref(n)))
        return n.value

    def use(self, device: int) -> None:
        """Makes device's primary context current on this thread."""
        ctx = self._ctx.get(device)
        if ctx is None:
            dev = ctypes.c_int()
            self.check("cuDeviceGet", self.cuDeviceGet(ctypes.byref(dev), device))
            c = ctypes.c_void_p()
            self.check("cuDevicePrimaryCtxRetain", self.cuDevicePrimaryCtxRetain(ctypes.byref(c), dev))
            ctx = self._ctx[device] = c
        self.check("cuCtxSetCurrent", self.cuCtxSetCurrent(ctx))

    def mem_alloc(self, device: int, size: int) -> int:
        self.use(device)
        p = ctypes.c_uint64()
        self.check("cuMemAlloc_v2", self.cuMemAlloc_v2(ctypes.byref(p), size))
        return p.value

    def mem_free(self, device: int, ptr: int) -> None:
        self.use(device)
        self.check("cuMemFree_v2", self.cuMemFree_v2(ptr))

    def address_range(self, device: int, ptr: int) -> Tuple[int, int]:
        """(base, size) of the allocation holding ptr."""
        self.use(device)
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self.check("cuMemGetAddressRange_v2", self.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ptr))
        return base.value, size.value

    def pointer_info(self, device: int, ptr: int) -> "PointerInfo":
        """The allocation holding ptr, from cuPointerGetAttributes (which,
        unlike cuPointerGetAttribute, answers zeros rather than an error for
        an address that is no allocation: buffer_id 0)."""
        self.use(device)
        n = len(_ATTRS)
        vals = (ctypes.c_uint64 * n)()
        ptrs = (ctypes.c_void_p * n)(*[ctypes.addressof(vals) + 8 * i for i in range(n)])
        attrs = (ctypes.c_int * n)(*[a for a, _ in _ATTRS])
        self.check("cuPointerGetAttributes", self.cuPointerGetAttributes(n, attrs, ptrs, ptr))
        v = dict(zip((name for _, name in _ATTRS), vals))
        return PointerInfo(memory_type=v["memory_type"] & 0xFFFFFFFF, buffer_id=v["buffer_id"],
                           device=v["device"] & 0xFFFFFFFF, base=v["base"], size=v["size"],
                           ipc_capable=bool(v["ipc_capable"] & 0xFF))

    def pci_bus_id(self, device: int) -> str:
        """The device's PCI address as the driver writes it
        ("00000000:3B:00.0"; client.normalize_pci makes it sysfs's)."""
        dev = ctypes.c_int()
        self.check("cuDeviceGet", self.cuDeviceGet(ctypes.byref(dev), device))
        buf = ctypes.create_string_buffer(64)
        self.check("cuDeviceGetPCIBusId", self.cuDeviceGetPCIBusId(buf, 64, dev.value))
        return buf.value.decode()

    def mem_info(self, device: int) -> Tuple[int, int]:
        """(free, total) bytes of the device, as the driver reports them."""
        self.use(device)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.check("cuMemGetInfo_v2", self.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
        return free.value, total.value

    def ipc_handle(self, device: int, ptr: int) -> bytes:
        """The 64-byte CUipcMemHandle of the allocation whose base is ptr."""
        self.use(device)
        h = CUipcMemHandle()
        self.check("cuIpcGetMemHandle", self.cuIpcGetMemHandle(ctypes.byref(h), ptr))
        return bytes(ctypes.string_at(ctypes.addressof(h), IPC_HANDLE_SIZE))

    def copy_to_host(self, device: int, ptr: int, n: int) -> bytes:
        self.use(device)
        buf = ctypes.create_string_buffer(n)
        self.check("cuMemcpyDtoH_v2", self.cuMemcpyDtoH_v2(buf, ptr, n))
        return buf.raw

    def memset(self, device: int, ptr: int, value: int, n: int) -> None:
        self.use(device)
        self.check("cuMemsetD8_v2", self.cuMemsetD8_v2(ptr, value, n))
        self.check("cuCtxSynchronize", self.cuCtxSynchronize())


def driver() -> Driver:
    """The loaded driver; raises RuntimeError (why) where there is none."""
    global _driver, _load_error
    with _lock:
        if _driver is not None:
            return _driver
        if _load_error is not None:
            raise RuntimeError(_load_error)
        try:
            _driver = Driver(ctypes.CDLL("libcuda.so.1"))
            return _driver
        except (OSError, AttributeError, CudaError) as e:
            _load_error = f"CUDA driver unavailable: {e}"
            raise RuntimeError(_load_error) from None


def driver_error() -> Optional[str]:
    """None when libcuda.so.1 loads and initialises, else why not."""
    try:
        driver()
        return None
    except RuntimeError as e:
        return str(e)

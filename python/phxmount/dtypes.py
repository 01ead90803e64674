"""safetensors dtype names and torch's. torch is imported inside the
functions: importing this module needs no torch."""

from __future__ import annotations

_TORCH_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
    "U16": "uint16", "U32": "uint32", "U64": "uint64", "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
}


def torch_dtype(st_dtype: str):
    dt = _FOUND.get(st_dtype)
    if dt is not None:
        return dt
    import torch
    dt = getattr(torch, _TORCH_DTYPES.get(st_dtype, "?"), None)
    if dt is None:
        raise TypeError(f"safetensors dtype {st_dtype} has no torch {torch.__version__} dtype")
    _FOUND[st_dtype] = dt
    return dt


_FOUND: dict = {}  # torch_dtype's answers: asked for every tensor allocated


def st_dtype(torch_dt) -> str:
    """The safetensors name of a torch dtype."""
    name = str(torch_dt).rsplit(".", 1)[-1]
    for k, v in _TORCH_DTYPES.items():
        if v == name:
            return k
    raise TypeError(f"torch dtype {torch_dt} has no safetensors dtype")


def is_torch_dtype(dtype, st_dt: str) -> bool:
    """Whether dtype (a torch dtype) is the safetensors dtype st_dt's."""
    try:
        return dtype == torch_dtype(st_dt)
    except TypeError:
        return False

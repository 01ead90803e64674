"""Writing a safetensors file through a mount, torch-free: the header with
pwrite, every tensor's bytes with BATCH_WRITE ioctls straight from
registered device memory (the daemon copies device to host, then writes),
then fsync when asked. The file is the format safetensors.torch.load_file
reads: an 8-byte little-endian header length, the JSON header (dtype,
shape, data_offsets; __metadata__), padded with spaces so the data starts
at a multiple of 8, and the data in header order."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from .batchio import BatchIO, wait_all
from .extents import Cols, Run, cut, to_cols
from .fetch import MAX_EXTENTS
from .loader import DEFAULT_TIMEOUT, LoadStats
from .stformat import DEFAULT_CHUNK, encode_header


@dataclass(frozen=True)
class Source:
    """A tensor to write: its bytes are nbytes at buf_off of the
    registered buffer buf_id."""
    name: str
    dtype: str  # safetensors name
    shape: Tuple[int, ...]
    nbytes: int
    buf_id: int
    buf_off: int


@dataclass
class SaveStats(LoadStats):
    """A save's figures: seconds covers header, data and fsync, io_seconds
    the BATCH_WRITE ioctls."""
    fsync_seconds: float = 0.0


def plan_writes(sources: Sequence[Source], data_start: int, offsets: List[int], chunk: int) -> Cols:
    """Every tensor's bytes as extents from its buffer to its place."""
    cols = Cols()
    for s, off in zip(sources, offsets):
        if s.nbytes:
            to_cols(cut([Run(1, off, s.nbytes, s.buf_off, s.nbytes, s.nbytes)], chunk), s.buf_id, 0, data_start, cols)
    return cols


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    mv = memoryview(data)
    while mv:
        n = os.pwrite(fd, mv, offset)
        mv, offset = mv[n:], offset + n


def save(path: Union[str, os.PathLike], sources: Sequence[Source], metadata: Optional[Dict[str, str]] = None,
         fsync: bool = False, *, threads: int = 4, chunk: int = DEFAULT_CHUNK,
         timeout: Optional[float] = DEFAULT_TIMEOUT, keep=None, stats: Optional[SaveStats] = None) -> SaveStats:
    """Writes the file (created or truncated, mode 0666 less the umask).
    keep: the memory the sources are in, held until every write that
    reads it has returned (batchio.submit)."""
    t0 = time.perf_counter()
    st = stats if stats is not None else SaveStats()
    head, offsets = encode_header([(s.name, s.dtype, s.shape, s.nbytes) for s in sources], metadata)
    cols = plan_writes(sources, len(head), offsets, chunk)
    path = os.fspath(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    io = BatchIO(path, threads, write=True)
    try:
        _pwrite_all(fd, head, 0)
        t1 = time.perf_counter()
        futs = [io.submit(part, keep) for part in cols.split(4 * MAX_EXTENTS)]
        wait_all(futs, timeout, f"phx save of {path}")
        t2 = time.perf_counter()
        if fsync:
            os.fsync(fd)
        st.io_seconds, st.fsync_seconds = t2 - t1, time.perf_counter() - t2
    finally:
        io.close()
        os.close(fd)
    st.path, st.bytes, st.tensors, st.extents, st.ioctls = path, cols.nbytes, len(sources), len(cols), io.calls
    st.seconds = time.perf_counter() - t0
    return st

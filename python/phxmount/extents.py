"""Extents as columns: the buffer ids, buffer offsets, lengths and file
offsets of many extents, each an array('Q'). Plans build them from
arithmetic progressions (a row slice, one extent per row of a column
slice, ...) without a Python object per extent, and abi.encode_batch_cols
packs a BATCH ioctl from them by slice assignment: a million extents cost
C loops, not Python ones. Pure Python, no torch."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Iterator, List, Tuple


def _q(values=()) -> array:
    return array("Q", values)


class Cols:
    """Extents in parallel columns (array('Q')): buffer id, buffer offset,
    length, file offset, and, for a strided extent (count > 1), its count
    and its file and buffer strides: count pieces of length bytes, piece k
    at file offset file + k*file_step and buffer offset buf + k*buf_step.
    A plain extent has count 1."""

    __slots__ = ("ids", "bufs", "lens", "files", "counts", "fsteps", "bsteps")

    def __init__(self, ids=None, bufs=None, lens=None, files=None, counts=None, fsteps=None, bsteps=None):
        self.ids = ids if ids is not None else _q()
        self.bufs = bufs if bufs is not None else _q()
        self.lens = lens if lens is not None else _q()
        self.files = files if files is not None else _q()
        self.counts = counts if counts is not None else _q((1,)) * len(self.ids)
        self.fsteps = fsteps if fsteps is not None else _q(self.lens)
        self.bsteps = bsteps if bsteps is not None else _q(self.lens)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def strided(self) -> bool:
        """Some extent has more than one piece (a strided batch carries it)."""
        return bool(self.counts) and max(self.counts) > 1

    @property
    def nbytes(self) -> int:
        if not self.strided:
            return sum(self.lens)
        return sum(n * c for n, c in zip(self.lens, self.counts))

    def want(self, i: int) -> int:
        """The bytes extent i moves when nothing falls short."""
        return self.lens[i] * self.counts[i]

    def add(self, buf_id: int, buf_off: int, length: int, file_off: int) -> None:
        self.ids.append(buf_id)
        self.bufs.append(buf_off)
        self.lens.append(length)
        self.files.append(file_off)
        self.counts.append(1)
        self.fsteps.append(length)
        self.bsteps.append(length)

    def add_run(self, buf_id: int, count: int, buf0: int, buf_step: int, length: int,
                file0: int, file_step: int) -> None:
        """count pieces of length bytes: the k-th at buffer offset
        buf0 + k*buf_step and file offset file0 + k*file_step. Pieces that
        follow on in both stay separate extents (the daemon spreads them
        over its workers); others make one strided extent."""
        if count <= 0:
            return
        if count == 1:
            self.add(buf_id, buf0, length, file0)
            return
        if buf_step != length or file_step != length:
            self.ids.append(buf_id)
            self.bufs.append(buf0)
            self.lens.append(length)
            self.files.append(file0)
            self.counts.append(count)
            self.fsteps.append(file_step)
            self.bsteps.append(buf_step)
            return
        self.ids.extend(_q((buf_id,)) * count)
        self.bufs.extend(_q(range(buf0, buf0 + count * buf_step, buf_step)))
        self.lens.extend(_q((length,)) * count)
        self.files.extend(_q(range(file0, file0 + count * file_step, file_step)))
        self.counts.extend(_q((1,)) * count)
        self.fsteps.extend(_q((length,)) * count)
        self.bsteps.extend(_q((length,)) * count)

    def extend(self, other: "Cols") -> None:
        for name in self.__slots__:
            getattr(self, name).extend(getattr(other, name))

    def part(self, i: int, j: int) -> "Cols":
        return Cols(*(getattr(self, name)[i:j] for name in self.__slots__))

    def split(self, n: int) -> Iterator["Cols"]:
        """Consecutive parts of at most n extents (self, not a copy, where
        it fits in one: the parts are read, never changed)."""
        if 0 < len(self) <= n:
            yield self
            return
        for i in range(0, len(self), n):
            yield self.part(i, i + n)

    def split_pieces(self, n: int, pieces: int) -> Iterator["Cols"]:
        """Consecutive parts of at most n extents and at most pieces pieces
        (their counts summed; what one strided batch may carry): an extent
        of more pieces is cut into runs of its rows."""
        if sum(self.counts) <= pieces:
            yield from self.split(n)
            return
        part, have = Cols(), 0
        for i in range(len(self)):
            done, count = 0, self.counts[i]
            while done < count:
                k = min(count - done, pieces - have)
                for name, v in (("ids", self.ids[i]), ("bufs", self.bufs[i] + done * self.bsteps[i]),
                                ("lens", self.lens[i]), ("files", self.files[i] + done * self.fsteps[i]),
                                ("counts", k), ("fsteps", self.fsteps[i]), ("bsteps", self.bsteps[i])):
                    getattr(part, name).append(v)
                done, have = done + k, have + k
                if have == pieces or len(part) == n:
                    yield part
                    part, have = Cols(), 0
        if len(part):
            yield part

    def extent(self, i: int) -> Tuple[int, int, int, int]:
        """Extent i's buffer id, buffer offset, length (of a piece) and file offset."""
        return self.ids[i], self.bufs[i], self.lens[i], self.files[i]

    def __iter__(self) -> Iterator[Tuple[int, int, int, int]]:
        return zip(self.ids, self.bufs, self.lens, self.files)

    def pieces(self) -> Iterator[Tuple[int, int, int, int]]:
        """Every piece as a plain extent (buffer id, buffer offset, length,
        file offset), extent by extent."""
        for i in range(len(self)):
            for k in range(self.counts[i]):
                yield self.ids[i], self.bufs[i] + k * self.bsteps[i], self.lens[i], self.files[i] + k * self.fsteps[i]

    def expanded(self) -> "Cols":
        """The same pieces as plain extents (for a daemon without strided
        batches)."""
        if not self.strided:
            return self
        c = Cols()
        for buf_id, off, n, fo in self.pieces():
            c.add(buf_id, off, n, fo)
        return c


@dataclass(frozen=True)
class Run:
    """count pieces of length bytes, relative to a tensor's first byte in the
    file (src) and to a destination buffer's first byte (dst)."""
    count: int
    src: int
    src_step: int
    dst: int
    dst_step: int
    length: int

    @property
    def nbytes(self) -> int:
        return self.count * self.length

    @property
    def contiguous(self) -> bool:
        """The pieces follow on in both the file and the buffer."""
        return self.count == 1 or (self.src_step == self.length and self.dst_step == self.length)

    def end(self) -> Tuple[int, int]:
        """(file end, buffer end) of the last piece."""
        last = self.count - 1
        return self.src + last * self.src_step + self.length, self.dst + last * self.dst_step + self.length


def coalesce(runs: List[Run]) -> List[Run]:
    """Merges pieces that follow on in both the file and the buffer: a run
    whose pieces touch becomes one piece, and a one-piece run that starts
    where the previous one ended joins it."""
    out: List[Run] = []
    for r in runs:
        if r.count > 1 and r.contiguous:
            r = Run(1, r.src, r.nbytes, r.dst, r.nbytes, r.nbytes)
        prev = out[-1] if out else None
        if prev is not None and prev.count == 1 and r.count == 1 and (prev.src + prev.length, prev.dst + prev.length) == (r.src, r.dst):
            n = prev.length + r.length
            out[-1] = Run(1, prev.src, n, prev.dst, n, n)
            continue
        out.append(r)
    return out


def cut(runs: List[Run], chunk: int) -> List[Run]:
    """Cuts pieces longer than chunk bytes (the daemon spreads one extent's
    pieces over its workers; a bounded extent also bounds one failure)."""
    if chunk <= 0:
        raise ValueError("chunk must be positive")
    out: List[Run] = []
    for r in runs:
        if r.length <= chunk:
            out.append(r)
            continue
        for k in range(r.count):
            s, d = r.src + k * r.src_step, r.dst + k * r.dst_step
            whole, rest = divmod(r.length, chunk)
            if whole:
                out.append(Run(whole, s, chunk, d, chunk, chunk))
            if rest:
                out.append(Run(1, s + whole * chunk, rest, d + whole * chunk, rest, rest))
    return out


def to_cols(runs: List[Run], buf_id: int, buf_base: int, file_base: int, into: Cols = None) -> Cols:
    """The runs as extents of buffer buf_id: destinations from buf_base,
    sources from file offset file_base."""
    c = into if into is not None else Cols()
    for r in runs:
        c.add_run(buf_id, r.count, buf_base + r.dst, r.dst_step, r.length, file_base + r.src, r.src_step)
    return c


def extent_count(runs: List[Run]) -> int:
    return sum(r.count for r in runs)

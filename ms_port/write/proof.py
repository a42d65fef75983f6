"""Prove a written file holds exactly what was planned: read it back and compare every
tensor with the plan's data, bit for bit.

Two ways. :class:`Checks` goes along with a writer: each tensor is read back from the
file and compared as soon as it is written, in a thread of its own, while the next ones
are prepared and written; once the file is complete its framing is read as any reader
would read it, and every tensor must lie exactly where its bytes were compared, with its
planned name, shape and dtype. :func:`readback` reads a finished file whole (a ``.pth``,
which ``torch.save`` writes at once).

A tensor made a group at a time (a mixture's experts, each transposed) is compared with
the digests (XXH3-128, :mod:`ms_port._digest`) of its groups, taken as each group was
made, in the worker that made it, before the writer or a reused buffer could touch it.
Making every group again for the comparison (transposing every expert twice) doubled the
work of converting experts (DeepSeek-V4 widths, 64 experts, 2 layers: 15 s of 31). The
digests tell the file's bytes from the ones made; the transforms that made them are held
to MindFormers' own converters by the tests. Every other tensor is compared with the
plan's data read or made again, so that a fault in joining or casting it is caught.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import traceback
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

from .._digest import Running
from ..errors import ReadbackError
from ..match.layouts import LayoutError
from ..match.plan import Match, Plan
from ..read.ckpt import CkptReader, tensor_bytes
from ..read.sources import read_source, safetensors_layout
from ..read.tensors import flat_bytes, released_chunks, same_bits

Progress = Callable[[str, int, int], None]  # (phase, done_bytes, total_bytes)
#: target -> (bytes, digest) of each group, in order, as the writer's worker made them
Digests = dict[str, tuple[tuple[int, int], ...]]
#: where a tensor's data lies in a file: ``(offset, nbytes)`` of each piece, in order
Spans = tuple[tuple[int, int], ...]


class Checks:
    """The proof that goes along with a writer (``ckpt`` and ``safetensors``).

    The writer calls :meth:`written` after each tensor: the file is flushed and the
    tensor's bytes are compared with the plan's data in the ``ms-port-check`` thread,
    from the file (the page cache), while the writer goes on. Then :meth:`finish`, once
    the file is complete, waits for the comparisons and reads the file's framing as a
    reader would (a checkpoint's records and CRC trailer, a safetensors header): every
    planned tensor, and no other, at exactly the bytes that were compared, with its
    planned shape and dtype. A tensor's bytes changed after their comparison go unseen;
    only the writer writes the file, and it only appends.

    The checks read their own copies of the plan's data (``plan.expected``, the parts'
    loads), never the writer's arrays, whose buffers are reused; a tensor made a group at
    a time is compared with ``digests``, each group's taken as it was made. Use as a
    context manager: leaving it on an error cancels what is still queued.
    """

    def __init__(self, plan: Plan, file: BinaryIO, path: Path, *, format: str,
                 progress: Progress | None = None, digests: Digests | None = None) -> None:
        self._plan, self._file, self._path = plan, file, path
        self._digests = {} if digests is None else digests
        self._format, self._progress = format, progress
        self._pool = ThreadPoolExecutor(1, "ms-port-check")
        self._fd = os.open(path, os.O_RDONLY)
        self._checks: list[tuple[Match, Spans, Future[bool]]] = []

    def written(self, match: Match, spans: Spans) -> None:
        """``match``'s tensor is written at ``spans`` of the file: compare it now."""
        self._file.flush()  # the check maps the file: the writer's buffered tail first
        self._checks.append((match, spans, self._pool.submit(self._same, match, spans)))

    def _same(self, match: Match, spans: Spans) -> bool:
        nbytes = sum(n for _, n in spans)
        if nbytes != match.nbytes:
            return False
        if nbytes == 0:
            return _same_stream([], _planned_bytes(self._plan, match))
        # only the tensor's own pages are mapped (from the page boundary before it)
        base = spans[0][0] - spans[0][0] % mmap.ALLOCATIONGRANULARITY
        end = spans[-1][0] + spans[-1][1]
        try:
            buf = mmap.mmap(self._fd, end - base, offset=base, access=mmap.ACCESS_READ)
        except ValueError as exc:  # the file is shorter than the writer says
            raise ReadbackError(f"{self._path}: tensor {match.target!r} cannot be read back "
                                f"from the written file ({exc})", path=self._path) from exc
        except OSError as exc:
            raise ReadbackError(f"{self._path}: tensor {match.target!r} cannot be mapped to "
                                f"be read back ({exc.strerror or exc}); is the address space "
                                "limited (ulimit -v)?", path=self._path) from exc
        try:
            made = self._digests.get(match.target)
            if made is not None:
                return _same_digests(_mapped(buf, base, spans), made)
            return _same_stream(_mapped(buf, base, spans), _planned_bytes(self._plan, match))
        except BaseException as exc:
            # the failed frames' views of the map would keep it (and the deleted temporary
            # file) open for as long as the exception lives
            traceback.clear_frames(exc.__traceback__)
            raise
        finally:
            with contextlib.suppress(BufferError):
                buf.close()

    def finish(self) -> None:
        """Wait for every comparison, then check the complete file's framing.

        Raises:
            ReadbackError: naming the tensors that differ, are missing, extra or
                elsewhere than their compared bytes.
        """
        bad: list[str] = []
        total, done = self._plan.nbytes, 0
        for match, _, future in self._checks:
            if not future.result():
                bad.append(match.target)
            done += match.nbytes
            if self._progress:
                self._progress("readback", done, total)
        listed = self._framing()
        _same_names(self._path, listed, [m.target for m in self._plan.matches])
        checked = {m.target: (m.shape, m.out_dtype, spans) for m, spans, _ in self._checks}
        for name, where in listed.items():
            # elsewhere than the compared bytes, in another shape or dtype, or never
            # reported by the writer (so never compared)
            if checked.get(name) != where and name not in bad:
                bad.append(name)
        _raise_if_bad(self._path, bad)

    def _framing(self) -> dict[str, tuple[tuple[int, ...], str, Spans]]:
        """Every tensor the complete file lists: name -> (shape, dtype, spans)."""
        try:
            if self._format == "ckpt":
                reader = CkptReader(self._path)
                _check_crc(self._path, reader)
                return {e.name: (e.shape, e.dtype, e.pieces or ((e.offset, e.nbytes),))
                        for e in reader.entries}
            return _safetensors_framing(self._path)
        except ReadbackError:
            raise
        except Exception as exc:
            raise ReadbackError(f"{self._path}: the written file cannot be read back ({exc})",
                                path=self._path) from exc

    def close(self) -> None:
        try:
            self._pool.shutdown(wait=True, cancel_futures=True)
        finally:
            os.close(self._fd)
            self._checks.clear()  # a failed check's exception refers back to this object

    def __enter__(self) -> Checks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _safetensors_framing(path: Path) -> dict[str, tuple[tuple[int, ...], str, Spans]]:
    """A safetensors file's tensors where its validated header puts them."""
    entries, _ = safetensors_layout(path)
    return {name: (shape, dtype, ((offset, nbytes),))
            for name, (shape, dtype, offset, nbytes) in entries.items()}


class _NotPlanned(Exception):
    """The plan's data for a target has another shape than the target: it differs."""


def _planned_bytes(plan: Plan, m: Match) -> Iterator[np.ndarray]:
    """The bytes the plan puts in ``m``'s target, in order, as consecutive ``uint8``
    arrays. A fused tensor is joined again from its sources a few groups at a time (the
    writer's joined copy is in a buffer it reuses), anything else is ``plan.expected``.

    Raises:
        _NotPlanned: when asked for the first chunk, if the data has another shape.
    """
    if m.groups:  # as the writer made it: one group at a time
        for group in plan.grouped(m):
            yield tensor_bytes(group)[2]
        return
    if m.parts and not m.transforms and m.out_dtype == m.dtype and m.layout is not None:
        parts = [_little_endian(plan.source.tensors[p].load()) for p in m.parts]
        yield from _joined_bytes(m.shape, m.layout, parts)
        return
    want = plan.expected(m)
    if tuple(want.shape) != tuple(m.shape):
        raise _NotPlanned
    # as the files store it (little-endian); a mapped source's pages let go as compared
    yield from released_chunks(tensor_bytes(want)[2], _RELEASE_BYTES)


def _little_endian(array: np.ndarray) -> np.ndarray:
    """``array`` with its bytes in little-endian order (the files' order): a copy only
    where it is big-endian (a source built through the API)."""
    if array.dtype.byteorder == ">":
        return array.byteswap().view(array.dtype.newbyteorder("<"))
    return array


def _same_stream(have: Iterable[np.ndarray], want: Iterable[np.ndarray]) -> bool:
    """Whether two runs of byte arrays hold the same bytes end to end, however each is
    cut (a checkpoint's records and release steps, a layout's joined rows)."""
    pieces, piece = iter(have), _NOTHING
    try:
        for chunk in want:
            while chunk.size:
                while not piece.size:
                    piece = next(pieces, None)
                    if piece is None:
                        return False
                n = min(chunk.size, piece.size)
                if not same_bits(piece[:n], chunk[:n]):
                    return False
                piece, chunk = piece[n:], chunk[n:]
    except _NotPlanned:
        return False
    return not piece.size and not any(p.size for p in pieces)


def _same_digests(have: Iterable[np.ndarray],
                  made: tuple[tuple[int, int], ...]) -> bool:
    """Whether a run of byte arrays, however cut, is the groups ``made`` lists: each
    group's bytes have its digest, and nothing is left over."""
    pieces, piece = iter(have), _NOTHING
    for size, want in made:
        running, left = Running(), size
        while left:
            while not piece.size:
                piece = next(pieces, None)
                if piece is None:
                    return False
            n = min(left, piece.size)
            running.update(piece[:n])
            piece, left = piece[n:], left - n
        if running.value() != want:
            return False
    return not piece.size and not any(p.size for p in pieces)


_NOTHING = np.empty(0, np.uint8)
#: bytes of a written tensor compared before its pages are let go: the process holds
#: at most this much of the output mapped (the pages stay in the page cache)
_RELEASE_BYTES = 32 << 20


def _mapped(buf: mmap.mmap, base: int, spans: Spans) -> Iterator[np.ndarray]:
    """The bytes at ``spans`` of the file mapped in ``buf`` from offset ``base``, a
    release step at a time; each step's pages leave the process once it is compared."""
    for offset, n in spans:
        for at in range(offset - base, offset - base + n, _RELEASE_BYTES):
            k = min(_RELEASE_BYTES, offset - base + n - at)
            yield np.frombuffer(buf, np.uint8, count=k, offset=at)
            if hasattr(mmap, "MADV_DONTNEED"):
                start = at - at % mmap.PAGESIZE
                with contextlib.suppress(OSError):  # only memory is at stake
                    buf.madvise(mmap.MADV_DONTNEED, start, at + k - start)


def _same_names(path: Path, listed: Any, expected: list[str]) -> None:
    if sorted(listed) != sorted(expected):  # safetensors lists names sorted
        extra = sorted(set(listed) - set(expected))
        lost = sorted(set(expected) - set(listed))
        raise ReadbackError(f"{path}: read back {len(listed)} tensors, expected "
                            f"{len(expected)} (missing {lost[:3]}, extra {extra[:3]})",
                            path=path)


def _raise_if_bad(path: Path, bad: list[str]) -> None:
    if bad:
        raise ReadbackError(f"{path}: {len(bad)} tensors differ from their source after "
                            f"writing: {', '.join(bad[:5])}; the disk or the writer is "
                            "faulty — nothing was put in place", path=path, tensors=bad)


def _check_crc(path: Path, reader: CkptReader) -> None:
    if reader.has_crc and reader.crc_ok is False:
        raise ReadbackError(f"{path}: the written file fails its own CRC check; the disk "
                            "or the writer is faulty — nothing was put in place", path=path)


def readback(plan: Plan, path: Path, *, format: str = "ckpt",
             progress: Progress | None = None) -> None:
    """Read a finished file as any source (a ``.pth`` that ``torch.save`` wrote whole)
    and compare every tensor with the plan's data, bit for bit, one tensor at a time.

    Raises:
        ReadbackError: naming the tensors that differ, or those missing or extra.
    """
    try:
        written = read_source(path, strip_prefixes=False, config=False)
    except Exception as exc:
        raise ReadbackError(f"{path}: the written file cannot be read back ({exc})",
                            path=path) from exc
    listed = {n: (t.shape, t.dtype) for n, t in written.tensors.items()}
    _same_names(path, listed, [m.target for m in plan.matches])
    bad: list[str] = []
    total, done = plan.nbytes, 0
    for m in plan.matches:
        if listed[m.target] != (m.shape, m.out_dtype) or not _same_stream(
                [flat_bytes(written.tensors[m.target].load())], _planned_bytes(plan, m)):
            bad.append(m.target)
        done += m.nbytes
        if progress:
            progress("readback", done, total)
    _raise_if_bad(path, bad)


#: bytes of a fused tensor joined at a time by the readback (stays in cache)
_JOIN_BYTES = 1 << 20


def _joined_bytes(shape: tuple[int, ...], layout: Any, parts: list[np.ndarray]
                  ) -> Iterator[np.ndarray]:
    """A fused tensor's bytes from its parts, a few groups at a time, through one small
    reused buffer: comparing an interleaved gate/up weight's 4 KiB rows one by one where
    they lie (11,264 calls per layer) took twice as long.

    Raises:
        _NotPlanned: a part in another shape than the layout gives it in ``shape``.
    """
    dtypes = {p.dtype for p in parts}
    if len(shape) <= layout.axis or len(dtypes) > 1:
        try:
            joined = layout.join(parts)
        except LayoutError:
            raise _NotPlanned from None
        if tuple(joined.shape) != tuple(shape):
            raise _NotPlanned
        yield flat_bytes(joined)
        return
    try:  # each part's shape where the layout puts it: a right size alone is not enough
        shapes = [layout.part_shape(shape, i) for i in range(len(layout.sizes))]
    except LayoutError:
        raise _NotPlanned from None
    if len(parts) != len(shapes) or any(p.shape != s for p, s in zip(parts, shapes)):
        raise _NotPlanned
    # the fused tensor as rows of bytes, one per group (and per index before the axis)
    rows = math.prod(shape[:layout.axis]) * layout.groups
    if rows == 0 or not sum(p.nbytes for p in parts):
        return
    wants = [flat_bytes(p).reshape(rows, -1) for p in parts]
    width = sum(w.shape[1] for w in wants)
    step = max(1, _JOIN_BYTES // width)
    joined = np.empty((min(step, rows), width), np.uint8)
    for i in range(0, rows, step):
        k = min(step, rows - i)
        # a few groups' rows of every part side by side: the fused layout's bytes
        np.concatenate([want[i:i + k] for want in wants], axis=1, out=joined[:k])
        yield joined[:k].reshape(-1)

"""Prove a written file holds exactly what was planned: read it back and compare every
tensor with the plan's data, bit for bit.

Two ways. :class:`Checks` goes along with a writer: each tensor is read back from the
file and compared as soon as it is written, in a thread of its own, while the next ones
are prepared and written; once the file is complete its framing is read as any reader
would read it, and every tensor must lie exactly where its bytes were compared, with its
planned name, shape and dtype. :func:`readback` reads a finished file whole (a ``.pth``,
which ``torch.save`` writes at once).
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

from ..errors import ReadbackError
from ..match.layouts import LayoutError
from ..match.plan import Match, Plan
from ..read.ckpt import CkptEntry, CkptReader, load_entry
from ..read.sources import SAFETENSORS_DTYPES, read_source
from ..read.tensors import itemsize, same_bits

Progress = Callable[[str, int, int], None]  # (phase, done_bytes, total_bytes)
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
    loads), never the writer's arrays, whose buffers are reused. Use as a context
    manager: leaving it on an error cancels what is still queued.
    """

    def __init__(self, plan: Plan, file: BinaryIO, path: Path, *, format: str,
                 progress: Progress | None = None) -> None:
        self._plan, self._file, self._path = plan, file, path
        self._format, self._progress = format, progress
        self._pool = ThreadPoolExecutor(1, "ms-port-check")
        self._fd = os.open(path, os.O_RDONLY)
        self._checks: list[tuple[Match, Spans, Future[bool]]] = []

    def written(self, match: Match, spans: Spans) -> None:
        """``match``'s tensor is written at ``spans`` of the file: compare it now."""
        self._file.flush()  # the check maps the file: the writer's buffered tail first
        self._checks.append((match, spans, self._pool.submit(self._same, match, spans)))

    def _same(self, match: Match, spans: Spans) -> bool:
        entry = CkptEntry(match.target, match.shape, match.out_dtype, spans[0][0],
                          sum(n for _, n in spans), spans)
        end = spans[-1][0] + spans[-1][1]
        if entry.nbytes != _numel(match.shape) * itemsize(match.out_dtype):
            return False
        if entry.nbytes == 0:
            return True
        try:
            buf = mmap.mmap(self._fd, end, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:  # the file is shorter than the writer says
            raise ReadbackError(f"{self._path}: tensor {match.target!r} cannot be read back "
                                f"from the written file ({exc})", path=self._path) from exc
        try:
            got = load_entry(buf, entry)
            same = _same_data(self._plan, match, got)
            del got  # its pages leave the process with the map
        finally:
            with contextlib.suppress(BufferError):
                buf.close()
        return same

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
            done += _numel(match.shape) * itemsize(match.out_dtype)
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
        self._pool.shutdown(wait=True, cancel_futures=True)
        os.close(self._fd)

    def __enter__(self) -> Checks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _safetensors_framing(path: Path) -> dict[str, tuple[tuple[int, ...], str, Spans]]:
    """A safetensors file's tensors where its header puts them, once the safetensors
    library has validated that header against the file (offsets tiling the data)."""
    read_source(path, strip_prefixes=False)  # validates, or raises
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return {name: (tuple(e["shape"]), SAFETENSORS_DTYPES[e["dtype"]],
                   ((8 + size + e["data_offsets"][0],
                     e["data_offsets"][1] - e["data_offsets"][0]),))
            for name, e in header.items()}


def _same_data(plan: Plan, m: Match, got: np.ndarray) -> bool:
    """Whether ``got`` holds the bits the plan puts in ``m``'s target."""
    fused = m.parts and not m.transforms and m.out_dtype == m.dtype
    if fused and m.layout is not None:
        # a fused tensor is compared part by part: no second join of its sources
        return _same_parts(got, m, [plan.source.tensors[p].load() for p in m.parts])
    want = plan.expected(m)
    return tuple(got.shape) == tuple(want.shape) and same_bits(got, want)


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
    """Read ``path`` and compare every tensor with the plan's data, bit for bit.

    Raises:
        ReadbackError: naming the first tensors that differ, are missing or extra.
    """
    try:
        listed, views = _written(path, format)
    except ReadbackError:
        raise
    except Exception as exc:
        raise ReadbackError(f"{path}: the written file cannot be read back ({exc})",
                            path=path) from exc
    _same_names(path, listed, [m.target for m in plan.matches])
    bad: list[str] = []
    total, done = plan.nbytes, 0
    with views as view:
        for m in plan.matches:
            if listed[m.target] != (m.shape, m.out_dtype) or \
                    not _same_data(plan, m, view(m.target)):
                bad.append(m.target)
            done += _numel(m.shape) * itemsize(m.out_dtype)
            if progress:
                progress("readback", done, total)
    _raise_if_bad(path, bad)


def _written(path: Path, format: str) -> tuple[dict[str, tuple[tuple[int, ...], str]],
                                               contextlib.AbstractContextManager]:
    """What the written file lists (name -> shape, dtype), and ``view(name)`` for one
    comparison each. A checkpoint is listed once and viewed over one map (reading its
    tensors into fresh arrays took most of a 2 GiB readback); other formats are read as
    any source, and a safetensors file's loads are maps already."""
    if format == "ckpt":
        reader = CkptReader(path)
        _check_crc(path, reader)
        return {e.name: (e.shape, e.dtype) for e in reader.entries}, reader.views()
    written = read_source(path, strip_prefixes=False)
    return ({n: (t.shape, t.dtype) for n, t in written.tensors.items()},
            contextlib.nullcontext(lambda name: written.tensors[name].load()))


def _numel(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


#: bytes of a fused tensor joined at a time by the readback (stays in cache)
_JOIN_BYTES = 1 << 20


def _same_parts(got: np.ndarray, match: Any, parts: list[np.ndarray]) -> bool:
    """Whether a fused tensor read back holds each part where its layout puts it.

    The parts are joined a few groups at a time into one small buffer, which is compared
    with the bytes it should equal: an interleaved gate/up weight alternates 4 KiB rows,
    and comparing each row where it lies (11,264 calls per layer) took twice as long."""
    layout = match.layout
    if got.ndim <= layout.axis or any(p.dtype != got.dtype for p in parts):
        return same_bits(got, layout.join(parts))
    try:  # each part's shape where the layout puts it: a right size alone is not enough
        shapes = [layout.part_shape(got.shape, i) for i in range(len(layout.sizes))]
    except LayoutError:
        return False
    if len(parts) != len(shapes) or any(p.shape != s for p, s in zip(parts, shapes)):
        return False
    # the fused tensor as rows of bytes, one per group (and per index before the axis)
    rows = math.prod(got.shape[:layout.axis]) * layout.groups
    if got.nbytes == 0:
        return True
    have = _byte_rows(got, rows)
    wants = [_byte_rows(p, rows) for p in parts]
    step = max(1, _JOIN_BYTES // have.shape[1])
    joined = np.empty((min(step, rows), have.shape[1]), np.uint8)
    for i in range(0, rows, step):
        k = min(step, rows - i)
        # a few groups' rows of every part side by side: the fused layout's bytes
        np.concatenate([want[i:i + k] for want in wants], axis=1, out=joined[:k])
        if not same_bits(have[i:i + k], joined[:k]):
            return False
    return True


def _byte_rows(array: np.ndarray, rows: int) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).reshape(rows, -1)

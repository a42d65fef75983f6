"""Prove a written file holds exactly what was planned: read it back and compare every
tensor with the plan's data, bit for bit."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import ReadbackError
from ..match.layouts import LayoutError
from ..match.plan import Plan
from ..read.ckpt import CkptReader
from ..read.sources import read_source
from ..read.tensors import itemsize, same_bits

Progress = Callable[[str, int, int], None]  # (phase, done_bytes, total_bytes)


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
    expected = [m.target for m in plan.matches]
    if sorted(listed) != sorted(expected):  # safetensors lists names sorted
        extra = sorted(set(listed) - set(expected))
        lost = sorted(set(expected) - set(listed))
        raise ReadbackError(f"{path}: read back {len(listed)} tensors, expected "
                            f"{len(expected)} (missing {lost[:3]}, extra {extra[:3]})",
                            path=path)
    bad: list[str] = []
    total, done = plan.nbytes, 0
    with views as view:
        for m in plan.matches:
            shape, dtype = listed[m.target]
            fused = m.parts and not m.transforms and m.out_dtype == m.dtype
            if fused and m.layout is not None:
                # a fused tensor is compared part by part: no second join of its sources
                same = shape == m.shape and dtype == m.out_dtype and _same_parts(
                    view(m.target), m, [plan.source.tensors[p].load() for p in m.parts])
            else:
                want = plan.expected(m)
                same = (shape == tuple(want.shape) and dtype == m.out_dtype
                        and same_bits(view(m.target), want))
            if not same:
                bad.append(m.target)
            done += _numel(m.shape) * itemsize(m.out_dtype)
            if progress:
                progress("readback", done, total)
    if bad:
        raise ReadbackError(f"{path}: {len(bad)} tensors differ from their source after "
                            f"writing: {', '.join(bad[:5])}; the disk or the writer is "
                            "faulty — nothing was put in place", path=path, tensors=bad)


def _written(path: Path, format: str) -> tuple[dict[str, tuple[tuple[int, ...], str]],
                                               contextlib.AbstractContextManager]:
    """What the written file lists (name -> shape, dtype), and ``view(name)`` for one
    comparison each. A checkpoint is listed once and viewed over one map (reading its
    tensors into fresh arrays took most of a 2 GiB readback); other formats are read as
    any source, and a safetensors file's loads are maps already."""
    if format == "ckpt":
        reader = CkptReader(path)
        if reader.has_crc and reader.crc_ok is False:
            raise ReadbackError(f"{path}: the written file fails its own CRC check; the disk "
                                "or the writer is faulty — nothing was put in place",
                                path=path)
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

"""Fused tensors as data: how several tensors are laid out inside one.

One family covers every layout LLM checkpoints use. A fused tensor is its parts
concatenated along ``axis`` **per group**: the fused axis holds ``groups`` blocks, and
each block holds ``sizes[0]`` rows of part 0, then ``sizes[1]`` rows of part 1, …

- ``concat`` is one group: ``[q; k; v]``;
- ``grouped`` is one block per KV head: for each head g, its ``R·d`` query rows, then
  ``d`` key rows, then ``d`` value rows (MindFormers' ``w_qkv``);
- ``interleave`` is one block per row: ``gate₀, up₀, gate₁, up₁, …`` (MindFormers'
  ``w_gate_hidden``).

:meth:`Layout.join` builds the fused array from its parts (convert), :meth:`Layout.part`
takes one part back out (split on convert, or export's inverse). Both reshape, so a
round trip is bit-exact in any dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..read.tensors import flat_bytes
from .transforms import fast_swap, swap_into

#: the layouts a mapping file may name
KINDS = ("concat", "grouped", "interleave")


class LayoutError(ValueError):
    """Parts and layout do not agree (a config that does not fit the tensors)."""


@dataclass(frozen=True)
class Layout:
    """A resolved layout: ``groups`` blocks along ``axis``, ``sizes[i]`` rows of part i each.

    Attributes:
        kind: ``concat``, ``grouped`` or ``interleave`` (for reports; the numbers decide).
        axis: the fused axis (non-negative).
        groups: blocks along the axis.
        sizes: rows of each part per block.
        why: where ``groups``/``sizes`` came from (``kv_heads=2 (num_key_value_heads)``).
    """

    kind: str
    axis: int
    groups: int
    sizes: tuple[int, ...]
    why: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise LayoutError(f"unknown layout {self.kind!r}; known: {', '.join(KINDS)}")
        if self.groups < 1 or not self.sizes or min(self.sizes) < 1 or self.axis < 0:
            raise LayoutError(f"layout {self.kind} needs a positive number of groups and "
                              f"sizes, got groups={self.groups}, sizes={list(self.sizes)}")

    @property
    def block(self) -> int:
        return sum(self.sizes)

    def _check_index(self, i: int) -> None:
        if not 0 <= i < len(self.sizes):
            raise LayoutError(f"{self} has parts 0..{len(self.sizes) - 1}, not {i}")

    def part_shape(self, fused: tuple[int, ...], i: int) -> tuple[int, ...]:
        """The shape of part ``i`` inside a fused tensor of shape ``fused``."""
        self._check_index(i)
        self._check_fused(fused)
        return (*fused[:self.axis], self.groups * self.sizes[i], *fused[self.axis + 1:])

    def fused_shape(self, parts: list[tuple[int, ...]]) -> tuple[int, ...]:
        """The fused shape of ``parts``; raises :class:`LayoutError` naming the part that
        does not fit."""
        if len(parts) != len(self.sizes):
            raise LayoutError(f"{self} has {len(self.sizes)} parts, got {len(parts)}")
        first = parts[0]
        if len(first) <= self.axis:
            raise LayoutError(f"{self}: part 1 has shape {list(first)}, no axis {self.axis}")
        for i, (shape, size) in enumerate(zip(parts, self.sizes)):
            others = (*shape[:self.axis], *shape[self.axis + 1:])
            if len(shape) != len(first) or others != (*first[:self.axis],
                                                      *first[self.axis + 1:]):
                raise LayoutError(f"{self}: part {i + 1} has shape {list(shape)}, which "
                                  f"differs from part 1 ({list(first)}) off axis {self.axis}")
            if shape[self.axis] != self.groups * size:
                raise LayoutError(
                    f"{self}: part {i + 1} has {shape[self.axis]} rows on axis {self.axis}, "
                    f"the layout says {self.groups} x {size} = {self.groups * size}"
                    + (f" ({self.why})" if self.why else "")
                    + " — the config does not fit the tensors")
        return (*first[:self.axis], self.groups * self.block, *first[self.axis + 1:])

    def join(self, parts: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """The fused array of ``parts`` (convert); into ``out`` (a flat uint8 buffer of at
        least its size) when given, so a stream of fused tensors reuses one allocation."""
        shape = self.fused_shape([tuple(p.shape) for p in parts])
        a = self.axis
        blocks = [p.reshape(*p.shape[:a], self.groups, size, *p.shape[a + 1:])
                  for p, size in zip(parts, self.sizes)]
        first = parts[0].shape
        joined_shape = (*first[:a], self.groups, self.block, *first[a + 1:])
        if out is not None and len({p.dtype for p in parts}) == 1:
            nbytes = int(np.prod(shape, dtype=np.int64)) * parts[0].dtype.itemsize
            if out.nbytes >= nbytes:
                target = out[:nbytes].view(parts[0].dtype).reshape(joined_shape)
                np.concatenate(blocks, axis=a + 1, out=target)
                return target.reshape(shape)
        return np.concatenate(blocks, axis=a + 1).reshape(shape)

    def join_swapped(self, parts: list[np.ndarray], empty: Callable[..., np.ndarray] = np.empty
                     ) -> np.ndarray | None:
        """``self.join(parts).T`` as a C-contiguous array, made without the joined copy:
        each part's rows (or columns) transposed straight into their band of the output
        (a mixture's ``[w1_e; w3_e]`` made ``[H, 2F]`` with one pass over the bytes, not
        two). None where that is not faster or not the same: parts not 2-D, of different
        or non-native dtypes (``join`` makes those native), or elements OpenCV's transpose
        does not move (:func:`~.transforms.fast_swap`). The output is ``empty(shape,
        dtype)`` (a writer's buffers used again: :mod:`ms_port.write.recycle`)."""
        if (any(p.ndim != 2 for p in parts) or len({p.dtype for p in parts}) != 1
                or not parts[0].dtype.isnative or not fast_swap(parts[0].dtype)):
            return None
        rows, cols = self.fused_shape([tuple(p.shape) for p in parts])
        out = empty((cols, rows), parts[0].dtype)
        at = 0
        for g in range(self.groups):
            for part, size in zip(parts, self.sizes):
                cut = slice(g * size, (g + 1) * size)
                if self.axis == 0:
                    swap_into(part[cut], out[:, at:at + size])
                else:
                    swap_into(part[:, cut], out[at:at + size])
                at += size
        return out

    def chunks(self, parts: list[np.ndarray], nbytes: int, *, buffers: int = 1
               ) -> Iterator[np.ndarray]:
        """The fused array of ``parts`` as consecutive flat ``uint8`` arrays of whole
        groups, about ``nbytes`` each (at least one group), joined through ``buffers``
        reused buffers in turn: each is valid until ``buffers`` more are asked for (two let
        a worker join the next while the last is used). A writer takes the fused tensor a
        cache-sized piece at a time instead of joining it whole. Where a group's rows are
        not contiguous in the fused array (dimensions of more than one before the axis)
        or the parts' dtypes differ, a single array: the whole join.
        """
        shape = self.fused_shape([tuple(p.shape) for p in parts])
        a = self.axis
        if math.prod(shape[:a]) != 1 or len({p.dtype for p in parts}) != 1:
            yield flat_bytes(self.join(parts))
            return
        group = self.block * math.prod(shape[a + 1:]) * parts[0].dtype.itemsize
        if group == 0:
            return
        step = max(1, nbytes // group)
        outs = [np.empty(min(step, self.groups) * group, np.uint8) for _ in range(buffers)]
        for turn, g in enumerate(range(0, self.groups, step)):
            k = min(step, self.groups - g)
            rows = [p[(slice(None),) * a + (slice(g * size, (g + k) * size),)]
                    for p, size in zip(parts, self.sizes)]
            yield flat_bytes(replace(self, groups=k).join(rows, out=outs[turn % buffers]))

    def part(self, fused: np.ndarray, i: int) -> np.ndarray:
        """Part ``i`` of ``fused`` (split, or the way back)."""
        self._check_index(i)
        self._check_fused(tuple(fused.shape))
        a = self.axis
        blocks = fused.reshape(*fused.shape[:a], self.groups, self.block, *fused.shape[a + 1:])
        start = sum(self.sizes[:i])
        index = (slice(None),) * (a + 1) + (slice(start, start + self.sizes[i]),)
        out = blocks[index]
        return np.ascontiguousarray(out.reshape(*fused.shape[:a], self.groups * self.sizes[i],
                                                *fused.shape[a + 1:]))

    def _check_fused(self, fused: tuple[int, ...]) -> None:
        if len(fused) <= self.axis or fused[self.axis] != self.groups * self.block:
            raise LayoutError(f"{self} needs {self.groups * self.block} rows on axis "
                              f"{self.axis}; the fused tensor has shape {list(fused)}")

    def to_data(self) -> dict[str, Any]:
        """As a mapping file writes it, with the numbers resolved."""
        if self.kind == "concat":
            return {"concat": self.axis}
        if self.kind == "interleave":
            return {"interleave": self.axis}
        return {"grouped": self.groups, "sizes": list(self.sizes), "axis": self.axis}

    def __str__(self) -> str:
        if self.kind == "grouped":
            return (f"grouped(axis={self.axis}, groups={self.groups}, "
                    f"sizes={list(self.sizes)})")
        return f"{self.kind}(axis={self.axis})"


def concat(sizes: list[int], axis: int = 0) -> Layout:
    """Plain concatenation of parts with ``sizes`` rows."""
    return Layout("concat", axis, 1, tuple(sizes))


def interleave(rows: int, parts: int, axis: int = 0) -> Layout:
    """``parts`` tensors of ``rows`` rows each, one row of each in turn."""
    return Layout("interleave", axis, rows, (1,) * parts)


def grouped(groups: int, sizes: list[int], axis: int = 0, why: str = "") -> Layout:
    """``groups`` blocks, each with ``sizes[i]`` rows of part i."""
    return Layout("grouped", axis, groups, tuple(sizes), why)


__all__ = ["KINDS", "Layout", "LayoutError", "concat", "grouped", "interleave"]

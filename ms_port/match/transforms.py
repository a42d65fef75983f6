"""Per-tensor transforms: small, declared, and each with its inverse.

A transform is data (``{"unsqueeze": 2}`` in YAML); :data:`OPS` holds, for each op,
how it changes a shape, how it changes an array, and which op undoes it. The same
table serves convert (forward) and export (inverse).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

#: OpenCV (``cv2``), imported on the first transpose (0.27 s: not for commands that make
#: none); None where it is missing, False before the first look
_cv2: Any = False


def _opencv() -> Any:
    """OpenCV's module, whose transpose is a cache-tiled SIMD kernel (about twice numpy's
    blocks here), or None where it cannot be imported."""
    global _cv2
    if _cv2 is False:
        try:
            import cv2
        except ImportError:  # pragma: no cover - opencv-python-headless is a dependency
            cv2 = None
        _cv2 = cv2
    return _cv2


@dataclass(frozen=True)
class _Op:
    shape: Callable[[tuple[int, ...], Any], tuple[int, ...]]
    array: Callable[[np.ndarray, Any], np.ndarray]
    inverse: Callable[[Any, tuple[int, ...]], tuple[str, Any]]
    check: Callable[[Any], bool]


def _insert(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    if not -len(shape) - 1 <= axis <= len(shape):  # numpy's expand_dims range
        raise ValueError(f"cannot unsqueeze axis {axis} of shape {shape}")
    axis = axis if axis >= 0 else len(shape) + 1 + axis
    return (*shape[:axis], 1, *shape[axis:])


def _remove(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    if not -len(shape) <= axis < len(shape) or shape[axis] != 1:
        raise ValueError(f"cannot squeeze axis {axis} of shape {shape}")
    axis = axis % len(shape)
    return (*shape[:axis], *shape[axis + 1:])


def _permute(shape: tuple[int, ...], perm: list[int]) -> tuple[int, ...]:
    if sorted(perm) != list(range(len(shape))):
        raise ValueError(f"permutation {perm} does not fit shape {shape}")
    return tuple(shape[p] for p in perm)


def _reshape(shape: tuple[int, ...], dims: list[Any]) -> tuple[int, ...]:
    if not all(_is_int(d) for d in dims):
        raise ValueError(f"reshape {dims} names config values: resolve it against the config "
                         "first")
    total, known = int(np.prod(shape)), int(np.prod([d for d in dims if d != -1]))
    if dims.count(-1) == 1 and known > 0 and total % known == 0:  # numpy's one free axis
        dims = [total // known if d == -1 else d for d in dims]
    if total != int(np.prod(dims)) or any(d < 0 for d in dims):
        raise ValueError(f"cannot reshape {shape} to {tuple(dims)}")
    return tuple(dims)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_int_list(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(x) for x in v)


def _is_dims(v: Any) -> bool:
    """A reshape's dimensions: sizes, one -1, or names of config values (``experts``),
    resolved against the config before use (:meth:`Transform.resolved`)."""
    return (isinstance(v, list) and bool(v)
            and all((_is_int(x) and x >= -1) or (isinstance(x, str) and x) for x in v)
            and sum(x == -1 for x in v) <= 1)


#: elements of a row a blocked transpose moves as one (:func:`_transposed`): 128 bytes of
#: bfloat16, two cache lines
TRANSPOSE_BLOCK = 64


def _transposed(array: np.ndarray, perm: list[int]) -> np.ndarray:
    """``np.transpose(array, perm)`` as a C-contiguous copy, the same bytes, faster.

    numpy copies a transpose that moves the innermost axis element by element, reading
    with a stride; elements of ml_dtypes' types (bfloat16, float8) through their generic
    copy. Here the elements are copied as unsigned integers of their size, axes of one
    element are left out, and a 2-D swap goes in blocks of :data:`TRANSPOSE_BLOCK`
    elements: two passes through ``[rows, cols/B, B]`` that each read whole cache lines
    (rows whose bytes are a multiple of 4 KiB would otherwise fall, column by column, in
    the same cache sets), or, where the columns do not divide, one pass filling a band of
    the output at a time: where OpenCV is missing or the array is not C-contiguous (else
    :func:`_swapped`, which also swaps the last two axes of a stack).
    Qwen3-30B-A3B's bfloat16 experts (numpy 1.26, this machine, ms): ``[1536, 2048]``
    4.8–6.3, not 18–19; ``[2048, 768]`` 1.8–1.9, not 3.2–4.6; ``[768, 2048]`` 2.1–3.2, not
    6.7–7.1."""
    view = np.transpose(array, perm)
    if array.size == 0 or not perm:
        return np.ascontiguousarray(view)
    if 1 in array.shape:  # axes of one element move nothing
        kept = [axis for axis in perm if array.shape[axis] != 1]
        order = sorted(kept)
        inner = array.reshape([n for n in array.shape if n != 1])
        return _transposed(inner, [order.index(axis) for axis in kept]).reshape(view.shape)
    if view.dtype.kind == "V" and view.dtype.itemsize in (1, 2, 4, 8):
        bits = np.dtype(f"u{view.dtype.itemsize}")
        return _transposed(array.view(bits), perm).view(array.dtype)
    if array.flags.c_contiguous and array.dtype.itemsize in _CV_BITS \
            and list(perm) == [*range(array.ndim - 2), array.ndim - 1, array.ndim - 2] \
            and _opencv() is not None:
        return _swapped(array)
    if list(perm) != [1, 0]:
        return np.ascontiguousarray(view)
    rows, cols = array.shape
    block = TRANSPOSE_BLOCK
    if cols % block == 0:
        bands = np.ascontiguousarray(array.reshape(rows, cols // block, block).transpose(1, 0, 2))
        return np.ascontiguousarray(bands.transpose(0, 2, 1)).reshape(cols, rows)
    out = np.empty(view.shape, view.dtype)
    for i in range(0, rows, block):
        out[:, i:i + block] = array[i:i + block].T
    return out


#: the OpenCV element type that carries each element size's bits unchanged (its transpose
#: moves elements by size, never through a float operation: NaN payloads stay)
_CV_BITS = {1: np.uint8, 2: np.uint16, 4: np.int32, 8: np.float64}


def _swapped(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array with its last two axes swapped, each 2-D slice copied by
    ``cv2.transpose`` (which the OpenCV bindings run without the GIL) straight into the
    output. Measured against :func:`_transposed`'s numpy blocks on bfloat16 (this 2-core
    machine, GB/s): ``[2048, 4096]`` 1.29 vs 0.66, ``[2048, 7168]`` 1.33 vs 0.80,
    ``[768, 2048]`` 1.73 vs 1.05, ``[4096, 4096]`` 0.81 vs 0.41."""
    bits = array.view(_CV_BITS[array.dtype.itemsize])
    *lead, rows, cols = array.shape
    out = np.empty((*lead, cols, rows), bits.dtype)
    flat_in, flat_out = bits.reshape(-1, rows, cols), out.reshape(-1, cols, rows)
    for i in range(flat_in.shape[0]):
        dst = flat_out[i]
        if _opencv().transpose(flat_in[i], dst=dst) is not dst:  # pragma: no cover - OpenCV
            raise RuntimeError("cv2.transpose did not write into the output it was given")
    return out.view(array.dtype)


def swap_into(src: np.ndarray, dst: np.ndarray) -> None:
    """``dst[...] = src.T`` for 2-D arrays of one dtype; ``dst`` may be a band of a larger
    array (rows apart, its elements adjacent), which OpenCV's kernel fills in place."""
    bits = _CV_BITS.get(src.dtype.itemsize)
    if bits is not None and dst.dtype == src.dtype and src.strides[1] == src.itemsize \
            and dst.strides[1] == dst.itemsize and _opencv() is not None:
        band = dst.view(bits)
        if _opencv().transpose(src.view(bits), dst=band) is band:
            return
    dst[...] = src.T  # numpy's strided copy: the same bytes, slower


def fast_swap(dtype: np.dtype) -> bool:
    """Whether :func:`swap_into` can copy elements of ``dtype`` with OpenCV's kernel
    (where each row's elements are adjacent on both sides; else numpy's strided copy,
    slower than :func:`_transposed`)."""
    return np.dtype(dtype).itemsize in _CV_BITS and _opencv() is not None


_UNIT_RESHAPES = ("reshape", "squeeze", "unsqueeze")


def swap_of(transforms: tuple[Transform, ...], shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape ``transforms`` give an array of ``shape`` where all they do is swap its
    two axes of more than one element (one transpose, axes of one element added or
    dropped around it: a mixture's expert ``[2F, H]`` made ``[1, H, 2F]``), so that the
    result is the 2-D transpose reshaped; None where they do anything else."""
    def big(s: tuple[int, ...]) -> list[int]:
        return [n for n in s if n != 1]

    if len(big(shape)) != 2:
        return None
    swapped = False
    for t in transforms:
        after = t.shape(shape)
        if t.op == "transpose" and not swapped:
            kept = [axis for axis in t.arg if shape[axis] != 1]
            if kept[0] < kept[1]:
                return None
            swapped = True
        elif t.op not in _UNIT_RESHAPES or big(after) != big(shape):
            return None
        shape = after
    return shape if swapped else None


def _is_block_rows(v: Any) -> bool:
    """``[BLOCK, ROWS]``: sizes, or names of config values resolved before use."""
    return (isinstance(v, list) and len(v) == 2
            and all((_is_int(x) and x > 0) or (isinstance(x, str) and x) for x in v))


def _rows_kept(shape: tuple[int, ...], arg: list[Any]) -> tuple[int, ...]:
    """A shape that the rows' reordering ``arg`` (``[block, rows]``) fits, unchanged."""
    if not all(_is_int(x) for x in arg):
        raise ValueError(f"{arg} names config values: resolve it against the config first")
    block, rows = arg
    if not shape or block % 2 or rows % block or rows > shape[0]:
        raise ValueError(f"cannot reorder the first {rows} rows of {shape} in blocks of "
                         f"{block} (an even block dividing them, at most the rows there are)")
    return shape


def _reordered(array: np.ndarray, arg: list[int], *, to_halves: bool) -> np.ndarray:
    """The first ``rows`` rows of ``array``, block by block of ``block`` rows: ``to_halves``
    takes each block's even rows then its odd ones (rotary pairs ``(0, 1), (2, 3), ...``
    become the halves ``0..b/2-1`` and ``b/2..b-1``: MindFormers' ``rearrange_w``); the
    other way back. Rows after ``rows`` are kept."""
    block, rows = arg
    _rows_kept(array.shape, arg)
    head = array[:rows].reshape(rows // block, *((block // 2, 2) if to_halves else
                                                 (2, block // 2)), *array.shape[1:])
    moved = np.swapaxes(head, 1, 2).reshape(rows, *array.shape[1:])
    return np.concatenate([moved, array[rows:]]) if rows < array.shape[0] else \
        np.ascontiguousarray(moved)


def _roll_kept(shape: tuple[int, ...], arg: list[Any]) -> tuple[int, ...]:
    """A shape that rolling rows in blocks (``arg``: ``[block, shift]``) fits, unchanged."""
    if not all(_is_int(x) for x in arg):
        raise ValueError(f"{arg} names config values: resolve it against the config first")
    block, shift = arg
    if not shape or shape[0] % block or not 0 < shift < block:
        raise ValueError(f"cannot roll the rows of {shape} by {shift} in blocks of {block} "
                         "(blocks dividing the rows, a shift between 0 and the block)")
    return shape


def _rolled(array: np.ndarray, arg: list[int]) -> np.ndarray:
    """Each block of ``block`` rows rolled by ``shift``: row ``r`` of a block moves to
    ``(r + shift) % block`` (``np.roll`` within the block)."""
    block, shift = arg
    _roll_kept(array.shape, arg)
    blocks = array.reshape(array.shape[0] // block, block, *array.shape[1:])
    return np.ascontiguousarray(np.roll(blocks, shift, axis=1)).reshape(array.shape)


OPS: dict[str, _Op] = {
    "unsqueeze": _Op(_insert, lambda a, ax: np.expand_dims(a, ax),
                     lambda ax, _shape: ("squeeze", ax), _is_int),
    "squeeze": _Op(_remove, lambda a, ax: np.squeeze(a, ax),
                   lambda ax, _shape: ("unsqueeze", ax), _is_int),
    "transpose": _Op(_permute, _transposed,
                     lambda p, _shape: ("transpose", [int(i) for i in np.argsort(p)]),
                     _is_int_list),
    "reshape": _Op(_reshape, lambda a, dims: a.reshape(dims),
                   lambda _dims, shape: ("reshape", list(shape)), _is_dims),
    # rotary pairs to halves within each head's rows (MindFormers' use_rearrange_rope):
    # [head_dim, rows] reorders the first rows (a fused qkv's q and k, not its v)
    "rope_halves": _Op(_rows_kept, lambda a, arg: _reordered(a, arg, to_halves=True),
                       lambda arg, _shape: ("rope_pairs", list(arg)), _is_block_rows),
    "rope_pairs": _Op(_rows_kept, lambda a, arg: _reordered(a, arg, to_halves=False),
                      lambda arg, _shape: ("rope_halves", list(arg)), _is_block_rows),
    # rows rolled within each block: [block, shift] (a head's halves swapped: [128, 64])
    "roll": _Op(_roll_kept, _rolled,
                lambda arg, _shape: ("roll", [arg[0], arg[0] - arg[1]]), _is_block_rows),
}


@dataclass(frozen=True)
class Transform:
    """One declared transform, e.g. ``Transform("unsqueeze", 2)``."""

    op: str
    arg: Any

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown transform {self.op!r}; known: {', '.join(OPS)}")
        if not OPS[self.op].check(self.arg):
            raise ValueError(f"bad argument {self.arg!r} for transform {self.op!r}")

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return OPS[self.op].shape(shape, self.arg)

    def apply(self, array: np.ndarray) -> np.ndarray:
        return OPS[self.op].array(array, self.arg)

    def inverse(self, input_shape: tuple[int, ...]) -> Transform:
        """The transform that undoes this one, given the shape this one was applied to."""
        return Transform(*OPS[self.op].inverse(self.arg, input_shape))

    @property
    def names(self) -> tuple[str, ...]:
        """The config values its argument names (a reshape's ``[experts, -1, hidden]``)."""
        return tuple(x for x in self.arg if isinstance(x, str)) if isinstance(self.arg, list) \
            else ()

    def resolved(self, evaluate: Callable[[str], int]) -> Transform:
        """This transform with every named value computed (``evaluate(expression)``)."""
        if not self.names:
            return self
        return Transform(self.op, [evaluate(x) if isinstance(x, str) else x for x in self.arg])

    def to_data(self) -> dict[str, Any]:
        # a copy: one argument shared by many entries would be dumped as a YAML alias,
        # which the loader refuses
        return {self.op: list(self.arg) if isinstance(self.arg, list) else self.arg}

    def __str__(self) -> str:
        return f"{self.op}({self.arg})"

    @classmethod
    def from_data(cls, data: Any) -> Transform:
        """Parse ``{"unsqueeze": 2}``; raises ValueError with what is wrong."""
        if not isinstance(data, dict) or len(data) != 1:
            raise ValueError(f"a transform is one {{op: argument}} pair, got {data!r}")
        ((op, arg),) = data.items()
        return cls(op, arg)


def apply_all(transforms: tuple[Transform, ...], array: np.ndarray) -> np.ndarray:
    for t in transforms:
        array = t.apply(array)
    return array


def shape_after(transforms: tuple[Transform, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    for t in transforms:
        shape = t.shape(shape)
    return shape


def invert(transforms: tuple[Transform, ...], shape: tuple[int, ...]) -> tuple[Transform, ...]:
    """The chain that undoes ``transforms`` applied to an array of ``shape``."""
    shapes = [shape]
    for t in transforms:
        shapes.append(t.shape(shapes[-1]))
    return tuple(t.inverse(s) for t, s in zip(reversed(transforms), reversed(shapes[:-1])))

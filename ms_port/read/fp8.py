"""Block-scaled float8 weights (DeepSeek-V3's and V4's Hub checkpoints) and MXFP4 weights
(DeepSeek-V4's routed experts) read as bfloat16.

DeepSeek-V3 stores most Linear weights as ``float8_e4m3fn`` with a float32
``<name>_scale_inv`` beside each: one scale per block of ``weight_block_size`` rows ×
columns (``config.json``: ``quantization_config.weight_block_size``, ``[128, 128]`` on the
Hub), the last blocks of a row or column partial when the block does not divide the
weight. Its reference (``inference/fp8_cast_bf16.py`` with ``kernel.py``'s
``weight_dequant``) computes each weight as ``weight.float() * scale`` of its block in
float32, then rounds to bfloat16 (to nearest, ties to even).

:func:`dequantized_view` presents such a source as that bfloat16: each float8 weight
becomes a :class:`Dequantized` entry whose loader computes it from the file when asked
(one weight at a time, nothing written to disk), and the scales it consumed leave the
listing, reported once in ``Source.skipped``. What cannot be dequantized is refused
before anything is read: a float8 weight without its scales, scales whose shape is not
the weight's block grid, a block size that is not two positive integers. Scale values
are read with their weight: a negative or non-finite one is refused then.

DeepSeek-V4 names a weight's scales ``<stem>.scale`` (``<stem>.weight`` the weight) and
stores them as ``float8_e8m0fnu`` (a power of two, ``2^(b - 127)``; 255 is NaN, refused).
Its routed experts are MXFP4: ``int8`` ``[rows, cols / 2]``, two e2m1 values a byte (the
low nibble first), one e8m0 scale per 32 values of a row (``[rows, cols / 32]``), found
by those dtypes and shapes (``config.json``'s ``expert_dtype`` is not always there).
Each value is ``e2m1(nibble) * scale`` (transformers' ``Fp8Dequantize``, MindFormers'
``safetensors_utils``), exact in bfloat16, as every e4m3 value times a power of two is.

Example:
    >>> src = read_source("DeepSeek-V3/model.safetensors.index.json")
    >>> w = src["model.layers.3.mlp.experts.0.down_proj.weight"]
    >>> w.dtype, w.stored.dtype, w.block
    ('bfloat16', 'float8_e4m3fn', (128, 128))
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import SourceError, shown
from .tensors import FLOAT8_DTYPES, MAX_DIM, TensorInfo, format_shape, numpy_dtype

if TYPE_CHECKING:
    from .sources import Source

#: the config key a block size is read from
BLOCK_KEY = "quantization_config.weight_block_size"
#: what follows a float8 weight's name to name its block scales (DeepSeek-V3, transformers)
SCALE_SUFFIX = "_scale_inv"
#: DeepSeek-V4's: ``<stem>.weight``'s scales are ``<stem>.scale``
WEIGHT, SCALE = ".weight", ".scale"
#: scale dtypes whose values float32 holds exactly: the product is the reference's
SCALE_DTYPES = ("float32", "bfloat16", "float16", "float8_e8m0fnu")
#: MXFP4: values a scale covers along a row, and e2m1's 16 codes (sign, 2 exponent bits,
#: 1 mantissa bit) as float32
MX_BLOCK = 32
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
#: elements dequantized at a time: a float32 buffer that stays in the cache
_CHUNK = 1 << 18


@dataclass(frozen=True)
class Dequantized(TensorInfo):
    """A float8 weight presented as the bfloat16 its block scales make of it.

    ``dtype`` is ``bfloat16``, and :meth:`load` computes the weight from the file.

    Attributes:
        stored: the weight as the file holds it (float8).
        scale: its block scales as the file holds them.
        block: the rows × columns each scale covers.
    """

    stored: TensorInfo | None = field(default=None, repr=False, compare=False)
    scale: TensorInfo | None = field(default=None, repr=False, compare=False)
    block: tuple[int, int] = (0, 0)
    #: ``float8`` (block scales), or ``mxfp4`` (two e2m1 values a byte, a scale per 32)
    kind: str = "float8"

    def to_dict(self) -> dict:
        data = super().to_dict()
        assert self.stored is not None and self.scale is not None
        data["stored"] = {"dtype": self.stored.dtype, "nbytes": self.stored.nbytes,
                          "scale": self.scale.to_dict(), "block": list(self.block),
                          "format": self.kind}
        return data


def weight_block(config: dict[str, Any], where: str) -> tuple[int, int] | None:
    """The block size of ``config``'s ``quantization_config.weight_block_size``.

    Args:
        config: a model's ``config.json``.
        where: the config's path, for messages.

    Returns:
        ``(rows, cols)``, or None when the config has no such key.

    Raises:
        SourceError: a ``quantization_config`` that is not an object, or a block size that
            is not two positive integers below 2^40.

    Example:
        >>> weight_block({"quantization_config": {"weight_block_size": [128, 128]}}, "c")
        (128, 128)
    """
    quant = config.get("quantization_config")
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise SourceError(f"{where}: quantization_config is a {type(quant).__name__}, not an "
                          "object; fix config.json", path=where)
    if "weight_block_size" not in quant:
        return None
    block = quant["weight_block_size"]
    if not (isinstance(block, list) and len(block) == 2
            and all(type(b) is int and 0 < b < MAX_DIM for b in block)):
        raise SourceError(f"{where}: {BLOCK_KEY} is {shown(block)}; it must be two positive "
                          "integers [rows, cols] (DeepSeek-V3: [128, 128]) — fix config.json",
                          path=where)
    return block[0], block[1]


def dequantized_view(source: Source) -> Source:
    """``source`` with its block-scaled float8 weights read as bfloat16 (see the module).

    A source without float8 weights, whose config has no ``quantization_config``, or
    whose ``quantization_config`` has no block size while no float8 weight has scales
    beside it, is returned as it is (float8 listed as stored).

    Raises:
        SourceError: a float8 weight that cannot be dequantized, naming it (see the
            module); a missing or bad block size where float8 weights have scales.
    """
    from .tensors import Skipped

    float8 = [info for info in source if info.dtype in FLOAT8_DTYPES
              and not _scale_of_another(info.name, source)]  # float8 scales: refused below
    mxfp4 = [info for info in source if _is_mxfp4(info, source)]
    if not (float8 or mxfp4) or source.config is None:
        return source
    where = str(source.config_path)
    block = weight_block(source.config, where)
    if block is None and float8:
        scaled = next((i.name for i in float8 if scale_name(i.name, source) is not None), None)
        if scaled is None or "quantization_config" not in source.config:
            float8 = []  # listed as stored; a conversion refuses float8
        else:
            raise SourceError(f"{where}: no {BLOCK_KEY}, but float8 weight {scaled!r} has "
                              f"block scales beside it; add the block size the checkpoint "
                              "was quantized with (DeepSeek-V3: [128, 128]) to config.json",
                              path=where, tensor=scaled)
    views = {info.name: _view(source, info, block) for info in float8 if block is not None}
    views.update((info.name, _mx_view(source, info)) for info in mxfp4)
    if not views:
        return source
    consumed = {view.scale.name for view in views.values() if view.scale is not None}
    source.tensors = {name: views.get(name, info) for name, info in source.tensors.items()
                      if name not in consumed}
    kinds = sorted({view.scale.dtype for view in views.values() if view.scale is not None})
    suffixes = sorted({SCALE_SUFFIX if n.endswith(SCALE_SUFFIX) else SCALE for n in consumed})
    source.skipped.append(Skipped(f"*{'/'.join(suffixes)} ×{len(consumed)}",
                                  f"block scales ({', '.join(kinds)})",
                                  f"consumed: {describe(views.values())}"))
    return source


def scale_name(name: str, source: Source) -> str | None:
    """The name of ``name``'s scales in ``source`` (``<name>_scale_inv``, or for
    ``<stem>.weight`` DeepSeek-V4's ``<stem>.scale``), or None."""
    found = [name + SCALE_SUFFIX]
    if name.endswith(WEIGHT):
        found.append(name[:-len(WEIGHT)] + SCALE)
    return next((n for n in found if n in source), None)


def _is_mxfp4(info: TensorInfo, source: Source) -> bool:
    """An int8 weight with e8m0 scales beside it, one per 32 of its unpacked values."""
    if info.dtype != "int8" or len(info.shape) != 2 or not info.name.endswith(WEIGHT):
        return False
    scale = source.tensors.get(info.name[:-len(WEIGHT)] + SCALE)
    return (scale is not None and scale.dtype == "float8_e8m0fnu"
            and scale.shape == (info.shape[0], -(-2 * info.shape[1] // MX_BLOCK)))


def describe(tensors: Iterable[TensorInfo]) -> str | None:
    """One line on the dequantized weights among ``tensors``; None when there are none.

    Example:
        >>> describe(read_source("tiny-fp8"))  # one weight, scales of 4×8 blocks
        '1 float8 weight dequantized to bfloat16 with its 4×8 block scales
        (quantization_config.weight_block_size)'
    """
    views = [t for t in tensors if isinstance(t, Dequantized)]
    if not views:
        return None
    lines = []
    for kind, how in (("float8", BLOCK_KEY), ("mxfp4", f"1×{MX_BLOCK}, e2m1 values")):
        these = [v for v in views if v.kind == kind]
        if not these:
            continue
        blocks = " / ".join(sorted({f"{v.block[0]}×{v.block[1]}" for v in these}))
        many = len(these) != 1
        name = "float8" if kind == "float8" else "MXFP4"
        lines.append(f"{len(these):,} {name} weight{'s' * many} dequantized to bfloat16 with "
                     f"{'their' if many else 'its'} {blocks} block scales ({how})")
    return "; ".join(lines)


def _view(source: Source, info: TensorInfo, block: tuple[int, int]) -> Dequantized:
    """The bfloat16 entry of one float8 weight, once its scales' listing fits it."""
    path, name = source.path, info.name
    found = scale_name(name, source)
    scale = source.tensors.get(found) if found is not None else None
    if scale is None:
        raise SourceError(f"{path}: float8 weight {name!r} ({info.dtype} "
                          f"{format_shape(info.shape)}) has no block scales "
                          f"{name + SCALE_SUFFIX!r} beside it; the checkpoint is "
                          "incomplete — re-download it", path=path, tensor=name)
    if len(info.shape) != 2:
        raise SourceError(f"{path}: float8 weight {name!r} has shape "
                          f"{format_shape(info.shape)}; block scales cover 2-D weights only",
                          path=path, tensor=name)
    grid = _grid(info.shape, block)
    if scale.shape != grid or scale.dtype not in SCALE_DTYPES:
        raise SourceError(f"{path}: block scales {scale.name!r} are {scale.dtype} "
                          f"{format_shape(scale.shape)}, but {name!r} "
                          f"({format_shape(info.shape)}) in {block[0]}×{block[1]} blocks "
                          f"({BLOCK_KEY}) needs {format_shape(grid)} of "
                          f"{'/'.join(SCALE_DTYPES)}; the checkpoint does not match its config",
                          path=path, tensor=scale.name)
    return Dequantized(name, info.shape, "bfloat16",
                       lambda: dequantize(info.load(), scale.load(), block, name=scale.name,
                                          path=path),
                       stored=info, scale=scale, block=block)


def _mx_view(source: Source, info: TensorInfo) -> Dequantized:
    """The bfloat16 entry of one MXFP4 weight (:func:`_is_mxfp4` found its scales)."""
    scale = source.tensors[info.name[:-len(WEIGHT)] + SCALE]
    path, rows, cols = source.path, info.shape[0], 2 * info.shape[1]
    return Dequantized(info.name, (rows, cols), "bfloat16",
                       lambda: dequantize_mxfp4(info.load(), scale.load(), name=scale.name,
                                                path=path),
                       stored=info, scale=scale, block=(1, MX_BLOCK), kind="mxfp4")


def _scale_of_another(name: str, source: Source) -> bool:
    if name.endswith(SCALE_SUFFIX) and name[:-len(SCALE_SUFFIX)] in source:
        return True
    return name.endswith(SCALE) and name[:-len(SCALE)] + WEIGHT in source


def _grid(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
    return -(-shape[0] // block[0]), -(-shape[1] // block[1])


_VALUES: dict[str, np.ndarray] = {}


def _values(dtype: str) -> np.ndarray:
    """The float32 value of each of a float8 dtype's 256 codes (exact)."""
    if dtype not in _VALUES:
        codes = np.arange(256, dtype=np.uint8).view(numpy_dtype(dtype))
        _VALUES[dtype] = codes.astype(np.float32)
    return _VALUES[dtype]


def dequantize(weight: np.ndarray, scale: np.ndarray, block: tuple[int, int], *,
               name: str = "scale", path: str | None = None) -> np.ndarray:
    """A block-scaled float8 weight as bfloat16, as DeepSeek-V3's reference computes it.

    Each element is ``float32(weight) * float32(scale of its block)``, rounded once to
    float32 and then to bfloat16 (nearest, ties to even), bit for bit torch's
    ``(w.float() * s_expanded).to(torch.bfloat16)`` (NaN payloads aside).
    Vectorised a chunk of rows at a time: the output and one small buffer are the only
    memory taken.

    Args:
        weight: ``[rows, cols]`` of a float8 dtype (ml_dtypes).
        scale: ``[ceil(rows / block[0]), ceil(cols / block[1])]`` of float32 (or a dtype
            float32 holds exactly).
        block: the rows × columns each scale covers.
        name, path: the scales' name and file, for messages.

    Raises:
        SourceError: a negative or non-finite scale, or shapes that do not fit.

    Example:
        >>> w = np.ones((3, 5), ml_dtypes.float8_e4m3fn)
        >>> dequantize(w, np.array([[2, 4], [8, 16]], np.float32), (2, 4))[2]
        array([8, 8, 8, 8, 16], dtype=bfloat16)
    """
    dtype, where = str(weight.dtype), f"{path}: " if path else ""
    if dtype not in FLOAT8_DTYPES or weight.ndim != 2 or scale.shape != _grid(weight.shape,
                                                                             block):
        raise SourceError(f"{where}cannot dequantize {dtype} {format_shape(weight.shape)} with "
                          f"{name!r} {format_shape(scale.shape)} in "
                          f"{block[0]}×{block[1]} blocks", path=path, tensor=name)
    factors = np.asarray(scale, dtype=np.float32)  # exact for the dtypes allowed
    bad = ~(np.isfinite(factors) & (factors >= 0))
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise SourceError(f"{where}block scales {name!r} hold {factors[at]} at block {at}; "
                          "scales must be finite and non-negative — the checkpoint is "
                          "corrupt, re-download it", path=path, tensor=name)
    rows, cols = weight.shape
    out = np.empty((rows, cols), numpy_dtype("bfloat16"))
    if out.size == 0:
        return out
    values, codes = _values(dtype), weight.view(np.uint8)
    column_block = np.arange(cols) // block[1]
    step = max(1, _CHUNK // cols)
    buffer = np.empty((min(step, block[0], rows), cols), np.float32)
    for i in range(factors.shape[0]):
        row_factors = factors[i, column_block]  # each column's scale in this block row
        top, bottom = i * block[0], min((i + 1) * block[0], rows)
        for start in range(top, bottom, step):
            stop = min(start + step, bottom)
            part = buffer[:stop - start]
            np.take(values, codes[start:stop], out=part)
            np.multiply(part, row_factors, out=part)
            out[start:stop] = part  # ml_dtypes rounds to nearest, ties to even
    return out


def dequantize_mxfp4(packed: np.ndarray, scale: np.ndarray, *, name: str = "scale",
                     path: str | None = None) -> np.ndarray:
    """An MXFP4 weight as bfloat16, as transformers' ``Fp8Dequantize`` computes it: byte
    ``u`` of a row gives values ``2j`` (its low nibble) and ``2j + 1`` (its high one), each
    the e2m1 value of its nibble times the e8m0 scale of its 32 (``2^(b - 127)``), exact
    in bfloat16. A chunk of rows at a time: the output and one small buffer.

    Args:
        packed: ``[rows, cols / 2]`` int8 (or uint8).
        scale: ``[rows, ceil(cols / 32)]`` float8_e8m0fnu.

    Raises:
        SourceError: shapes that do not fit, or a NaN scale (code 255).

    Example:
        >>> p = np.array([[0x21]], np.uint8)            # values 0.5 (low), 1.0 (high)
        >>> s = np.array([[128]], np.uint8).view(ml_dtypes.float8_e8m0fnu)  # 2.0
        >>> dequantize_mxfp4(p, s)
        array([[1, 2]], dtype=bfloat16)
    """
    where = f"{path}: " if path else ""
    rows, half = packed.shape if packed.ndim == 2 else (0, -1)
    if half < 0 or packed.dtype.itemsize != 1 or str(scale.dtype) != "float8_e8m0fnu" \
            or scale.shape != (rows, -(-2 * half // MX_BLOCK)):
        raise SourceError(f"{where}cannot dequantize MXFP4 {packed.dtype} "
                          f"{format_shape(packed.shape)} with {name!r} {scale.dtype} "
                          f"{format_shape(scale.shape)} (one e8m0 scale per {MX_BLOCK} values "
                          "of a row)", path=path, tensor=name)
    factors = np.asarray(scale, dtype=np.float32)  # 2^(b - 127), exact; 255 is NaN
    if not np.isfinite(factors).all():
        at = tuple(int(i) for i in np.argwhere(~np.isfinite(factors))[0])
        raise SourceError(f"{where}block scales {name!r} hold NaN at {at}; the checkpoint "
                          "is corrupt, re-download it", path=path, tensor=name)
    cols = 2 * half
    out = np.empty((rows, cols), numpy_dtype("bfloat16"))
    if out.size == 0:
        return out
    codes = packed.view(np.uint8)
    step = max(1, _CHUNK // cols)
    buffer = np.empty((min(step, rows), cols), np.float32)
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        part, chunk = buffer[:stop - start], codes[start:stop]
        np.take(E2M1, chunk & 0xF, out=part[:, 0::2])
        np.take(E2M1, chunk >> 4, out=part[:, 1::2])
        grid = part.reshape(stop - start, -1, MX_BLOCK) if cols % MX_BLOCK == 0 else None
        if grid is not None:
            np.multiply(grid, factors[start:stop, :, None], out=grid)
        else:
            np.multiply(part, np.repeat(factors[start:stop], MX_BLOCK, 1)[:, :cols],
                        out=part)
        out[start:stop] = part
    return out

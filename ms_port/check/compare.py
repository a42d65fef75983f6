"""Arrays out of both frameworks, and the numbers that compare them.

The error of one tensor against its reference is the relative L2 error::

    error = ||value - reference||_2 / max(||reference||_2, tiny)

computed in float64: one definition for outputs and layers, for the MindSpore-vs-PyTorch
error, the float32 noise (PyTorch float32 vs float64) and the input sensitivity (PyTorch
on one input vs another). NaN/Inf anywhere makes it ``inf``.
"""

from __future__ import annotations

import math
import sys
import warnings
from typing import Any, Callable

import numpy as np

from ..read.tensors import format_shape

TINY = float(np.finfo(np.float64).tiny)
_NATIVE = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def numpy_copy(array: np.ndarray) -> np.ndarray:
    """A copy (hooks see tensors that in-place ops change afterwards); floats keep their
    width, anything else (bfloat16, ints, bools) becomes float64 for the maths."""
    return np.array(array, dtype=array.dtype if array.dtype in _NATIVE else np.float64)


def torch_to_numpy(tensor: Any) -> np.ndarray:
    import torch

    t = tensor.detach()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
        t = t.float()
    return numpy_copy(t.cpu().numpy())


def ms_to_numpy(tensor: Any) -> np.ndarray:
    return numpy_copy(tensor.asnumpy())


def named_leaves(obj: Any, is_tensor: Callable[[Any], bool], prefix: str = "",
                 depth: int = 0) -> list[tuple[str, Any]]:
    """Tensors inside a nested output, with their path: ``0``, ``logits``, ``1.0``.

    Dicts (Hugging Face's ``ModelOutput`` is one) give their keys, tuples and lists their
    positions; ``None`` entries and non-tensors are skipped.
    """
    if is_tensor(obj):
        return [(prefix or "0", obj)]
    if depth > 16:
        return []
    if isinstance(obj, dict):
        items = [(str(k), v) for k, v in obj.items()]
    elif isinstance(obj, (tuple, list)):
        items = [(str(i), v) for i, v in enumerate(obj)]
    else:
        return []
    found = []
    for key, value in items:
        found += named_leaves(value, is_tensor, f"{prefix}.{key}" if prefix else key, depth + 1)
    return found


def torch_outputs(output: Any) -> list[tuple[str, np.ndarray]]:
    import torch

    return [(n, torch_to_numpy(t))
            for n, t in named_leaves(output, lambda o: isinstance(o, torch.Tensor))]


def ms_outputs(output: Any) -> list[tuple[str, np.ndarray]]:
    import mindspore

    return [(n, ms_to_numpy(t))
            for n, t in named_leaves(output, lambda o: isinstance(o, mindspore.Tensor))]


def relative_error(value: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """(relative L2 error, max abs difference); ``inf`` for both if anything is non-finite."""
    if not (np.isfinite(value).all() and np.isfinite(reference).all()):
        return math.inf, math.inf
    value, reference = value.astype(np.float64), reference.astype(np.float64)
    diff = (value - reference).ravel()
    if diff.size == 0:
        return 0.0, 0.0
    norm = float(np.linalg.norm(reference.ravel()))
    return float(np.linalg.norm(diff) / max(norm, TINY)), float(np.max(np.abs(diff)))


def cosine(a: np.ndarray, b: np.ndarray) -> float | None:
    if a.shape != b.shape or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return None
    return float(np.dot(a, b) / (na * nb))


def nonfinite(array: np.ndarray) -> tuple[int, int]:
    """(NaN count, Inf count). One pass without a temporary in the common case: a NaN or
    an Inf makes the sum non-finite; a sum that merely overflows is counted exactly too.
    The sum is PyTorch's where it is imported (two threads: 2.5x numpy's on a 7B layer's
    weights here)."""
    if array.dtype.kind not in "fc":
        return 0, 0
    with np.errstate(over="ignore", invalid="ignore"):
        if math.isfinite(_sum(array)):
            return 0, 0
    return int(np.isnan(array).sum()), int(np.isinf(array).sum())


def _sum(array: np.ndarray) -> float:
    """The sum of a float array's values (its real parts' and imaginary parts' sums added
    for a complex one: non-finite exactly where one of them is)."""
    torch = sys.modules.get("torch")
    if (torch is not None and array.dtype in (np.float32, np.float64)
            and array.flags.c_contiguous):
        with warnings.catch_warnings():  # a file's map is read-only: it is only read here
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            return float(torch.from_numpy(array).sum())
    total = array.sum()
    return float(total.real + total.imag) if array.dtype.kind == "c" else float(total)


def comparable(value: np.ndarray, reference: np.ndarray) -> np.ndarray | str:
    """``value`` shaped like ``reference`` (a size-1 axis more or less is the same data, and
    so are positions in one axis or in several between the batch and the channels), or why
    the two cannot be compared."""
    if value.shape == reference.shape:
        return value
    if tuple(d for d in value.shape if d != 1) == tuple(d for d in reference.shape if d != 1):
        return value.reshape(reference.shape)
    if (value.ndim >= 2 and reference.ndim >= 2 and value.shape[0] == reference.shape[0]
            and value.shape[-1] == reference.shape[-1] and value.size == reference.size
            and min(value.ndim, reference.ndim) >= 3):
        # the same positions laid out in one axis or in several (a Swin's tokens, B×L×C,
        # against B×H×W×C): row-major either way, so the same values in the same order
        return value.reshape(reference.shape)
    if value.ndim == reference.ndim >= 4 and value.shape[0] == reference.shape[0]:
        # a map channels last against channels first (ConvNeXt's blocks on one side, 1x1
        # convolutions on the other): the same values with the channel axis moved. Not
        # for (B, L, C) against (B, C, L): a sequence of one width is no map of another
        last = np.moveaxis(value, -1, 1)
        if last.shape == reference.shape:
            return last
        first = np.moveaxis(value, 1, -1)
        if first.shape == reference.shape:
            return first
    return (f"shapes differ: MindSpore {format_shape(value.shape)} vs PyTorch "
            f"{format_shape(reference.shape)}")


def fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf"
    return f"{value:.1e}"


def json_float(value: float | None) -> float | None:
    # JSON has no NaN/Inf; "not comparable" travels as null (statuses say why).
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def jsonable(obj: Any) -> Any:
    if isinstance(obj, float):
        return json_float(obj)
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return jsonable(obj.item())
    return obj

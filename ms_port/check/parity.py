"""Parity: run both networks on one seeded input and prove that their outputs agree.

:func:`run_parity` feeds the same seeded random input to a PyTorch module and a
MindSpore cell (both in eval mode, weights already loaded), compares every output and
returns a :class:`ParityReport`. It never prints; progress goes to an optional callback.

The error, per output (a network may return one tensor or a tuple/list of them)::

    error = ||ms - torch||_2 / max(||torch||_2, tiny)

the relative L2 error: the size of the difference measured against the size of the
PyTorch output, so one tolerance fits logits and feature maps alike. An output passes
iff ``error <= tol`` *and* neither side holds a NaN or Inf anywhere: a NaN is a
failure, never a pass. The weights of both networks are checked for NaN/Inf too, since a
bad weight need not reach the output (MindSpore's ReLU maps NaN to 0, PyTorch's keeps
it). Shapes that differ fail. The report also gives the largest
absolute difference, the cosine similarity, top-1 agreement for 2-D outputs and the
**noise floor**: the same error between the PyTorch model's own float32 and float64
outputs, i.e. what float32 rounding alone costs, so a user can read an error against it.

When the outputs differ, forward hooks on both sides capture every layer named in the
``correspondence`` (MindSpore cell path ↔ PyTorch module path) for the same input; the
layers are walked in the order in which the PyTorch hooks fired, and the first one whose
output has a relative error above ``tol`` (or a NaN/Inf) is named, with its enclosing
block. Hooks fire when a layer *finishes*, so a layer is checked before the block that
contains it and the finest-grained culprit is found first.

``dtype="float64"`` runs both sides in float64, which MindSpore's CPU kernels allow for
Dense, activations, pooling and LayerNorm but not for Conv2D or BatchNorm: such a network
is refused with a :class:`~ms_port.errors.ParityError` naming the operator and the cell.

torch and mindspore are imported inside functions so that importing this module (and
``ms-port --help``) stays fast.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..display import Renderable
from ..errors import DeviceError, ParityError
from ..read.tensors import format_shape

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

#: One line for ``--help`` and reports: what "error" means.
ERROR_DEFINITION = (
    "error = ||ms - torch||_2 / max(||torch||_2, tiny) per output (relative L2 error: the "
    "difference measured against the output's scale); an output passes iff error <= tol "
    "and neither side holds NaN or Inf"
)

_TINY = float(np.finfo(np.float64).tiny)
#: a passing error this many times the noise floor gets a note: something besides rounding
_FLOOR_FACTOR = 10
_DTYPES = ("float32", "float64")
#: user-facing device name -> torch device type (None: PyTorch cannot run there)
_TORCH_DEVICES: dict[str, str | None] = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda",
                                          "ascend": None}
#: user-facing device name -> MindSpore device target
_MS_DEVICES = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}


def _json_float(value: float | None) -> float | None:
    # JSON has no NaN/Inf; "not comparable" travels as null (nan/inf counts say why).
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float):
        return _json_float(obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    return obj


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf"
    return f"{value:.1e}"


@dataclass(repr=False)
class OutputComparison:
    """One output tensor compared across the two frameworks.

    Attributes:
        index: position of the tensor among the network's outputs (tuples are flattened).
        ms_shape: shape of the MindSpore output.
        torch_shape: shape of the PyTorch output.
        error: relative L2 error ``||ms - torch|| / max(||torch||, tiny)``; ``inf`` when
            not comparable (shapes differ, or NaN/Inf on either side).
        max_abs: largest absolute elementwise difference; ``inf`` when not comparable.
        cosine: cosine similarity of the flattened outputs; ``None`` when undefined.
        top1_agreement: for 2-D outputs, the fraction of batch rows whose argmax agrees;
            ``None`` otherwise.
        ms_nan_count, ms_inf_count: NaN / ±Inf elements in the MindSpore output.
        torch_nan_count, torch_inf_count: the same for the PyTorch output.
        ok: ``error <= tol`` and no NaN/Inf on either side and equal shapes.
        problem: why the output fails, in words; ``None`` when it passes.
    """

    index: int
    ms_shape: tuple[int, ...]
    torch_shape: tuple[int, ...]
    error: float
    max_abs: float
    cosine: float | None
    top1_agreement: float | None
    ms_nan_count: int
    ms_inf_count: int
    torch_nan_count: int
    torch_inf_count: int
    ok: bool
    problem: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; non-finite numbers become ``None``."""
        return _jsonable(asdict(self))

    def __repr__(self) -> str:
        top1 = "" if self.top1_agreement is None else f", top1={self.top1_agreement:.2f}"
        cos = "" if self.cosine is None else f", cosine={self.cosine:.7f}"
        verdict = "ok" if self.ok else f"FAIL: {self.problem}"
        return (f"OutputComparison(#{self.index} {format_shape(self.torch_shape)}: "
                f"error={_fmt(self.error)}, max_abs={_fmt(self.max_abs)}{cos}{top1}, {verdict})")


@dataclass(repr=False)
class Divergence:
    """The first corresponding layer (in execution order) whose outputs differ.

    Attributes:
        ms_name: MindSpore cell path (``layer3.2.bn2``).
        torch_name: PyTorch module path (``layer3.2.bn2``).
        error: relative L2 error of the layer's output (``inf`` when NaN/Inf is present).
        max_abs: largest absolute difference of the layer's output.
        nan: True when either side's output of this layer holds NaN or Inf.
        call: which call of the layer diverged (0 = first; a layer may run several
            times in one forward, like a shared ReLU).
        ms_block: nearest enclosing MindSpore block in the correspondence, if any.
        torch_block: the PyTorch counterpart of ``ms_block``.
        shape: shape of the layer's (PyTorch) output.
    """

    ms_name: str
    torch_name: str
    error: float
    max_abs: float
    nan: bool
    call: int = 0
    ms_block: str | None = None
    torch_block: str | None = None
    shape: tuple[int, ...] = ()

    @property
    def where(self) -> str:
        """``layer3.2.bn2``, or ``end_point (PyTorch: fc)`` when the names differ."""
        return _pair_name(self.ms_name, self.torch_name)

    def describe(self) -> str:
        """``layer3.2.bn2 (error 3.1e-01) in block layer3.2``; ``end_point (PyTorch: fc;
        NaN/Inf)`` when the names differ."""
        what = "NaN/Inf" if self.nan else f"error {_fmt(self.error)}"
        if self.call:
            what += f", call {self.call + 1}"
        if self.torch_name != self.ms_name:
            what = f"PyTorch: {self.torch_name}; {what}"
        text = f"{self.ms_name} ({what})"
        if self.ms_block is not None:
            text += f" in block {_pair_name(self.ms_block, self.torch_block or self.ms_block)}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; non-finite numbers become ``None``."""
        return _jsonable(asdict(self))

    def __repr__(self) -> str:
        return f"Divergence({self.describe()})"


@dataclass(repr=False)
class ParityReport(Renderable):
    """The verdict of :func:`run_parity`.

    ``error`` is the relative L2 error ``||ms - torch||_2 / max(||torch||_2, tiny)``,
    the largest over all outputs; the run passes iff it is ``<= tol`` and no output holds
    NaN/Inf on either side (see :data:`ERROR_DEFINITION`).

    Attributes:
        ok: every output passed.
        tol: the tolerance on ``error``.
        error: the largest relative L2 error over outputs (``inf`` when not comparable).
        max_abs: the largest absolute difference over outputs.
        outputs: one :class:`OutputComparison` per output tensor.
        noise_floor: relative L2 error of the PyTorch model's float32 output against
            its float64 output on the same input (what float32 rounding alone costs);
            ``None`` when not measured.
        first_divergence: the first corresponding layer whose output differs; ``None``
            when the outputs agree or no layer could be named.
        input_shape: one sample's shape (no batch axis).
        batch: the batch size.
        seed: the seed of ``numpy.random.default_rng`` that drew the input.
        dtype: ``"float32"`` or ``"float64"``, the compute dtype of both sides.
        torch_device: the device PyTorch ran on (``cpu``, ``gpu``).
        ms_device: the device MindSpore ran on (``cpu``, ``gpu``, ``ascend``).
        timings: seconds per step (``torch_forward``, ``mindspore_forward``, …).
        message: a one-sentence verdict.
        layers_checked: corresponding layer outputs compared while searching for the
            first divergence (``0`` when no search ran).
        nonfinite_weights: parameters/buffers holding NaN or Inf, per side
            (``"MindSpore layer1.0.conv1.weight: 1 NaN"``); any entry fails the run, even
            when the outputs happen to agree (MindSpore's ReLU maps NaN to 0).
        notes: remarks worth showing (skipped layers, noise floor not measured, …).
    """

    ok: bool
    tol: float
    error: float
    max_abs: float
    outputs: list[OutputComparison]
    noise_floor: float | None
    first_divergence: Divergence | None
    input_shape: tuple[int, ...]
    batch: int
    seed: int
    dtype: str
    torch_device: str
    ms_device: str
    timings: dict[str, float] = field(default_factory=dict)
    message: str = ""
    layers_checked: int = 0
    nonfinite_weights: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (``json.dumps(..., allow_nan=False)`` works).

        Non-finite numbers (an error that could not be computed) become ``None``; the
        per-output NaN/Inf counts and ``message`` say why.
        """
        data = _jsonable(asdict(self))
        data["error_definition"] = ERROR_DEFINITION
        return data

    def __repr__(self) -> str:
        floor = "" if self.noise_floor is None else f", noise_floor={_fmt(self.noise_floor)}"
        div = "" if self.first_divergence is None else (
            f", first_divergence={self.first_divergence.where}")
        return (f"ParityReport(ok={self.ok}, error={_fmt(self.error)}, tol={self.tol:g}, "
                f"max_abs={_fmt(self.max_abs)}{floor}{div}, outputs={len(self.outputs)}, "
                f"dtype={self.dtype})")


def _pair_name(ms_name: str, torch_name: str) -> str:
    return ms_name if ms_name == torch_name else f"{ms_name} (PyTorch: {torch_name})"


# ---------------------------------------------------------------------------------------
# correspondence


def correspondence_from_pairs(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Turn parameter-name pairs into the layer correspondence :func:`run_parity` walks.

    Each pair's parent paths become a layer pair (``layer3.2.bn2.gamma`` ↔
    ``layer3.2.bn2.weight`` gives ``("layer3.2.bn2", "layer3.2.bn2")``). Where both parent
    paths have the same number of segments, their common-depth prefixes are paired too,
    so a divergence can be named at block level (``("layer3.2", "layer3.2")``,
    ``("layer3", "layer3")``, ``("layer1.0.down_sample_layer", "layer1.0.downsample")``).
    A block that would pair with two different counterparts is dropped. Root-level
    parameters (no parent) give no pair. Layers come in parameter order; each block
    follows the last layer inside it, which is the order in which forward hooks fire.

    Args:
        pairs: ``(mindspore_param_name, torch_param_name)`` pairs, as in a conversion Plan.

    Returns:
        ``(mindspore_path, torch_path)`` pairs, deduplicated.

    Example:
        >>> correspondence_from_pairs([("layer1.0.bn1.gamma", "layer1.0.bn1.weight"),
        ...                            ("end_point.weight", "fc.weight")])
        [('layer1.0.bn1', 'layer1.0.bn1'), ('layer1.0', 'layer1.0'), ('layer1', 'layer1'), \
('end_point', 'fc')]
    """
    layers: list[tuple[str, str]] = []
    for ms_name, torch_name in pairs:
        layer = (ms_name.rpartition(".")[0], torch_name.rpartition(".")[0])
        if layer[0] and layer[1] and layer not in layers:
            layers.append(layer)

    def blocks_of(layer: tuple[str, str]) -> list[tuple[str, str]]:
        ms_parts, torch_parts = layer[0].split("."), layer[1].split(".")
        if len(ms_parts) != len(torch_parts):
            return []
        # outermost first, so a stack of open blocks can be kept below
        return [(".".join(ms_parts[:k]), ".".join(torch_parts[:k]))
                for k in range(1, len(ms_parts))]

    # A block that two layers would pair differently is ambiguous: keep neither.
    ms_to_torch: dict[str, set[str]] = {}
    torch_to_ms: dict[str, set[str]] = {}
    for layer in layers:
        for ms_block, torch_block in blocks_of(layer):
            ms_to_torch.setdefault(ms_block, set()).add(torch_block)
            torch_to_ms.setdefault(torch_block, set()).add(ms_block)

    def unambiguous(block: tuple[str, str]) -> bool:
        return len(ms_to_torch[block[0]]) == 1 and len(torch_to_ms[block[1]]) == 1

    result: list[tuple[str, str]] = []
    open_blocks: list[tuple[str, str]] = []

    def emit(pair: tuple[str, str]) -> None:
        if pair not in result:
            result.append(pair)

    for layer in layers:
        blocks = [b for b in blocks_of(layer) if unambiguous(b)]
        # close the blocks this layer is not inside (innermost first)
        while open_blocks and open_blocks[-1] not in blocks:
            emit(open_blocks.pop())
        for block in blocks:
            if block not in open_blocks:
                open_blocks.append(block)
        emit(layer)
    while open_blocks:
        emit(open_blocks.pop())
    return result


def _default_correspondence(torch_model: Any, ms_model: Any) -> list[tuple[str, str]]:
    """Layers that carry the same path on both sides, in PyTorch definition order."""
    ms_paths = {name for name, _ in ms_model.cells_and_names() if name}
    return [(name, name) for name, _ in torch_model.named_modules() if name in ms_paths]


# ---------------------------------------------------------------------------------------
# comparing arrays


_NATIVE = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _numpy_copy(array: np.ndarray) -> np.ndarray:
    # A copy: hooks see tensors that in-place ops (ReLU(inplace=True), `out += identity`)
    # change afterwards. Floats keep their width (float64 only when compared); anything
    # else (bfloat16 from ml_dtypes, ints, bools) becomes float64 so numpy can do the maths.
    return np.array(array, dtype=array.dtype if array.dtype in _NATIVE else np.float64)


def _torch_to_numpy(tensor: Any) -> np.ndarray:
    import torch

    t = tensor.detach()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
        t = t.float()
    return _numpy_copy(t.cpu().numpy())


def _ms_to_numpy(tensor: Any) -> np.ndarray:
    return _numpy_copy(tensor.asnumpy())


def _leaves(obj: Any, is_tensor: Callable[[Any], bool]) -> list[Any]:
    """Tensors inside a (nested) tuple/list/dict output, in order."""
    if is_tensor(obj):
        return [obj]
    if isinstance(obj, dict):
        return [leaf for value in obj.values() for leaf in _leaves(value, is_tensor)]
    if isinstance(obj, (tuple, list)):
        return [leaf for value in obj for leaf in _leaves(value, is_tensor)]
    return []


def _torch_arrays(output: Any) -> list[np.ndarray]:
    import torch

    return [_torch_to_numpy(t) for t in _leaves(output, lambda o: isinstance(o, torch.Tensor))]


def _ms_arrays(output: Any) -> list[np.ndarray]:
    import mindspore

    return [_ms_to_numpy(t) for t in _leaves(output, lambda o: isinstance(o, mindspore.Tensor))]


def _relative_error(value: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """(relative L2 error, max abs difference); ``inf`` for both if anything is non-finite."""
    if not (np.isfinite(value).all() and np.isfinite(reference).all()):
        return math.inf, math.inf
    value, reference = value.astype(np.float64), reference.astype(np.float64)
    diff = (value - reference).ravel()
    if diff.size == 0:
        return 0.0, 0.0
    error = float(np.linalg.norm(diff) / max(float(np.linalg.norm(reference.ravel())), _TINY))
    return error, float(np.max(np.abs(diff)))


def _cosine(a: np.ndarray, b: np.ndarray) -> float | None:
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    a, b = a.astype(np.float64), b.astype(np.float64)
    na, nb = float(np.linalg.norm(a.ravel())), float(np.linalg.norm(b.ravel()))
    if na == 0.0 or nb == 0.0:
        return None
    return float(np.dot(a.ravel(), b.ravel()) / (na * nb))


def _compare_output(index: int, ms_arr: np.ndarray, torch_arr: np.ndarray,
                    tol: float) -> OutputComparison:
    counts = {
        "ms_nan_count": int(np.isnan(ms_arr).sum()), "ms_inf_count": int(np.isinf(ms_arr).sum()),
        "torch_nan_count": int(np.isnan(torch_arr).sum()),
        "torch_inf_count": int(np.isinf(torch_arr).sum()),
    }
    if ms_arr.shape != torch_arr.shape:
        return OutputComparison(
            index=index, ms_shape=ms_arr.shape, torch_shape=torch_arr.shape, error=math.inf,
            max_abs=math.inf, cosine=None, top1_agreement=None, ok=False,
            problem=(f"output {index} shapes differ: MindSpore {format_shape(ms_arr.shape)} "
                     f"vs PyTorch {format_shape(torch_arr.shape)}"),
            **counts)
    error, max_abs = _relative_error(ms_arr, torch_arr)
    top1 = None
    if ms_arr.ndim == 2 and ms_arr.shape[1] > 0 and math.isfinite(error):
        top1 = float(np.mean(ms_arr.argmax(axis=1) == torch_arr.argmax(axis=1)))
    problem = None
    bad = [f"{side} output {index} holds {counts[key]} {kind}" for side, kind, key in (
        ("MindSpore", "NaN", "ms_nan_count"), ("MindSpore", "Inf", "ms_inf_count"),
        ("PyTorch", "NaN", "torch_nan_count"), ("PyTorch", "Inf", "torch_inf_count"),
    ) if counts[key]]
    if bad:
        problem = ", ".join(bad)
    elif not error <= tol:
        problem = f"output {index}: error {_fmt(error)} > tol {tol:g}"
    return OutputComparison(
        index=index, ms_shape=ms_arr.shape, torch_shape=torch_arr.shape, error=error,
        max_abs=max_abs, cosine=_cosine(ms_arr, torch_arr), top1_agreement=top1,
        ok=problem is None, problem=problem, **counts)


def _count_nonfinite(side: str, name: str, array: np.ndarray) -> str | None:
    nan, inf = int(np.isnan(array).sum()), int(np.isinf(array).sum())
    if not (nan or inf):
        return None
    counts = [f"{n} {kind}" for n, kind in ((nan, "NaN"), (inf, "Inf")) if n]
    return f"{side} {name}: {', '.join(counts)}"


def _nonfinite_weights(torch_model: Any, ms_model: Any) -> list[str]:
    """Parameters and buffers holding NaN/Inf on either side.

    Checked directly because a NaN weight need not reach the output: MindSpore's ReLU
    maps NaN to 0 where PyTorch's keeps it, so the outputs can agree around a bad weight.
    """
    import mindspore
    import torch

    found = []
    for name, tensor in [*torch_model.named_parameters(), *torch_model.named_buffers()]:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            found.append(_count_nonfinite("PyTorch", name, _torch_to_numpy(tensor)))
    floats = set(mindspore.common.dtype.float_type)
    for name, param in ms_model.parameters_and_names():
        if param.dtype in floats:
            found.append(_count_nonfinite("MindSpore", name, _ms_to_numpy(param)))
    return [entry for entry in found if entry]


# ---------------------------------------------------------------------------------------
# devices and dtypes


def _torch_device(device: str) -> Any:
    import torch

    key = device.lower()
    if key not in _TORCH_DEVICES:
        raise DeviceError(
            f"PyTorch side: unknown device {device!r}; choose one of: cpu, gpu",
            side="torch", device=device)
    kind = _TORCH_DEVICES[key]
    if kind is None:
        raise DeviceError(
            f"PyTorch side: device {device!r} is not supported for the PyTorch reference "
            "(PyTorch runs on cpu or a CUDA gpu here); pass torch_device='cpu' or 'gpu' and "
            "keep ms_device='ascend' for the MindSpore side",
            side="torch", device=device)
    if kind == "cuda" and not torch.cuda.is_available():
        raise DeviceError(
            "PyTorch side: no CUDA device available (torch.cuda.is_available() is False; "
            f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}); "
            "pass torch_device='cpu'",
            side="torch", device=device)
    return torch.device(kind)


def _set_ms_device(device: str) -> None:
    import mindspore

    key = device.lower()
    if key not in _MS_DEVICES:
        raise DeviceError(
            f"MindSpore side: unknown device {device!r}; choose one of: "
            f"{', '.join(_MS_DEVICES)}", side="mindspore", device=device)
    target = _MS_DEVICES[key]
    if mindspore.get_context("device_target") == target:
        return
    set_device = getattr(mindspore, "set_device", None)
    try:
        if set_device is not None:
            set_device(target)
        else:  # MindSpore < 2.5
            mindspore.set_context(device_target=target)
    except (RuntimeError, ValueError) as exc:
        found = re.search(r"supports one of the \[([^\]]*)\]", str(exc))
        supported = found.group(1).replace("'", "") if found else "see the MindSpore error"
        raise DeviceError(
            f"MindSpore side: device {target} not supported by this MindSpore build (it "
            f"supports {supported}); install a MindSpore build for {target} "
            f"(https://www.mindspore.cn/install) or pass ms_device='cpu'",
            side="mindspore", device=device) from exc


def _torch_variant(model: Any, dtype: Any, device: Any) -> Any:
    """``model`` itself if already in ``dtype`` on ``device``, else a converted copy.

    A copy, so the caller's model is never cast or moved behind their back.
    """
    floats = [t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()]
    if all(t.dtype == dtype and t.device.type == device.type for t in floats):
        return model
    return copy.deepcopy(model).to(device=device, dtype=dtype)


@contextlib.contextmanager
def _strict_fp32(device: Any) -> Iterator[None]:
    """Turn off TF32 on CUDA while comparing: cuDNN convolutions use it by default,
    which alone costs ~1e-3 relative error."""
    import torch

    if device.type != "cuda":
        yield
        return
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@contextlib.contextmanager
def _ms_params_as(ms_model: Any, dtype: Any) -> Iterator[None]:
    """Cast the cell's floating-point parameters to ``dtype``; restore them afterwards.

    ``Cell.to_float`` only inserts casts and accepts float16/32/bfloat16 only, so float64
    needs the parameters themselves recast (``Parameter.set_dtype`` converts the data;
    float32 -> float64 -> float32 is exact, so restoring loses nothing).
    """
    import mindspore

    floats = set(mindspore.common.dtype.float_type)
    changed = []
    try:
        for _, param in ms_model.parameters_and_names():
            if param.dtype in floats and param.dtype != dtype:
                changed.append((param, param.dtype))
                param.set_dtype(dtype)
        yield
    finally:
        for param, original in changed:
            param.set_dtype(original)


@contextlib.contextmanager
def _ms_pynative() -> Iterator[None]:
    """Cell hooks run only in PyNative mode; switch there for the duration."""
    import mindspore

    mode = mindspore.get_context("mode")
    if mode == mindspore.PYNATIVE_MODE:
        yield
        return
    mindspore.set_context(mode=mindspore.PYNATIVE_MODE)
    try:
        yield
    finally:
        mindspore.set_context(mode=mode)


# ---------------------------------------------------------------------------------------
# forward passes


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0].rstrip('.') if text else ''}".rstrip(": ")


def _torch_forward(model: Any, x: np.ndarray, device: Any) -> Any:
    import torch

    with torch.no_grad():
        # a fresh tensor per run: a model may modify its input in place
        return model(torch.tensor(x, device=device))


def _ms_forward(model: Any, x: np.ndarray) -> Any:
    import mindspore

    return model(mindspore.Tensor(x))


def _failing_torch_module(model: Any, x: np.ndarray, device: Any) -> str | None:
    """Re-run a failing forward with hooks to find the innermost module that raised."""
    names = {id(m): n for n, m in model.named_modules()}
    stack: list[str] = []
    handles = []

    def pop(_layer: Any, _args: Any, _output: Any) -> None:  # None keeps the output as is
        stack.pop()

    for module in model.modules():
        handles.append(module.register_forward_pre_hook(
            lambda m, args: stack.append(names.get(id(m), "?"))))
        handles.append(module.register_forward_hook(pop))
    try:
        _torch_forward(model, x, device)
    except Exception:  # the failure being located; its message is reported by the caller
        return stack[-1] if stack else None
    finally:
        for handle in handles:
            handle.remove()
    return None


def _failing_ms_cell(model: Any, x: np.ndarray) -> str | None:
    """Re-run a failing forward with hooks to find the innermost cell that raised."""
    names = {id(c): n for n, c in model.cells_and_names()}
    stack: list[str] = []
    handles = []

    def pop(_layer: Any, _args: Any, _output: Any) -> None:  # None keeps the output as is
        stack.pop()

    with _ms_pynative():
        for _, cell in model.cells_and_names():
            handles.append(cell.register_forward_pre_hook(
                lambda c, args: stack.append(names.get(id(c), "?"))))
            handles.append(cell.register_forward_hook(pop))
        try:
            _ms_forward(model, x)
        except Exception:  # the failure being located; its message is reported by the caller
            return stack[-1] if stack else None
        finally:
            for handle in handles:
                handle.remove()
    return None


def _describe_place(side: str, name: str | None) -> str:
    if name is None:
        return ""
    return f" in {side} {'the top-level network' if name == '' else repr(name)}"


def _run_torch(model: Any, x: np.ndarray, device: Any, what: str) -> Any:
    try:
        return _torch_forward(model, x, device)
    except Exception as exc:
        where = _describe_place("module", _failing_torch_module(model, x, device))
        raise ParityError(
            f"PyTorch {what} failed{where}: {_first_line(exc)}; check that the model "
            "matches the input shape and the checkpoint", side="torch") from exc


def _run_ms(model: Any, x: np.ndarray, dtype: str) -> Any:
    try:
        return _ms_forward(model, x)
    except Exception as exc:
        text = str(exc)
        place = _failing_ms_cell(model, x)
        where = _describe_place("cell", place)
        if dtype == "float64" and "Float64" in text:
            found = re.search(r"primitive\[(\w+)\]", text)
            op = found.group(1) if found else "an operator"
            raise ParityError(
                f"dtype float64: MindSpore's {_current_device_name()} kernel for {op} has no "
                f"float64 implementation{where}; run the comparison with dtype='float32'",
                side="mindspore", op=op, cell=place) from exc
        raise ParityError(
            f"MindSpore forward failed{where}: {_first_line(exc)}; check that the network "
            "matches the input shape and the checkpoint", side="mindspore", cell=place) from exc


def _current_device_name() -> str:
    import mindspore

    return str(mindspore.get_context("device_target"))


# ---------------------------------------------------------------------------------------
# first divergence


class _TorchRecorder:
    """Copies of hooked PyTorch layer outputs, per path and call, in firing order."""

    def __init__(self) -> None:
        self.calls: dict[str, list[list[np.ndarray]]] = {}
        self.order: list[tuple[str, int]] = []

    def hook(self, path: str) -> Callable[..., None]:
        def record(_module: Any, _args: Any, output: Any) -> None:
            calls = self.calls.setdefault(path, [])
            self.order.append((path, len(calls)))
            calls.append(_torch_arrays(output))
        return record


@dataclass
class _LayerResult:
    error: float
    max_abs: float
    nan: bool
    shape: tuple[int, ...]


class _MsComparer:
    """Compares each hooked MindSpore cell output with the recorded PyTorch output as it
    fires, so MindSpore activations are never held (ResNet-size nets stay cheap)."""

    def __init__(self, torch_rec: _TorchRecorder, torch_for_ms: dict[str, list[str]]):
        self.torch_rec = torch_rec
        self.torch_for_ms = torch_for_ms
        self.calls: dict[str, int] = {}
        self.results: dict[tuple[str, str, int], _LayerResult | str] = {}

    def hook(self, path: str) -> Callable[..., None]:
        def compare(_cell: Any, _args: Any, output: Any) -> None:
            call = self.calls.get(path, 0)
            self.calls[path] = call + 1
            ms_arrays = None
            for torch_path in self.torch_for_ms[path]:
                torch_calls = self.torch_rec.calls.get(torch_path, [])
                if call < len(torch_calls):
                    if ms_arrays is None:
                        ms_arrays = _ms_arrays(output)
                    self.results[(path, torch_path, call)] = _compare_layer(
                        ms_arrays, torch_calls[call])
        return compare


def _compare_layer(ms_arrays: list[np.ndarray],
                   torch_arrays: list[np.ndarray]) -> _LayerResult | str:
    """Worst error over a layer's output tensors, or why they cannot be compared."""
    result = None
    for ms_arr, torch_arr in zip(ms_arrays, torch_arrays):
        if ms_arr.shape != torch_arr.shape:
            # the same data with a size-1 axis more or less still compares
            if _squeezed(ms_arr.shape) != _squeezed(torch_arr.shape):
                return (f"output shapes MindSpore {format_shape(ms_arr.shape)} vs PyTorch "
                        f"{format_shape(torch_arr.shape)}")
            ms_arr = ms_arr.reshape(torch_arr.shape)
        error, max_abs = _relative_error(ms_arr, torch_arr)
        nan = not math.isfinite(error)
        if result is None:
            result = _LayerResult(error, max_abs, nan, tuple(torch_arr.shape))
        else:
            result.error, result.max_abs = max(result.error, error), max(result.max_abs, max_abs)
            result.nan = result.nan or nan
    return result if result is not None else "no output tensors"


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _enclosing_block(torch_name: str, pairs: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The pair whose PyTorch path most closely encloses ``torch_name``."""
    best = None
    for ms_path, torch_path in pairs:
        if torch_name.startswith(torch_path + ".") and (
                best is None or len(torch_path) > len(best[1])):
            best = (ms_path, torch_path)
    return best


def _find_divergence(
    torch_model: Any, ms_model: Any, x: np.ndarray, device: Any,
    correspondence: list[tuple[str, str]], tol: float, notes: list[str],
) -> tuple[Divergence | None, int, list[str]]:
    """Hook both sides, run them once more, and name the first diverging layer.

    Returns the divergence (or None), the number of layer outputs compared, and the
    layers that could not be compared (with the reason).
    """
    torch_modules = dict(torch_model.named_modules())
    ms_cells = dict(ms_model.cells_and_names())
    pairs = []
    for ms_path, torch_path in correspondence:
        if not ms_path or not torch_path:
            continue  # the whole network: its outputs are already compared
        missing = []
        if ms_path not in ms_cells:
            missing.append(f"MindSpore cell {ms_path!r}")
        if torch_path not in torch_modules:
            missing.append(f"PyTorch module {torch_path!r}")
        if missing:
            notes.append(f"correspondence: skipped {' and '.join(missing)} (no such layer)")
            continue
        if (ms_path, torch_path) not in pairs:
            pairs.append((ms_path, torch_path))
    if not pairs:
        return None, 0, []

    ms_for_torch: dict[str, list[str]] = {}
    torch_for_ms: dict[str, list[str]] = {}
    for ms_path, torch_path in pairs:
        ms_for_torch.setdefault(torch_path, []).append(ms_path)
        torch_for_ms.setdefault(ms_path, []).append(torch_path)
    torch_rec = _TorchRecorder()
    comparer = _MsComparer(torch_rec, torch_for_ms)
    handles = []
    try:
        # PyTorch first: its recorded outputs are what each MindSpore hook compares with.
        for torch_path in ms_for_torch:
            handles.append(torch_modules[torch_path].register_forward_hook(
                torch_rec.hook(torch_path)))
        _torch_forward(torch_model, x, device)
        with _ms_pynative():
            for ms_path in torch_for_ms:
                handles.append(ms_cells[ms_path].register_forward_hook(comparer.hook(ms_path)))
            _ms_forward(ms_model, x)
    finally:
        for handle in handles:
            handle.remove()

    unmatched: set[str] = set()
    checked = 0
    # Walk in the order the PyTorch hooks fired: execution order, a layer before the
    # block that contains it, and each call of a layer that runs several times.
    for torch_path, call in torch_rec.order:
        for ms_path in ms_for_torch[torch_path]:
            name = _pair_name(ms_path, torch_path)
            result = comparer.results.get((ms_path, torch_path, call))
            if result is None:
                ran = comparer.calls.get(ms_path, 0)
                unmatched.add(f"{name}: ran {ran} time(s) in MindSpore, more in PyTorch")
                continue
            if isinstance(result, str):
                unmatched.add(f"{name}: {result}")
                continue
            checked += 1
            if result.nan or result.error > tol:
                block = _enclosing_block(torch_path, pairs)
                divergence = Divergence(
                    ms_name=ms_path, torch_name=torch_path, error=result.error,
                    max_abs=result.max_abs, nan=result.nan, call=call,
                    ms_block=block[0] if block else None,
                    torch_block=block[1] if block else None, shape=result.shape)
                return divergence, checked, sorted(unmatched)
    return None, checked, sorted(unmatched)


# ---------------------------------------------------------------------------------------
# the entry point


def _validate(input_shape: tuple[int, ...], batch: int, tol: float, dtype: str) -> None:
    if dtype not in _DTYPES:
        raise ParityError(f"unknown dtype {dtype!r}; choose one of: {', '.join(_DTYPES)}")
    if batch < 1:
        raise ParityError(f"batch must be at least 1, got {batch}")
    if not all(isinstance(d, (int, np.integer)) and d > 0 for d in input_shape):
        raise ParityError(f"input_shape must be positive integers (one sample, no batch "
                          f"axis), got {input_shape!r}")
    if not (isinstance(tol, (int, float)) and tol >= 0):  # also rejects NaN
        raise ParityError(f"tol must be a number >= 0, got {tol!r}")


def run_parity(
    torch_model: Any,
    ms_model: Any,
    *,
    input_shape: tuple[int, ...],
    batch: int = 1,
    seed: int = 0,
    tol: float = 1e-5,
    dtype: str = "float32",
    torch_device: str = "cpu",
    ms_device: str = "cpu",
    correspondence: list[tuple[str, str]] | None = None,
    noise_floor: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ParityReport:
    """Run both networks on one seeded input and compare their outputs.

    The input is ``numpy.random.default_rng(seed).standard_normal((batch, *input_shape))``
    rounded to float32 (and widened back for ``dtype="float64"``, so both dtypes see the
    same values). Both models are put in eval mode (and stay there); PyTorch runs under
    ``torch.no_grad()`` with TF32 off on CUDA. The caller's models are not cast or moved:
    where a dtype or device change is needed, PyTorch works on a copy and MindSpore's
    parameters are cast for the run and restored.

    Args:
        torch_model: a ``torch.nn.Module`` with its weights loaded.
        ms_model: a ``mindspore.nn.Cell`` with its weights loaded.
        input_shape: one sample's input shape, without the batch axis.
        batch: batch size.
        seed: seed of the input draw.
        tol: tolerance on the relative L2 error (see :data:`ERROR_DEFINITION`).
        dtype: ``"float32"`` or ``"float64"`` (both sides; MindSpore's CPU kernels lack
            float64 for Conv2D and BatchNorm, which raises :class:`ParityError`).
        torch_device: ``"cpu"`` or ``"gpu"`` (CUDA); ``"ascend"`` is refused.
        ms_device: ``"cpu"``, ``"gpu"`` or ``"ascend"``; set with ``mindspore.set_device``
            for the whole process.
        correspondence: ``(mindspore_cell_path, torch_module_path)`` pairs used to name the
            first diverging layer when the outputs differ (see
            :func:`correspondence_from_pairs`); ``None`` pairs the layers whose paths are
            the same on both sides; ``[]`` skips the search.
        noise_floor: also run PyTorch in float64 (and float32) and report float32's
            rounding error on this input.
        progress: called with a short step name before each step; never printed.

    Returns:
        A :class:`ParityReport`; ``report.ok`` is the verdict.

    Raises:
        DeviceError: a requested device is unavailable on one side.
        ParityError: bad arguments, a forward pass failed, or MindSpore has no float64
            kernel for an operator.

    Example:
        >>> report = run_parity(torch_net, ms_net, input_shape=(3, 224, 224), batch=2,
        ...                     correspondence=correspondence_from_pairs(plan_pairs))
        >>> report.message  # doctest: +SKIP
        'outputs agree: error 5.4e-07 <= tol 1e-05 (float32 noise floor 5.5e-07)'
    """
    import mindspore
    import torch

    input_shape = tuple(input_shape)
    _validate(input_shape, batch, tol, dtype)
    device = _torch_device(torch_device)
    _set_ms_device(ms_device)

    def step(name: str) -> None:
        if progress is not None:
            progress(name)

    notes: list[str] = []
    timings: dict[str, float] = {}
    started = time.perf_counter()

    # Draw in float64, round to float32: the same values feed both dtypes, and the
    # float64 noise-floor run measures compute rounding only, not input rounding.
    x32 = np.random.default_rng(seed).standard_normal((batch, *input_shape)).astype(np.float32)
    x = x32 if dtype == "float32" else x32.astype(np.float64)
    torch_dtype = torch.float32 if dtype == "float32" else torch.float64
    ms_dtype = mindspore.float32 if dtype == "float32" else mindspore.float64

    torch_model.eval()
    ms_model.set_train(False)
    torch_main = _torch_variant(torch_model, torch_dtype, device)

    step("checking weights for NaN/Inf")
    t0 = time.perf_counter()
    nonfinite = _nonfinite_weights(torch_model, ms_model)
    timings["weight_check"] = time.perf_counter() - t0

    with _strict_fp32(device), _ms_params_as(ms_model, ms_dtype):
        step("torch forward")
        t0 = time.perf_counter()
        torch_arrays = _torch_arrays(_run_torch(torch_main, x, device, "forward"))
        timings["torch_forward"] = time.perf_counter() - t0

        step("mindspore forward")
        t0 = time.perf_counter()
        ms_arrays = _ms_arrays(_run_ms(ms_model, x, dtype))
        timings["mindspore_forward"] = time.perf_counter() - t0

        floor = None
        if noise_floor:
            other = "float64" if dtype == "float32" else "float32"
            step(f"torch {other} forward (noise floor)")
            t0 = time.perf_counter()
            floor = _noise_floor(torch_model, torch_main, torch_arrays, x32, device, dtype,
                                 notes)
            timings[f"torch_{other}_forward"] = time.perf_counter() - t0

        outputs = [_compare_output(i, m, t, tol)
                   for i, (m, t) in enumerate(zip(ms_arrays, torch_arrays))]
        problems = [o.problem for o in outputs if o.problem]
        if len(ms_arrays) != len(torch_arrays):
            problems.insert(0, f"MindSpore returned {len(ms_arrays)} output tensor(s), "
                               f"PyTorch {len(torch_arrays)}")
        if not outputs:
            problems.insert(0, "no output tensors to compare")
        if nonfinite:
            shown = "; ".join(nonfinite[:3]) + ("; …" if len(nonfinite) > 3 else "")
            problems.append(f"weights hold NaN/Inf: {shown}")
        ok = not problems

        divergence, checked, unmatched = None, 0, []
        if not ok:
            pairs = (_default_correspondence(torch_main, ms_model) if correspondence is None
                     else list(correspondence))
            if correspondence is None and pairs:
                notes.append("no correspondence given: compared layers with the same path "
                             "on both sides")
            if pairs:
                step("searching for the first divergence")
                t0 = time.perf_counter()
                try:
                    divergence, checked, unmatched = _find_divergence(
                        torch_main, ms_model, x, device, pairs, tol, notes)
                    if unmatched:
                        notes.append("not compared: " + "; ".join(unmatched))
                except Exception as exc:  # a diagnostic; the verdict above stands
                    notes.append(f"first-divergence search failed: {_first_line(exc)}")
                timings["divergence_search"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - started

    error = max((o.error for o in outputs), default=math.inf)
    max_abs = max((o.max_abs for o in outputs), default=math.inf)
    if len(ms_arrays) != len(torch_arrays):
        error = max_abs = math.inf
    if ok and floor and error > _FLOOR_FACTOR * floor:
        notes.append(f"error is {error / floor:.0f}× the float32 noise floor: rounding alone "
                     "does not explain it — check layer settings that hold no weights "
                     "(LayerNorm epsilon: MindSpore 1e-7, PyTorch 1e-5; BatchNorm eps; "
                     "padding; approximate GELU)")
    report = ParityReport(
        ok=ok, tol=float(tol), error=error, max_abs=max_abs, outputs=outputs,
        noise_floor=floor, first_divergence=divergence, input_shape=input_shape, batch=batch,
        seed=seed, dtype=dtype, torch_device=torch_device, ms_device=ms_device,
        timings=timings, layers_checked=checked, nonfinite_weights=nonfinite, notes=notes)
    report.message = _verdict(report, problems, correspondence, unmatched)
    return report


def _noise_floor(torch_model: Any, torch_main: Any, main_arrays: list[np.ndarray],
                 x32: np.ndarray, device: Any, dtype: str, notes: list[str]) -> float | None:
    """Relative error of PyTorch's float32 output against its float64 output."""
    import torch

    try:
        if dtype == "float32":
            wide = _torch_variant(torch_main, torch.float64, device)
            ref = _torch_arrays(_torch_forward(wide, x32.astype(np.float64), device))
            low = main_arrays
        else:
            narrow = _torch_variant(torch_model, torch.float32, device)
            low = _torch_arrays(_torch_forward(narrow, x32, device))
            ref = main_arrays
    except Exception as exc:  # optional information; the comparison itself stands
        notes.append(f"noise floor not measured: PyTorch float64 forward failed "
                     f"({_first_line(exc)})")
        return None
    errors = [_relative_error(a, r)[0] for a, r in zip(low, ref) if a.shape == r.shape]
    return max(errors) if errors else None


def _verdict(report: ParityReport, problems: list[str],
             correspondence: list[tuple[str, str]] | None, unmatched: list[str]) -> str:
    floor = ("" if report.noise_floor is None
             else f" (float32 noise floor {_fmt(report.noise_floor)})")
    if report.ok:
        return f"outputs agree: error {_fmt(report.error)} <= tol {report.tol:g}{floor}"
    text = f"outputs differ ({'; '.join(problems)})"
    if report.first_divergence is not None:
        return f"{text}: first divergence at {report.first_divergence.describe()}"
    if correspondence is not None and not correspondence:
        return text
    if unmatched:
        return (f"{text}; the {report.layers_checked} layer outputs compared agree, not "
                f"compared: {'; '.join(unmatched)}")
    if report.layers_checked:
        return (f"{text}; the {report.layers_checked} layer outputs compared agree, so the "
                "difference arises after or outside them")
    return f"{text}; pass correspondence=[(mindspore_path, torch_path), ...] to locate it"

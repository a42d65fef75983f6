"""What verify returns: plain dataclasses, JSON-safe through ``to_dict()``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..display import Renderable
from ..read.tensors import format_shape
from .compare import fmt, jsonable

#: One line for ``--help`` and reports: what "error" means.
ERROR_DEFINITION = (
    "error = ||ms - torch||_2 / max(||torch||_2, tiny) per output and per layer (relative L2 "
    "error); it passes iff error <= max(tol, k × noise × drift), noise being PyTorch "
    "float32 vs float64 on that very tensor and drift (>= 1) how far past it rounding has "
    "compounded gradually in the layers before, and neither side holds NaN or Inf"
)

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
#: CLI exit status per verdict (2 is bad input, as for every command)
EXIT_CODES = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}


def pair_name(ms_name: str, torch_name: str) -> str:
    return ms_name if ms_name == torch_name else f"{ms_name} (PyTorch: {torch_name})"


@dataclass(repr=False)
class OutputComparison:
    """One output tensor compared across the two frameworks.

    Attributes:
        index: position among the compared outputs.
        name: the PyTorch output's path (``0``, ``logits``); ``ms_name`` MindSpore's.
        error / max_abs / cosine: MindSpore vs PyTorch (``inf`` when not comparable).
        noise: PyTorch float32 vs float64 on this output (``None``: not measured).
        bound: ``max(tol, k × noise × drift)``, what ``error`` must not exceed.
        drift: how far past PyTorch's float32 noise rounding had compounded in the layers
            (≥ 1; :mod:`ms_port.check.verdict`).
        sensitivity: PyTorch's output on a second, different input vs this one: how much
            the output depends on the input at all.
        status: ``ok``, ``fail``, ``nonfinite``, ``shape``, ``insensitive`` (agrees,
            but barely depends on the input: proves little), ``amplified`` (above its
            bound only through the layers' values: ``own`` is within it) or ``overflow``
            (NaN/Inf at the same positions on both sides, its finite values within the
            bound: the network's own overflow on this input; ``error`` is the finite
            values').
        own: its error with PyTorch fed MindSpore's layer outputs (:mod:`.replay`; run
            only where something is above its bound), else None.
        layout: how MindSpore's output was laid out to compare it where that differs
            (transposed, per-level maps joined: :mod:`ms_port.check.relayout`), else None.
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
    name: str = "0"
    ms_name: str = "0"
    noise: float | None = None
    bound: float = 0.0
    sensitivity: float | None = None
    status: str = "ok"
    drift: float = 1.0
    layout: str | None = None
    own: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return jsonable(asdict(self))

    def __repr__(self) -> str:
        top1 = "" if self.top1_agreement is None else f", top1={self.top1_agreement:.2f}"
        verdict = "ok" if self.ok else f"FAIL: {self.problem}"
        return (f"OutputComparison({self.name} {format_shape(self.torch_shape)}: "
                f"error={fmt(self.error)}, bound={fmt(self.bound)}{top1}, {verdict})")


@dataclass(repr=False)
class LayerComparison:
    """One call of one paired layer, in PyTorch execution order."""

    index: int
    ms: str
    torch: str
    call: int
    ms_kind: str
    torch_kind: str
    paired_by: str
    shape: tuple[int, ...]
    error: float
    max_abs: float
    noise: float | None
    bound: float
    sensitivity: float | None
    status: str  # ok | fail | nonfinite | insensitive | skipped | boundary | amplified
    note: str | None = None
    leaf: bool = True
    drift: float = 1.0
    #: its error given MindSpore's outputs of the layers before it (:mod:`.replay`; run
    #: only where a layer is above its bound): what the layer itself adds
    own: float | None = None

    @property
    def name(self) -> str:
        return pair_name(self.ms, self.torch)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(asdict(self))

    def __repr__(self) -> str:
        return (f"LayerComparison(#{self.index} {self.name}: error={fmt(self.error)}, "
                f"bound={fmt(self.bound)}, {self.status})")


@dataclass(repr=False)
class Divergence:
    """The first paired layer, in execution order, whose output is above its bound.

    Attributes:
        ms_name / torch_name: the layer's paths; ``call`` which call of it (0 = first).
        error / max_abs / bound: its error and what it had to stay under.
        nan: either side's output of this layer holds NaN or Inf.
        ms_block / torch_block: the nearest enclosing pair of blocks, if any.
        shape: the layer's (PyTorch) output shape.
        tensors: the parameters behind the layer (MindSpore names), and what the tensor
            comparison found in them ("layer3.2.bn2.moving_mean holds …running_var").
        weightless: the layer holds no parameters (a pooling, an activation, …).
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
    bound: float = 0.0
    tensors: list[str] = field(default_factory=list)
    weightless: bool = False

    @property
    def where(self) -> str:
        return pair_name(self.ms_name, self.torch_name)

    def describe(self) -> str:
        """``layer3.2.bn2 (error 3.1e-01 > bound 1.0e-05) in block layer3.2``."""
        what = "NaN/Inf" if self.nan else f"error {fmt(self.error)} > bound {fmt(self.bound)}"
        if self.call:
            what += f", call {self.call + 1}"
        if self.weightless:
            what += ", a layer without weights"
        if self.torch_name != self.ms_name:
            what = f"PyTorch: {self.torch_name}; {what}"
        text = f"{self.ms_name} ({what})"
        if self.ms_block is not None:
            text += f" in block {pair_name(self.ms_block, self.torch_block or self.ms_block)}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return jsonable(asdict(self))

    def __repr__(self) -> str:
        return f"Divergence({self.describe()})"


@dataclass(repr=False)
class ParityReport(Renderable):
    """The verdict of verify: PASS, FAIL or INCONCLUSIVE, and the evidence.

    Attributes:
        verdict: ``PASS`` (every compared output and layer within its bound, outputs
            depend on the input), ``FAIL`` (something above its bound, NaN/Inf, or a
            tensor that differs from its source) or ``INCONCLUSIVE`` (the comparison
            cannot tell right from wrong here; ``reasons`` say why).
        ok: ``verdict == "PASS"``.
        tol / k: the bound is ``max(tol, k × noise × drift)`` per output and layer.
        error / max_abs: the worst over the outputs.
        noise_floor: the outputs' float32 noise (PyTorch float32 vs float64).
        outputs / layers: every comparison, outputs and paired layers in execution order.
        first_divergence: the first failing layer, or ``None``.
        tensors: the tensor-level comparison made before any forward, or ``None``.
        inputs: what was fed (name, dtype, shape, origin).
        reasons: why the verdict is what it is, one line each.
        known_differences: at the first divergence, settings that make the two networks
            compute differently (padding, epsilon, GELU…): a network, not a conversion,
            difference (:mod:`ms_port.check.hints`).
        exit_code: 0 PASS, 1 FAIL, 3 INCONCLUSIVE.
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
    verdict: str = FAIL
    k: float = 0.0
    layers: list[LayerComparison] = field(default_factory=list)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    tensors: Any = None
    #: at the first divergence, settings known to make the networks compute differently
    known_differences: list[str] = field(default_factory=list)
    #: how far past PyTorch's float32 noise rounding compounded through the layers (≥ 1),
    #: and the layer where it reached that (:mod:`ms_port.check.verdict`)
    drift: float = 1.0
    drift_at: str | None = None
    #: how the networks ran: ``whole`` (both at once) or ``layers`` (block by block), and why
    mode: str = "whole"
    mode_reason: str | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (``json.dumps(..., allow_nan=False)`` works)."""
        data = {k: v for k, v in self.__dict__.items() if k != "tensors"}
        data = jsonable({k: (asdict(v) if hasattr(v, "__dataclass_fields__") else v)
                         for k, v in data.items()})
        data["outputs"] = [o.to_dict() for o in self.outputs]
        data["layers"] = [c.to_dict() for c in self.layers]
        data["first_divergence"] = (None if self.first_divergence is None
                                    else self.first_divergence.to_dict())
        data["tensors"] = None if self.tensors is None else self.tensors.to_dict()
        data["error_definition"] = ERROR_DEFINITION
        return data

    def __repr__(self) -> str:
        floor = "" if self.noise_floor is None else f", noise_floor={fmt(self.noise_floor)}"
        div = "" if self.first_divergence is None else (
            f", first_divergence={self.first_divergence.where}")
        return (f"ParityReport({self.verdict}, ok={self.ok}, error={fmt(self.error)}, "
                f"tol={self.tol:g}"
                f"{floor}{div}, outputs={len(self.outputs)}, layers={len(self.layers)}, "
                f"dtype={self.dtype})")

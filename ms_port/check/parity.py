"""verify's engine: run both networks once on the same inputs and judge every layer.

:func:`run_parity` takes a PyTorch module and a MindSpore cell (weights loaded) and:

1. checks both networks' weights for NaN/Inf (a bad weight need not reach the output:
   MindSpore's ReLU maps NaN to 0, PyTorch's keeps it);
2. runs PyTorch in float32 recording every layer's output (:mod:`.layers`), then in
   float64 and on a second, different input, measuring each layer's float32 noise and
   its sensitivity to the input as the hooks fire;
3. runs MindSpore once, recording every cell's output;
4. pairs outputs (by name, then position and shape) and layers (by the plan's names,
   then by order and output shape), compares each against ``max(tol, K × noise)`` and
   decides PASS, FAIL or INCONCLUSIVE (:mod:`.verdict`).

It never prints; progress goes to an optional callback. torch and mindspore are imported
inside functions so that importing this module (and ``ms-port --help``) stays fast.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable

import numpy as np

from ..errors import ParityError
from . import devices
from .compare import (
    comparable,
    cosine,
    fmt,
    ms_outputs,
    ms_to_numpy,
    nonfinite,
    relative_error,
    torch_outputs,
    torch_to_numpy,
)
from .hints import explain
from .layers import (
    Measure,
    Pair,
    distance,
    layer_error,
    pair_events,
    record_ms,
    record_torch,
    unlike_layers,
)
from .pairing import (
    correspondence_from_pairs,
    default_correspondence,
    enclosing_block,
    pair_outputs,
)
from .report import (
    ERROR_DEFINITION,
    FAIL,
    INCONCLUSIVE,
    PASS,
    Divergence,
    LayerComparison,
    OutputComparison,
    ParityReport,
    pair_name,
)
from .verdict import ROUNDING_REACH, Drift, K, bound_for, decide, pass_message, status_of

__all__ = ["ERROR_DEFINITION", "FAIL", "INCONCLUSIVE", "PASS", "Divergence",
           "LayerComparison", "OutputComparison", "ParityOptions", "ParityReport", "check_run",
           "compare_networks", "correspondence_from_pairs", "run_parity"]

_DTYPES = ("float32", "float64")
#: a passing error this many times the noise gets a note: something besides rounding
_FLOOR_FACTOR = 10


def _count_nonfinite(side: str, name: str, array: np.ndarray) -> str | None:
    nan, inf = nonfinite(array)
    if not (nan or inf):
        return None
    counts = [f"{n} {kind}" for n, kind in ((nan, "NaN"), (inf, "Inf")) if n]
    return f"{side} {name}: {', '.join(counts)}"


def _nonfinite_weights(torch_model: Any, ms_model: Any) -> list[str]:
    """Parameters and buffers holding NaN/Inf on either side."""
    import mindspore
    import torch

    found = []
    for name, tensor in [*torch_model.named_parameters(), *torch_model.named_buffers()]:
        # a NaN or Inf makes the sum non-finite (an overflow is then counted exactly)
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor.detach().sum())):
            found.append(_count_nonfinite("PyTorch", name, torch_to_numpy(tensor)))
    floats = set(mindspore.common.dtype.float_type)
    native = {mindspore.float16, mindspore.float32, mindspore.float64}
    for name, param in ms_model.parameters_and_names():
        if param.dtype in floats:  # float32's asnumpy is a view: nothing copied to count
            array = param.asnumpy() if param.dtype in native else ms_to_numpy(param)
            found.append(_count_nonfinite("MindSpore", name, array))
    return [entry for entry in found if entry]


def _as_inputs(inputs: Any, input_shape: tuple[int, ...] | None, batch: int,
               seed: int) -> list[Any]:
    from .inputs import InputArray, generate_inputs

    if inputs is None:
        if input_shape is None:
            raise ParityError("no inputs: pass inputs=[...] or input_shape=(C, H, W)")
        if not all(isinstance(d, (int, np.integer)) and d > 0 for d in input_shape):
            raise ParityError(f"input_shape must be positive integers (one sample, no batch "
                              f"axis), got {tuple(input_shape)!r}")
        return generate_inputs([tuple(input_shape)], batch=batch, seed=seed)
    if isinstance(inputs, np.ndarray):
        inputs = [inputs]
    if not len(inputs):
        raise ParityError("no inputs given: pass at least one array (inputs=[...]), an "
                          "--input file, or --input-shape")
    return [x if isinstance(x, InputArray) else
            InputArray(f"input{i}", np.asarray(x), "given array") for i, x in enumerate(inputs)]


def _as_run_dtype(array: np.ndarray, dtype: Any) -> np.ndarray:
    floating = array.dtype.kind == "f" or array.dtype.name == "bfloat16"
    return array.astype(dtype) if floating and array.dtype != dtype else array


def _validate(tol: float, dtype: str, batch: int) -> None:
    if dtype not in _DTYPES:
        raise ParityError(f"unknown dtype {dtype!r}; choose one of: {', '.join(_DTYPES)}")
    if batch < 1:
        raise ParityError(f"batch must be at least 1, got {batch}")
    if not (isinstance(tol, (int, float)) and tol >= 0):  # also rejects NaN
        raise ParityError(f"tol must be a number >= 0, got {tol!r}")


def check_run(run: Run) -> None:
    """Refuse a run whose dtype or tol cannot be compared with (a ParityError)."""
    _validate(run.tol, run.dtype, 1)


@dataclass(frozen=True)
class OutputPair:
    """A PyTorch output and its MindSpore counterpart (in PyTorch's layout), with PyTorch's
    float32 noise and input sensitivity on it, and how the MindSpore one was laid out where
    that differs (:mod:`ms_port.check.relayout`)."""

    tname: str
    mname: str
    torch: np.ndarray
    ms: np.ndarray
    noise: float | None = None
    sensitivity: float | None = None
    layout: str | None = None
    #: the outputs of each side it stands for (several, where joined), PyTorch's first
    members: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())


@dataclass(frozen=True)
class Bounds:
    """What an output's bound is made of: ``max(tol, k × noise × drift)``."""

    tol: float
    scaled: bool
    drift: float = 1.0


def _compare_output(index: int, pair: OutputPair, bounds: Bounds) -> OutputComparison:
    tname, ms_arr, torch_arr = pair.tname, pair.ms, pair.torch
    (ms_nan, ms_inf), (torch_nan, torch_inf) = nonfinite(ms_arr), nonfinite(torch_arr)
    counts = {"ms_nan_count": ms_nan, "ms_inf_count": ms_inf, "torch_nan_count": torch_nan,
              "torch_inf_count": torch_inf}
    bound = bound_for(bounds.tol, pair.noise, scaled=bounds.scaled, drift=bounds.drift)
    common = {"index": index, "name": tname, "ms_name": pair.mname, "ms_shape": ms_arr.shape,
              "torch_shape": torch_arr.shape, "noise": pair.noise, "bound": bound,
              "drift": bounds.drift, "sensitivity": pair.sensitivity, "layout": pair.layout,
              **counts}
    shaped = comparable(ms_arr, torch_arr)
    if isinstance(shaped, str):
        return OutputComparison(error=math.inf, max_abs=math.inf, cosine=None,
                                top1_agreement=None, ok=False, status="shape",
                                problem=f"output {tname}: {shaped}", **common)
    error, max_abs = relative_error(shaped, torch_arr)
    top1 = None
    if shaped.ndim == 2 and shaped.shape[1] > 0 and math.isfinite(error):
        top1 = float(np.mean(shaped.argmax(axis=1) == torch_arr.argmax(axis=1)))
    bad = [f"{side} output {tname} holds {counts[key]} {kind}" for side, kind, key in (
        ("MindSpore", "NaN", "ms_nan_count"), ("MindSpore", "Inf", "ms_inf_count"),
        ("PyTorch", "NaN", "torch_nan_count"), ("PyTorch", "Inf", "torch_inf_count"),
    ) if counts[key]]
    status = status_of(error, bound, pair.sensitivity)
    problem = ", ".join(bad) if bad else None
    if problem is None and status in ("fail", "nonfinite"):
        problem = f"output {tname}: error {fmt(error)} > bound {fmt(bound)}"
    if bad:
        status = "nonfinite"
        finite = _same_overflow(shaped, torch_arr)
        if finite is not None:  # the network's own overflow, on both sides alike
            error, max_abs = relative_error(shaped[finite], torch_arr[finite]) \
                if finite.any() else (0.0, 0.0)
            status = "overflow" if status_of(error, bound, None) == "ok" else "fail"
            problem = None if status == "overflow" else (
                f"output {tname}: error {fmt(error)} > bound {fmt(bound)} where both sides "
                f"are finite ({', '.join(bad)}, at the same positions)")
    return OutputComparison(error=error, max_abs=max_abs, cosine=cosine(shaped, torch_arr),
                            top1_agreement=top1, ok=problem is None, problem=problem,
                            status=status, **common)


def _same_overflow(ms_arr: np.ndarray, torch_arr: np.ndarray) -> np.ndarray | None:
    """Where both outputs are finite, if their NaN and Inf lie at the same positions with
    the same values (an exponential that overflows on this input, on both sides); else
    ``None``."""
    ms_fin, torch_fin = np.isfinite(ms_arr), np.isfinite(torch_arr)
    if not np.array_equal(ms_fin, torch_fin):
        return None
    if not np.array_equal(ms_arr[~ms_fin], torch_arr[~torch_fin], equal_nan=True):
        return None
    return ms_fin


def _layer_comparisons(pairs: list[Pair], noise: dict[tuple[str, int], float],
                       sens: dict[tuple[str, int], float], *, tol: float,
                       scaled: bool, drift: Drift,
                       own: dict[tuple[str, int], float] | None = None
                       ) -> list[LayerComparison]:
    """Each pair judged in execution order; ``own``: each call's error given MindSpore's
    values before it (:mod:`.replay`), where that pass ran."""
    found = []
    own = own or {}
    for pair in pairs:
        t, m = pair.torch, pair.ms
        error, max_abs, why = layer_error(pair)
        if pair.unlike is not None:
            why = pair.unlike
        key = (t.path, t.call)
        n, s = noise.get(key), sens.get(key)
        # shapes that cannot be compared are named, never a verdict of their own
        bound, status, applied = (
            (bound_for(tol, n, scaled=scaled, drift=drift.ratio), "skipped", drift.ratio)
            if why is not None else drift.judge(pair_name(m.path, t.path), error, n, s,
                                                tol=tol, scaled=scaled, own=own.get(key)))
        found.append(LayerComparison(
            index=len(found), ms=m.path, torch=t.path, call=t.call, ms_kind=m.kind,
            torch_kind=t.kind, paired_by=pair.how, shape=t.arrays[0].shape, error=error,
            max_abs=max_abs, noise=n, bound=bound, sensitivity=s, status=status, note=why,
            leaf=t.leaf and m.leaf, drift=applied, own=own.get(key)))
    return found


def _blocks_with_other_bounds(compared: list[LayerComparison],
                              outputs: list[OutputComparison], notes: list[str]) -> None:
    """A block (a layer with layers inside) that differs while every layer inside it and
    every output agree holds different parts of the network on the two sides (torchvision's
    DenseNet applies its last ReLU after ``features``, MindCV's inside): not a verdict."""
    if not outputs or not all(o.ok for o in outputs):
        return
    leaves = [c for c in compared if c.leaf]
    for c in compared:
        if c.leaf or c.status != "fail":
            continue
        inside = [x for x in leaves if x.torch.startswith(c.torch + ".")]
        if inside and all(x.status not in ("fail", "nonfinite") for x in inside):
            c.status = "boundary"
            c.note = "differs while everything inside it and the outputs agree"
            notes.append(f"block {c.name} differs ({fmt(c.error)}) while every layer inside "
                         "it and the outputs agree: the two networks draw this block's "
                         "boundary differently (an activation inside on one side, after it "
                         "on the other); not counted")


#: how many comparisons before the first divergence a known difference is looked for in
LOOK_BACK = 3


def _known_before(first: LayerComparison, everything: list[LayerComparison],
                  networks: Networks) -> list[str]:
    """The known differences of the layers just before the first divergence, or around it,
    where it has none itself: timm's BatchNormAct2d with another epsilon is not compared
    (it runs its activation inside it), and its activation is where the difference shows."""
    at = next((k for k, c in enumerate(everything) if c is first), None)
    if at is None:
        return []
    around = [c for c in everything if first.torch.startswith(c.torch + ".")]
    for c in [*reversed(everything[max(0, at - LOOK_BACK):at]), *around]:
        found = networks.known(c)
        if found:
            where = "around it" if c in around else "just before it"
            return [f"{found[0]} (at {c.name}, {where})"]
    return []


def _between_layers(first: LayerComparison, compared: list[LayerComparison],
                    divergence: Divergence, tensor_diff: Any) -> str | None:
    """Where every layer compared before the first divergence agrees and its weights are
    identical to their source, what differs runs between layers: said, as a fact, with
    the one other cause it leaves open."""
    before = [c for c in compared if c.index < first.index and c.leaf]
    if not before or any(c.status in ("fail", "nonfinite") for c in before):
        return None
    held = {d.target: d for d in (tensor_diff.deltas if tensor_diff is not None else [])}
    mine = [t for t in divergence.tensors if t in held]
    if not mine or any(held[t].status != "identical" for t in mine):
        return None
    return (f"every layer before {first.name} agrees and its weights are identical to their "
            "source: what differs runs between the layers (an addition, a residual "
            "connection, an operation no layer holds, such as a functional pooling), or the "
            "plan paired its weights with another layer's")


def _blocks_not_carried(compared: list[LayerComparison], notes: list[str]) -> None:
    """A block that differs while every layer inside it agrees, and so does the next layer
    after it (fed what the block gave it, on each side): what differs is where each side
    draws the block's end (timm's MixNet blocks hold their last activation, MindCV's
    leave it after), not what the network computes — a real difference would reach the
    next layer. Not a verdict: the first divergence is where a layer itself differs."""
    leaves = [c for c in compared if c.leaf]
    drawn = []
    for k, c in enumerate(compared):
        if c.leaf or c.status != "fail":
            continue
        inside = [x for x in leaves if x.torch.startswith(c.torch + ".")]
        after = next((x for x in compared[k + 1:] if x.leaf
                      and not x.torch.startswith(c.torch + ".")), None)
        if (inside and after is not None and after.status == "ok"
                and all(x.status not in ("fail", "nonfinite") for x in inside)):
            c.status = "boundary"
            c.note = "differs while everything inside it and the next layer after it agree"
            drawn.append(c)
    if drawn:
        more = f" (and {len(drawn) - 1} more like it)" if len(drawn) > 1 else ""
        notes.append(f"block {drawn[0].name} differs ({fmt(drawn[0].error)}) while every layer "
                     f"inside it and the next layer after it agree{more}: the two networks "
                     "end this block at another point; not counted")


def _leaves_drawn_differently(compared: list[LayerComparison], notes: list[str]) -> None:
    """A layer that differs while the block around it, and every output, agree computes a
    different share of that block on each side (MindFormers' ``w1`` applies SiLU inside
    the Linear; transformers' ``gate_proj`` leaves it to the MLP). A wrong weight or
    layout would carry into the block's output, so this is not a verdict either, whatever
    the outputs say: else a wrong layer later in the network would be blamed on the first
    such layer (a k/v swap in layer 1 named as layer 0's ``w1``)."""
    drawn = []
    for c in compared:
        # innermost on the PyTorch side (MindFormers' Linear holds its activation cell)
        if c.status != "fail" or any(x.torch.startswith(c.torch + ".") for x in compared):
            continue
        around = [b for b in compared if c.torch.startswith(b.torch + ".") and b.call == c.call]
        nearest = max(around, key=lambda b: len(b.torch), default=None)
        if nearest is not None and nearest.status == "ok":
            c.status = "boundary"
            c.note = f"differs while its block {nearest.name} agrees"
            drawn.append((c, nearest))
    if drawn:  # one line, however deep the network (a 32-layer LLaMA has 32 such w1)
        c, nearest = drawn[0]
        more = f" (and {len(drawn) - 1} more like it)" if len(drawn) > 1 else ""
        notes.append(f"layer {c.name} differs ({fmt(c.error)}) while its block "
                     f"{nearest.name} agrees{more}: the two networks split that block's work "
                     "differently (e.g. an activation inside the layer on one side); not "
                     "counted")


def _params_of(model: Any, path: str, torch_side: bool) -> list[str]:
    layers = dict(model.named_modules() if torch_side else model.cells_and_names())
    layer = layers.get(path)
    if layer is None:
        return []
    if not torch_side:  # tensors are named by Parameter.name, as in the checkpoint
        return [p.name for _, p in layer.parameters_and_names(expand=False)]
    found = [f"{path}.{n}" for n, _ in layer.named_parameters(recurse=False)]
    return found + [f"{path}.{n}" for n, _ in layer.named_buffers(recurse=False)]


def _first_text(divergence: Divergence | None, drift: Drift) -> str | None:
    if divergence is None:
        return None
    text = divergence.describe()
    if drift.departure:
        text += (f"; the error left rounding's gradual climb earlier, at "
                 f"{drift.departure}")
    return text


def _known(c: LayerComparison, torch_model: Any, ms_model: Any) -> list[str]:
    """The known network differences (:mod:`.hints`) between a compared pair's layers."""
    return explain(dict(torch_model.named_modules()).get(c.torch),
                   dict(ms_model.cells_and_names()).get(c.ms))


def _shapes_part(skipped: list[LayerComparison], first_bad: LayerComparison | None,
                 networks: Networks) -> str | None:
    """Where the two networks' shapes first part, if before the first failing layer (a
    pool rounding its size the other way: every layer after it is not comparable, and the
    first one that is, the head, is where it fails), with what is known about it."""
    parted = next((c for c in skipped if c.note and c.note.startswith("shapes differ") and
                   (first_bad is None or c.index < first_bad.index)), None)
    if parted is None:
        return None
    known = networks.known(parted)
    return (f"the shapes part before the first divergence, at {parted.name} ({parted.note})"
            + (f" — {known[0]}" if known else ""))


def tensor_note(delta: Any) -> str:
    """``layer1.bn.moving_mean holds layer1.bn.running_var`` (or how it differs)."""
    if delta.status == "differs" and delta.holds:
        return f"{delta.target} holds {delta.holds}"
    if delta.status == "differs":
        return (f"{delta.target} differs from {delta.source} (max |Δ| {fmt(delta.max_abs)}, "
                f"cosine {fmt(delta.cosine) if delta.cosine is None else f'{delta.cosine:.6f}'})")
    return f"{delta.target}: {delta.status}"


def _divergence(first: LayerComparison, networks: Networks,
                correspondence: list[tuple[str, str]], tensor_diff: Any) -> Divergence:
    block = enclosing_block(first.torch, correspondence)
    tensors = networks.params_of(first.ms, False)
    if tensor_diff is not None:
        held = {d.target: d for d in tensor_diff.deltas}
        tensors = [tensor_note(held[t]) if t in held and held[t].status != "identical"
                   else t for t in tensors]
    if not tensors:
        tensors = networks.params_of(first.torch, True)
    return Divergence(
        ms_name=first.ms, torch_name=first.torch, error=first.error, max_abs=first.max_abs,
        nan=first.status == "nonfinite", call=first.call,
        ms_block=block[0] if block else None, torch_block=block[1] if block else None,
        shape=first.shape, bound=first.bound, tensors=tensors, weightless=not tensors)


@dataclass
class Run:
    """How a forward is run (the report's header) and what it records on the way (notes,
    seconds per step). Each driver makes one and hands it to :func:`judge`."""

    feed: list[Any]
    seed: int = 0
    tol: float = 1e-5
    dtype: str = "float32"
    torch_device: str = "cpu"
    ms_device: str = "cpu"
    noise_floor: bool = True
    progress: Callable[[str], None] | None = None
    notes: list[str] = field(default_factory=list)
    #: why the float32 noise was asked for and not measured (its forward failed): the
    #: bound is then tol alone, and the verdict says so (:func:`~ms_port.check.verdict.
    #: decide`)
    unmeasured: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    @property
    def scaled(self) -> bool:
        """Whether the bounds scale with the float32 noise (a float64 run's bound is tol)."""
        return self.dtype != "float64"

    def step(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)

    def timed(self, name: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, announced as ``name`` and its seconds kept under a short key."""
        self.step(name)
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            key = {"checking weights for NaN/Inf": "weight_check"}.get(name, name)
            self.timings[key.split(" (")[0].replace(" ", "_")] = time.perf_counter() - t0


@dataclass(frozen=True)
class ParityOptions:
    """How :func:`run_parity` runs and judges two networks (its keywords, one object)."""

    inputs: Any = None
    input_shape: tuple[int, ...] | None = None
    batch: int = 1
    seed: int = 0
    tol: float = 1e-5
    dtype: str = "float32"
    torch_device: str = "cpu"
    ms_device: str = "cpu"
    correspondence: list[tuple[str, str]] | None = None
    noise_floor: bool = True
    layers: bool = True
    tensor_diff: Any = None
    progress: Callable[[str], None] | None = None


def run_parity(torch_model: Any, ms_model: Any, options: ParityOptions | None = None,
               **overrides: Any) -> ParityReport:
    """Run both networks on the same inputs, compare every output and paired layer, and
    decide PASS, FAIL or INCONCLUSIVE (see :mod:`ms_port.check.verdict`).

    Both models are put in eval mode (and stay there); PyTorch runs under
    ``torch.no_grad()`` with TF32 off on CUDA. The caller's models are not cast or moved:
    where a dtype or device change is needed PyTorch works on a copy, and MindSpore's
    parameters are cast for the run and restored.

    Args:
        torch_model: a ``torch.nn.Module`` with its weights loaded.
        ms_model: a ``mindspore.nn.Cell`` with its weights loaded.
        options: a :class:`ParityOptions`; ``**overrides`` set any of its fields by
            name (``run_parity(a, b, input_shape=(3, 224, 224), tol=1e-4)``):
        inputs: :class:`~ms_port.check.inputs.InputArray` s or arrays (batch axis first),
            one per positional input; or else
        input_shape / batch / seed: one standard-normal float32 input of
            ``(batch, *input_shape)`` drawn with ``numpy.random.default_rng(seed)``.
        tol: the smallest bound; each output and layer must stay under
            ``max(tol, K × its float32 noise)``.
        dtype: ``"float32"`` or ``"float64"`` (both sides; the bound is then ``tol``).
        torch_device / ms_device: ``cpu`` or ``gpu`` / ``cpu``, ``gpu`` or ``ascend``.
        correspondence: ``(mindspore_path, torch_path)`` layer pairs (see
            :func:`correspondence_from_pairs`); ``None`` pairs same-named layers. Leaf
            layers left unpaired are paired by execution order and output shape.
        noise_floor: run PyTorch in float64 too, for the per-tensor noise (without it the
            bound is ``tol``).
        layers: record and compare every layer (``False``: outputs only).
        tensor_diff: the tensor-level comparison made before (a ``TensorDiff``): a
            differing tensor fails the run and is named where its layer diverges.
        progress: called with a short step name before each step; never printed.

    Returns:
        A :class:`ParityReport`; ``report.verdict`` and ``report.exit_code``.

    Raises:
        DeviceError: a device is unavailable, or MindSpore has no kernel for an op there.
        ParityError: bad arguments, or a forward pass failed (naming the layer).

    Example:
        >>> report = run_parity(torch_net, ms_net, input_shape=(3, 224, 224))
        >>> report.verdict, report.message  # doctest: +SKIP
        ('PASS', 'PASS: 1 output and 161 layers within their bounds; …')
    """
    if options is not None and not isinstance(options, ParityOptions):
        raise TypeError(f"run_parity()'s third argument is a ParityOptions, not "
                        f"{type(options).__name__}; give the other options by name")
    known = {f.name for f in fields(ParityOptions)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"run_parity() got unknown option(s) {', '.join(unknown)}; "
                        f"options: {', '.join(sorted(known))}")
    o = replace(options or ParityOptions(), **overrides)
    _validate(o.tol, o.dtype, o.batch)
    run = Run(_as_inputs(o.inputs, o.input_shape, o.batch, o.seed), seed=o.seed, tol=o.tol,
              dtype=o.dtype, torch_device=o.torch_device, ms_device=o.ms_device,
              noise_floor=o.noise_floor, progress=o.progress)
    return compare_networks(torch_model, ms_model, run, correspondence=o.correspondence,
                            layers=o.layers, tensor_diff=o.tensor_diff)


def compare_networks(torch_model: Any, ms_model: Any, run: Run, *,
                     correspondence: list[tuple[str, str]] | None = None, layers: bool = True,
                     tensor_diff: Any = None) -> ParityReport:
    """:func:`run_parity`'s work, on a :class:`Run` (the inputs and how they run): both
    networks forward, every paired layer and output compared, the verdict judged. The
    public door takes the user's keywords and packs them into the ``Run``; the verify
    engine makes its own."""
    ms_device = run.ms_device
    torch_model.eval()
    ms_model.set_train(False)
    ran = _forwards(torch_model, ms_model, run, layers)
    if ms_device.lower() == "cpu":
        kernels = devices.cpu_kernels_note()
        if kernels:
            run.notes.append(kernels)
    pairs_in = (default_correspondence(ran.torch_main, ms_model) if correspondence is None
                else list(correspondence))
    pairs = (pair_events(ran.t_events, ran.m_events, pairs_in,
                         unlike_layers(ran.torch_main, ms_model)) if layers else [])
    compared, outputs, drift = _judged(pairs, ran, run)
    torch_main = ran.torch_main
    layouts = Networks(
        params_of=lambda path, torch_side: _params_of(torch_main if torch_side else ms_model,
                                                      path, torch_side),
        known=lambda c: _known(c, torch_main, ms_model))
    return judge(outputs, compared, drift, layouts, run, correspondence=pairs_in,
                 nonfinite_weights=ran.nonfinite, tensor_diff=tensor_diff)


def _judged(pairs: list[Pair], ran: _Forwards, run: Run
            ) -> tuple[list[LayerComparison], list[OutputComparison], Drift]:
    """Every paired layer, then every output, against its bound. Where one is above it,
    again with each one's own error (:mod:`.replay`): a layer or output above its bound
    only through the values before it is ``amplified``."""
    tol, scaled = run.tol, run.scaled
    drift = Drift()
    compared = _layer_comparisons(pairs, ran.noise, ran.sens, tol=tol, scaled=scaled,
                                  drift=drift)
    t_float = [(n, a) for n, a in ran.t_outs if a.dtype.kind == "f"]
    m_float = [(n, a) for n, a in ran.m_outs if a.dtype.kind == "f"]
    alt, sens = dict(ran.alt_outs or []), dict(ran.sens_outs)

    def outputs_of(torch_outs: list[tuple[str, np.ndarray]], drift: Drift,
                   notes: list[str]) -> list[OutputComparison]:
        return _compare_outputs(torch_outs, m_float, alt, sens, tol=tol, scaled=scaled,
                                drift=drift, notes=notes)

    outputs = outputs_of(t_float, drift, run.notes)
    if not pairs or not any(c.status == "fail" for c in [*compared, *outputs]):
        return compared, outputs, drift
    own, replayed = _replay(ran, pairs, run)
    if not own:
        return compared, outputs, drift
    drift = Drift()
    compared = _layer_comparisons(pairs, ran.noise, ran.sens, tol=tol, scaled=scaled,
                                  drift=drift, own=own)
    outputs = outputs_of(t_float, drift, [])
    if not any(c.status in ("fail", "nonfinite") for c in compared):
        _carried_outputs(outputs, outputs_of(replayed, drift, []))
    return compared, outputs, drift


@dataclass
class _Forwards:
    """What :func:`_forwards` ran: each side's outputs and recorded layer calls, PyTorch's
    float64 outputs and per-layer noise, its second-input outputs and sensitivities."""

    torch_main: Any
    nonfinite: list[str]
    t_outs: Any = None
    t_events: Any = None
    alt_outs: Any = None
    noise: dict[tuple[str, int], float] = field(default_factory=dict)
    sens_outs: Any = None
    sens: Any = None
    m_outs: Any = None
    m_events: Any = None


def _forwards(torch_model: Any, ms_model: Any, run: Run, layers: bool) -> _Forwards:
    """Both networks on the run's inputs: PyTorch in the run's dtype, in the other one (the
    noise) and on a second input (the sensitivity), recording every layer; then MindSpore."""
    import mindspore
    import torch

    from .inputs import second_draw

    device = devices.torch_device(run.torch_device)
    devices.set_ms_device(run.ms_device)
    wide = run.dtype == "float64"
    main_dtype = torch.float64 if wide else torch.float32
    ms_dtype = mindspore.float64 if wide else mindspore.float32
    # floating-point inputs (a float64 .npy, a bfloat16 .pt) compute in the run's dtype on
    # both sides; integer inputs (token ids) stay as they are
    run_np = np.float64 if wide else np.float32
    x = [_as_run_dtype(np.asarray(i.array), run_np) for i in run.feed]
    x2 = [_as_run_dtype(np.asarray(i.array), run_np)
          for i in second_draw(run.feed, seed=run.seed)]
    torch_main = devices.torch_variant(torch_model, main_dtype, device)
    ran = _Forwards(torch_main, run.timed("checking weights for NaN/Inf",
                                          lambda: _nonfinite_weights(torch_model, ms_model)))

    def torch_run(model: Any, args: list[np.ndarray], what: str, cast: Any = None) -> Any:
        return devices.run_torch(model, args, device, what, torch_outputs, cast)

    def recorded(model: Any, fn: Callable[[], Any]) -> Any:
        return record_torch(model, fn) if layers else (fn(), [])

    def ms_forward() -> Any:
        return devices.run_ms(ms_model, x, run.dtype, ms_outputs)

    with devices.strict_fp32(device), devices.ms_params_as(ms_model, ms_dtype):
        ran.t_outs, ran.t_events = run.timed("torch forward", lambda: recorded(
            torch_main, lambda: torch_run(torch_main, x, "forward")))
        if run.noise_floor:
            _noise(torch_model, x, run, ran, torch_run, device)
        ran.sens_outs, ran.sens = run.timed(
            "torch second-input forward (sensitivity)", lambda: Measure(
                ran.t_events, "recorded").run(
                    torch_main, lambda: torch_run(torch_main, x2, "second forward")))
        ran.m_outs, ran.m_events = run.timed(
            "mindspore forward",
            lambda: record_ms(ms_model, ms_forward) if layers else (ms_forward(), []))
    return ran


def _replay(ran: _Forwards, pairs: list[Pair], run: Run
            ) -> tuple[dict[tuple[str, int], float], list[tuple[str, np.ndarray]]]:
    """Each paired call's own error, PyTorch fed MindSpore's values before it
    (:mod:`.replay`), and PyTorch's floating-point outputs so fed; run where a layer or an
    output is above its bound."""
    from .replay import Replay

    device = devices.torch_device(run.torch_device)
    wide = run.dtype == "float64"
    x = [_as_run_dtype(np.asarray(i.array), np.float64 if wide else np.float32)
         for i in run.feed]
    try:
        with devices.strict_fp32(device):
            outs, own = run.timed(
                "torch forward on MindSpore's layer outputs (replay)", lambda: Replay(
                    pairs).run(ran.torch_main, lambda: devices.run_torch(
                        ran.torch_main, x, device, "replay forward", torch_outputs)))
    except Exception as exc:  # optional: the layers stand judged on their error alone
        run.notes.append(f"each layer's own error not measured (PyTorch fed MindSpore's "
                         f"layer outputs failed: {devices.first_line(exc)})")
        return {}, []
    return own, [(n, a) for n, a in outs if a.dtype.kind == "f"]


def _carried_outputs(outputs: list[OutputComparison], replayed: list[OutputComparison]
                     ) -> None:
    """An output above its bound whose error, PyTorch fed MindSpore's layer outputs, is
    within it, is ``amplified`` (no layer having failed: the caller's condition)."""
    own = {(o.name, o.ms_name): o.error for o in replayed}
    for o in outputs:
        mine = own.get((o.name, o.ms_name))
        o.own = mine
        if o.status == "fail" and mine is not None and mine <= o.bound:
            o.status, o.ok, o.problem = "amplified", True, None


def _noise(torch_model: Any, x: list[np.ndarray], run: Run, ran: _Forwards,
           torch_run: Callable[..., Any], device: Any) -> None:
    """PyTorch in the other precision, for each recorded layer's float32 noise (optional:
    where it fails the comparison stands, with the bound ``tol``)."""
    import torch

    wide = run.dtype == "float64"
    alt_dtype, name = (torch.float32, "float32") if wide else (torch.float64, "float64")
    try:
        alt = devices.torch_variant(torch_model, alt_dtype, device)
        ran.alt_outs, ran.noise = run.timed(f"torch {name} forward (noise)", lambda: Measure(
            ran.t_events, "float64").run(
                alt, lambda: torch_run(alt, x, f"{name} forward", alt_dtype)))
    except Exception as exc:  # optional; the comparison itself stands
        run.unmeasured = f"PyTorch's {name} forward failed ({devices.first_line(exc)})"
        run.notes.append(f"noise not measured: {run.unmeasured}; the bound is tol")


def _compare_outputs(t_float: list[tuple[str, np.ndarray]], m_float: list[tuple[str, np.ndarray]],
                     alt_by_name: dict[str, np.ndarray], sens_by_name: dict[str, np.ndarray], *,
                     tol: float, scaled: bool, drift: Drift,
                     notes: list[str]) -> list[OutputComparison]:
    """Pair the floating-point outputs (by name, shape, position; then those left over in
    another layout) and compare each against its bound."""

    def measured(tname: str, tarr: np.ndarray, alt: Any, other: Any) -> tuple[Any, Any]:
        # where the output overflows, over its finite values (float64 does not overflow
        # where float32 does; the overflow itself is judged apart: _same_overflow)
        def over(reference: Any, kind: str) -> Any:
            if reference is None or reference.shape != tarr.shape:
                return None
            fin = np.isfinite(tarr) & np.isfinite(reference)
            if fin.all():
                return distance(tarr, reference, kind)
            return distance(tarr[fin], reference[fin], kind) if fin.any() else None
        return over(alt, "float64"), over(other, "recorded")

    def plain(t_outs: list[tuple[str, np.ndarray]], m_outs: list[tuple[str, np.ndarray]],
              by_position: bool) -> list[OutputPair]:
        found = []
        for ti, mi in pair_outputs(t_outs, m_outs, by_position=by_position):
            (tname, tarr), (mname, marr) = t_outs[ti], m_outs[mi]
            n, s = measured(tname, tarr, alt_by_name.get(tname), sens_by_name.get(tname))
            found.append(OutputPair(tname, mname, tarr, marr, n, s, None,
                                    ((tname,), (mname,))))
        return found

    used_t: set[str] = set()
    used_m: set[str] = set()
    items: list[OutputPair] = []
    # by name and shape; then in another layout; then what is left, by position where
    # as many are left on each side (a detector's top-k detections, which one side
    # computes after its head and the other does not, are no counterpart of its raw maps)
    for step in (lambda t, m: plain(t, m, False),
                 lambda t, m: _relaid(t, m, alt_by_name, sens_by_name, measured),
                 lambda t, m: plain(t, m, True) if len(t) == len(m) else []):
        found = step([o for o in t_float if o[0] not in used_t],
                     [o for o in m_float if o[0] not in used_m])
        for pair in found:
            used_t.update(pair.members[0])
            used_m.update(pair.members[1])
        items += found
    relaid = any(p.layout for p in items)
    bounds = Bounds(tol, scaled, drift.ratio)
    outputs = [_compare_output(i, pair, bounds) for i, pair in enumerate(items)]
    if relaid:
        notes.append("outputs compared in another layout: "
                     + "; ".join(f"{o.name}: {o.layout}" for o in outputs if o.layout))
    unpaired = [f"PyTorch {n}" for n, _ in t_float if n not in used_t]
    unpaired += [f"MindSpore {n}" for n, _ in m_float if n not in used_m]
    if unpaired:
        notes.append(f"outputs not compared (no counterpart): {', '.join(unpaired[:6])}")
    return outputs


def _relaid(left_t: list[tuple[str, np.ndarray]], left_m: list[tuple[str, np.ndarray]],
            alt: dict[str, np.ndarray], sens: dict[str, np.ndarray],
            measured: Callable[..., tuple[Any, Any]]) -> list[OutputPair]:
    """Pairs of the outputs the plain pairing left, in another layout
    (:mod:`ms_port.check.relayout`): a MindSpore B×N×C against PyTorch's B×C×N, and outputs
    under one parent joined on either side."""
    from .relayout import groups, transposed, transposition_note

    pairs: list[OutputPair] = []
    free_m = dict(left_m)
    for tname, tarr in left_t:
        mname = next((m for m, a in free_m.items() if transposed(a, tarr)), None)
        if mname is not None:
            marr = free_m.pop(mname)
            n, s = measured(tname, tarr, alt.get(tname), sens.get(tname))
            pairs.append(OutputPair(tname, mname, tarr, marr.transpose(0, 2, 1), n, s,
                                    transposition_note(marr, tarr), ((tname,), (mname,))))
    taken = {p.tname for p in pairs}
    t_rest = [(n, a) for n, a in left_t if n not in taken]
    t_all = dict(t_rest)
    t_joins = [(j.name, j.of(t_all), j) for j in groups(t_rest)]
    m_joins = [(j.name, j.of(free_m), j) for j in groups(list(free_m.items()))]
    t_cands = [(n, a, None) for n, a in t_rest] + t_joins
    m_cands = [(n, a, None) for n, a in free_m.items()] + m_joins
    for tname, tarr, tjoin in t_cands:
        if tjoin is None and not m_joins:
            continue
        match = next(((mn, ma, mj) for mn, ma, mj in m_cands
                      if (tjoin or mj) and ma.shape == tarr.shape), None)
        if match is None:
            continue
        mname, marr, mjoin = match
        m_cands = [c for c in m_cands if c[0] != mname]
        t_members = tjoin.members if tjoin else (tname,)
        n, s = measured(tname, tarr, tjoin.of(alt) if tjoin else alt.get(tname),
                        tjoin.of(sens) if tjoin else sens.get(tname))
        how = "; ".join(f"{side} {j.describe()}" for side, j in (("PyTorch", tjoin),
                                                                 ("MindSpore", mjoin)) if j)
        pairs.append(OutputPair(tname, mname, tarr, marr, n, s, how,
                                (t_members, mjoin.members if mjoin else (mname,))))
    return pairs


@dataclass(frozen=True)
class Networks:
    """What the verdict asks of the two networks once they have run: the tensors a layer
    holds (``params_of(path, torch_side)``) and the known differences between a compared
    pair's layers (``known(comparison)``). The whole-network driver asks the live
    networks; the block driver, which has freed them, asks the plan's names."""

    params_of: Callable[[str, bool], list[str]]
    known: Callable[[LayerComparison], list[str]]


def _carried_note(carried: list[LayerComparison], outputs: list[OutputComparison]) -> str:
    """The layers and outputs above their bound only through their input
    (:mod:`.replay`)."""
    outs = [o for o in outputs if o.status == "amplified"]
    c = carried[0] if carried else outs[0]
    what = ", ".join(part for part in (
        f"{len(carried)} layer(s)" if carried else "",
        f"{len(outs)} output(s)" if outs else "") if part)
    return (f"{what} above their bound only through their input: given MindSpore's values "
            f"before them, each adds an error within its bound — the rounding before it, "
            f"carried up by what it computes (a softmax of large logits, a division by a "
            f"small value), e.g. {c.name}: error {fmt(c.error)} > bound {fmt(c.bound)}, its "
            f"own {fmt(c.own)}")


def _first_bad(compared: list[LayerComparison], unmeasured: str | None
               ) -> LayerComparison | None:
    """The first layer above its bound; where the noise that sets the bounds is unknown
    (``unmeasured``), the first one past what rounding alone reaches, if any: an early
    layer's rounding above ``tol`` is no divergence."""
    bad = [c for c in compared if c.status in ("fail", "nonfinite")]
    if unmeasured:
        bad = [c for c in bad if c.status == "nonfinite" or c.error > ROUNDING_REACH] or bad
    return bad[0] if bad else None


def judge(outputs: list[OutputComparison], compared: list[LayerComparison], drift: Drift,
          networks: Networks, run: Run, *, correspondence: list[tuple[str, str]] = (),
          nonfinite_weights: list[str] = (), tensor_diff: Any = None) -> ParityReport:
    """The verdict from the comparisons, whichever driver made them (the whole network in
    one forward, or block by block): PASS, FAIL or INCONCLUSIVE with the first divergence,
    the reasons and the notes."""
    notes, tol, feed = run.notes, run.tol, run.feed
    nonfinite_weights = list(nonfinite_weights)
    skipped = [c for c in compared if c.status == "skipped"]
    if skipped:
        notes.append(f"{len(skipped)} paired layer(s) not comparable, e.g. {skipped[0].name}: "
                     f"{skipped[0].note}")
    by_order = sum(c.paired_by == "order" for c in compared)
    if by_order:
        notes.append(f"{by_order} layer call(s) paired by execution order and output shape")
    insensitive = [c for c in compared if c.status == "insensitive"]
    if insensitive:
        notes.append(f"{len(insensitive)} layer(s) barely depend on the input (their "
                     f"agreement proves little; their weights are compared directly), e.g. "
                     f"{insensitive[0].name}")
    carried = [c for c in compared if c.status == "amplified"]
    if carried or any(o.status == "amplified" for o in outputs):
        notes.append(_carried_note(carried, outputs))
    everything = compared
    compared = [c for c in compared if c.status != "skipped"]
    _blocks_with_other_bounds(compared, outputs, notes)
    _blocks_not_carried(compared, notes)
    _leaves_drawn_differently(compared, notes)
    first_bad = _first_bad(compared, run.unmeasured if run.scaled else None)
    divergence = (None if first_bad is None else
                  _divergence(first_bad, networks, correspondence, tensor_diff))
    known = [] if first_bad is None else (networks.known(first_bad)
                                          or _known_before(first_bad, everything, networks))

    problems = []
    if nonfinite_weights:
        shown = "; ".join(nonfinite_weights[:3]) + ("; …" if len(nonfinite_weights) > 3 else "")
        problems.append(f"weights hold NaN/Inf: {shown}")
    tensor_problems = []
    if tensor_diff is not None:
        differing = [d for d in tensor_diff.deltas if d.status in ("differs", "shape")]
        if differing:
            shown = "; ".join(tensor_note(d) for d in differing[:3])
            tensor_problems.append(
                f"{len(differing)} MindSpore tensor(s) differ from their PyTorch source "
                f"through the plan: {shown}{'; …' if len(differing) > 3 else ''}")
    verdict, reasons = decide(outputs, compared, problems=problems,
                              tensor_problems=tensor_problems,
                              first=_first_text(divergence, drift), tol=tol,
                              unmeasured=run.unmeasured if run.scaled else None)
    if verdict == FAIL:
        parted = _shapes_part(skipped, first_bad, networks)
        if parted:
            reasons.insert(min(1, len(reasons)), parted)
        between = (None if known or divergence is None or parted
                   else _between_layers(first_bad, compared, divergence, tensor_diff))
        if between:
            reasons.append(between)
    run.timings["total"] = time.perf_counter() - run.started

    error = max((o.error for o in outputs), default=math.inf)
    max_abs = max((o.max_abs for o in outputs), default=math.inf)
    floor = max((o.noise for o in outputs if o.noise is not None), default=None)
    if verdict == PASS and floor and error > _FLOOR_FACTOR * floor:
        notes.append(f"error is {error / floor:.0f}× the float32 noise floor: rounding alone does "
                     "not explain it — check layer settings that hold no weights (LayerNorm "
                     "epsilon: MindSpore 1e-7, PyTorch 1e-5; BatchNorm eps; padding; "
                     "approximate GELU)")
    report = ParityReport(
        ok=verdict == PASS, tol=float(tol), error=error, max_abs=max_abs, outputs=outputs,
        noise_floor=floor, first_divergence=divergence,
        input_shape=tuple(feed[0].array.shape[1:]), batch=int(feed[0].array.shape[0]),
        seed=run.seed, dtype=run.dtype, torch_device=run.torch_device,
        ms_device=run.ms_device, timings=run.timings, layers_checked=len(compared),
        nonfinite_weights=nonfinite_weights, notes=notes, verdict=verdict,
        k=K if run.scaled else 0.0, layers=compared,
        drift=drift.peak, drift_at=drift.where,
        inputs=[i.to_dict() for i in feed], reasons=reasons, tensors=tensor_diff,
        known_differences=known)
    report.message = _message(report)
    return report


def _message(report: ParityReport) -> str:
    if report.verdict == PASS:
        return pass_message(report.outputs, report.layers, report.tol, report.drift_at,
                            report.drift)
    if report.verdict == INCONCLUSIVE:
        return f"INCONCLUSIVE: {report.reasons[0]}"
    text = f"FAIL: {'; '.join(report.reasons[:3])}" if report.reasons else "FAIL"
    if report.first_divergence is not None:
        if report.first_divergence.describe() not in text:
            text += f"; first divergence at {report.first_divergence.describe()}"
        behind = [t for t in report.first_divergence.tensors if " " in t and t not in text]
        if behind:
            text += f"; {'; '.join(behind[:3])}"
        if report.known_differences and report.known_differences[0].split(" (at ")[0] not in text:
            text += f" — a known network difference: {report.known_differences[0]}"
    elif report.layers_checked and any(not o.ok for o in report.outputs):
        text += (f"; the {report.layers_checked} layer outputs compared agree, so the "
                 "difference arises after or outside them")
    elif not report.layers_checked and any(not o.ok for o in report.outputs):
        text += "; no layers were paired: pass a mapping (or correspondence) to locate it"
    return text

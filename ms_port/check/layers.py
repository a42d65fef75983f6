"""Every layer's output on both sides, recorded in one forward each, and paired.

Forward hooks record each layer call as an :class:`Event` — path, call number, position
in execution order (hooks fire when a layer *finishes*, so a layer comes before the block
around it), class, and a copy of its output. PyTorch's float64 and second-input passes
do not store anything: their hooks measure against the recorded float32 outputs as they
fire (:class:`Measure`), so memory is one set of activations per side.

Pairing (:func:`pair_events`), in order of trust:

1. **by name** — the conversion plan's parameter pairs give layer pairs
   (``layer1.0.bn1`` ↔ ``layer1.0.bn1``, ``end_point`` ↔ ``fc``) and their blocks; a
   layer with the same path on both sides pairs too (``relu``, ``maxpool``);
2. **by order** — the remaining leaf layers (weightless ones: activations, pooling,
   padding), between two name-paired layers, are aligned as sequences of output shapes
   (:class:`difflib.SequenceMatcher`); equal runs pair, in execution order.

A layer that runs several times (a shared ReLU) pairs call by call.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .compare import comparable, ms_to_numpy, named_leaves, relative_error, torch_outputs


@dataclass
class Event:
    """One call of one layer."""

    path: str
    call: int
    seq: int
    kind: str
    leaf: bool
    arrays: list[np.ndarray] = field(repr=False)
    #: the unit order-pairing works on: a leaf, or a weightless layer whose parent has
    #: weights (MindCV's Swish, not the Sigmoid inside it, pairs with torch's SiLU)
    unit: bool = True

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(a.shape for a in self.arrays)


@dataclass
class Pair:
    torch: Event
    ms: Event
    how: str  # "name" | "order"
    #: why the two outputs are not the same quantity, though the layers hold the same
    #: weights (one runs its activation inside it): then not compared, the reason noted
    unlike: str | None = None


#: layer kinds that compute nothing in eval mode: such a child does not make its parent
#: compute more than its weights say, and such a layer is no evidence when paired by
#: order alone (its output is its input)
PASSIVE = frozenset({"Identity", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d",
                     "DropPath", "AlphaDropout", "StochasticDepth"})


def computing_children(layer: Any, torch_side: bool) -> list[str]:
    """The children of a layer holding weights that compute something in eval mode: timm's
    ``BatchNormAct2d`` runs its activation (``act``) inside the BatchNorm."""
    own = (layer.named_parameters(recurse=False) if torch_side
           else layer.parameters_and_names(expand=False))
    if not any(True for _ in own):
        return []
    children = layer.named_children() if torch_side else layer.name_cells().items()
    return [f"{name} ({type(child).__name__})" for name, child in children
            if type(child).__name__ not in PASSIVE]


def _holds_layers(layer: Any, torch_side: bool) -> bool:
    children = layer.children() if torch_side else layer.cells()
    return any(type(child).__name__ not in PASSIVE for child in children)


def unlike_layers(torch_model: Any, ms_model: Any) -> Callable[[Pair], str | None]:
    """Why a name-paired layer's two outputs are not one quantity, or ``None``: one side
    runs more inside it than the other (:func:`computing_children`). The activation inside
    is a layer of its own, compared with the other side's where they pair."""
    t_layers = dict(torch_model.named_modules())
    m_layers = dict(ms_model.cells_and_names())

    def why(pair: Pair) -> str | None:
        t, m = t_layers.get(pair.torch.path), m_layers.get(pair.ms.path)
        if t is None or m is None:
            return None
        t_more, m_more = computing_children(t, True), computing_children(m, False)
        # one side runs an activation inside it, the other is a bare layer (no child that
        # computes): two composite layers are blocks, compared as such
        if bool(t_more) == bool(m_more) or (t_more and _holds_layers(m, False)) or (
                m_more and _holds_layers(t, True)):
            return None
        side, more, other = (("PyTorch's", t_more, "MindSpore's") if t_more
                             else ("MindSpore's", m_more, "PyTorch's"))
        return (f"{side} {pair.torch.kind if t_more else pair.ms.kind} runs "
                f"{', '.join(more)} inside it, {other} layer does not: its output is "
                "another quantity (compared where the activation is)")
    return why


def _float_arrays(named: list[tuple[str, np.ndarray]]) -> list[np.ndarray]:
    return [a for _, a in named if a.dtype.kind == "f"]


class _Recorder:
    """Records each hooked call. ``keep`` (MindSpore) holds the output tensors and converts
    them once the forward is done: converting inside every hook makes MindSpore finish its
    asynchronous work layer by layer (ResNet50 on CPU: 4.7 s -> 8.2 s). Its ops return new
    tensors, so a kept output is not changed afterwards; PyTorch's are copied at once
    (``ReLU(inplace=True)`` overwrites them)."""

    def __init__(self, convert: Callable[[Any], list[tuple[str, np.ndarray]]],
                 keep: Callable[[Any], Any] | None = None):
        self.convert = convert
        self.keep = keep
        self.pending: list[tuple[str, int, str, bool, Any]] = []
        self.events: list[Event] = []
        self.calls: dict[str, int] = {}

    def hook(self, path: str, kind: str, leaf: bool) -> Callable[..., None]:
        def record(_layer: Any, _args: Any, output: Any) -> None:
            call = self.calls.get(path, 0)
            self.calls[path] = call + 1
            if self.keep is not None:
                self.pending.append((path, call, kind, leaf, self.keep(output)))
            else:
                self._add(path, call, kind, leaf, self.convert(output))
        return record

    def _add(self, path: str, call: int, kind: str, leaf: bool,
             named: list[tuple[str, np.ndarray]]) -> None:
        arrays = _float_arrays(named)
        if arrays:
            self.events.append(Event(path, call, len(self.events), kind, leaf, arrays))

    def finish(self) -> list[Event]:
        for path, call, kind, leaf, kept in self.pending:
            self._add(path, call, kind, leaf, self.convert(kept))
        self.pending = []
        return self.events


def _named(model: Any, torch_side: bool) -> list[tuple[str, Any, bool]]:
    items = model.named_modules() if torch_side else model.cells_and_names()
    found = []
    for name, layer in items:
        if not name:
            continue  # the whole network: its outputs are compared as outputs
        children = layer.children() if torch_side else layer.cells()
        found.append((name, layer, not any(True for _ in children)))
    return found


def _mark_units(events: list[Event], paths: set[str]) -> list[Event]:
    for e in events:
        e.unit = e.path in paths
    return events


def units(model: Any, torch_side: bool) -> set[str]:
    """Layer paths order-pairing compares: leaves, and weightless layers (activations
    built of smaller cells) whose parent has weights; nothing inside a weightless one."""
    items = list(model.named_modules() if torch_side else model.cells_and_names())

    def weightless(layer: Any) -> bool:
        params = layer.parameters() if torch_side else layer.get_parameters()
        return not any(True for _ in params)

    light = {name for name, layer in items if name and weightless(layer)}
    found = set()
    for name, layer in items:
        if not name:
            continue
        parent = name.rpartition(".")[0]
        if parent in light:
            continue  # inside a weightless layer: that layer is the unit
        children = layer.children() if torch_side else layer.cells()
        if name in light or not any(True for _ in children):
            found.add(name)
    return found


def record_torch(model: Any, run: Callable[[], Any]) -> tuple[Any, list[Event]]:
    """Run ``run()`` with every named module hooked: (its result, the events)."""
    rec = _Recorder(torch_outputs)
    handles = [m.register_forward_hook(rec.hook(n, type(m).__name__, leaf))
               for n, m, leaf in _named(model, True)]
    try:
        return run(), _mark_units(rec.events, units(model, True))
    finally:
        for h in handles:
            h.remove()


def record_ms(model: Any, run: Callable[[], Any]) -> tuple[Any, list[Event]]:
    """Run ``run()`` with every named cell hooked (PyNative): (its result, the events)."""
    import mindspore

    from .devices import ms_pynative

    def keep(output: Any) -> Any:  # the tensors only; converted after the forward
        return named_leaves(output, lambda o: isinstance(o, mindspore.Tensor))

    rec = _Recorder(lambda kept: [(n, ms_to_numpy(t)) for n, t in kept], keep)
    with ms_pynative():
        handles = [c.register_forward_hook(rec.hook(n, type(c).__name__, leaf))
                   for n, c, leaf in _named(model, False)]
        try:
            result = run()
        finally:
            for h in handles:
                h.remove()
        return result, _mark_units(rec.finish(), units(model, False))


def distance(recorded: np.ndarray, new: np.ndarray, reference: str) -> float:
    """Relative L2 distance of a second pass from the recorded one, against ``reference``:
    ``"float64"`` (noise: the float32 result against the float64 one, whichever pass was
    which) or ``"recorded"`` (sensitivity: the change against the main pass)."""
    if reference == "recorded":
        return relative_error(new, recorded)[0]
    wide, narrow = (recorded, new) if recorded.dtype == np.float64 else (new, recorded)
    return relative_error(narrow, wide)[0]


class Measure:
    """Hooks for a second PyTorch pass: each layer's relative L2 distance from the
    recorded output of the same call (:func:`distance`; another dtype: the float32 noise;
    another input: the sensitivity). A call whose outputs do not line up is not measured
    (``None``), never counted as 0."""

    def __init__(self, recorded: list[Event], reference: str, *, stacked: bool = False):
        """``stacked``: the pass runs two inputs stacked on the first axis, the measured one
        first; a layer's output of twice the recorded rows is measured on its first half
        (the batch, or the tokens batch first)."""
        self.reference = reference
        self.stacked = stacked
        self.by_key = {(e.path, e.call): e for e in recorded}
        self.calls: dict[str, int] = {}
        self.values: dict[tuple[str, int], float] = {}

    def hook(self, path: str) -> Callable[..., None]:
        def measure(_layer: Any, _args: Any, output: Any) -> None:
            call = self.calls.get(path, 0)
            self.calls[path] = call + 1
            event = self.by_key.get((path, call))
            if event is None:
                return
            arrays = _float_arrays(torch_outputs(output))
            if self.stacked and len(arrays) == len(event.arrays):
                arrays = [_first_half(a, ref) for a, ref in zip(arrays, event.arrays)]
            if [a.shape for a in arrays] != [a.shape for a in event.arrays]:
                return
            self.values[(path, call)] = max(
                (distance(ref, new, self.reference) for ref, new in zip(event.arrays, arrays)),
                default=0.0)
        return measure

    def run(self, model: Any, run: Callable[[], Any]) -> tuple[Any, dict[tuple[str, int], float]]:
        return with_hooks(model, self.hook, run), self.values


def _first_half(array: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """The first input's part of a stacked pass's output: its first half where it has
    twice ``ref``'s rows and ``ref``'s shape otherwise, else ``array`` as it is."""
    if (array.ndim and ref.ndim and array.shape[0] == 2 * ref.shape[0]
            and array.shape[1:] == ref.shape[1:]):
        return array[:ref.shape[0]]
    return array


def split_stacked(events: list[Event], shape: tuple[int, ...], *, measure: bool = False
                  ) -> dict[tuple[str, int], float]:
    """The events of a pass that ran two inputs of token ids ``shape`` (batch, tokens)
    stacked on the batch axis, made the first input's alone: each output with twice the
    batch, or twice its tokens, on its first axis is cut to its first half (a copy). With
    ``measure``, each layer's second half is measured against its first as
    :class:`Measure` measures a second input's pass (``"recorded"``): the measures, of
    the layers whose every output was cut. For a family whose every layer computes each
    row of a batch on its own, batch first (``stacks``)."""
    whole = {2 * shape[0], 2 * math.prod(shape)}
    measures = {}
    for e in events:
        halves = [(a[:a.shape[0] // 2], a[a.shape[0] // 2:])
                  if a.ndim and a.shape[0] in whole else None for a in e.arrays]
        if measure and halves and all(h is not None for h in halves):
            measures[(e.path, e.call)] = max(distance(first, second, "recorded")
                                             for first, second in halves)  # type: ignore[misc]
        e.arrays = [a if h is None else h[0].copy() for a, h in zip(e.arrays, halves)]
    return measures


def with_hooks(model: Any, hook: Callable[[str], Callable[..., Any]],
               run: Callable[[], Any]) -> Any:
    """``run()`` with ``hook(path)`` on every module of a PyTorch model, removed after."""
    handles = [m.register_forward_hook(hook(n)) for n, m, _ in _named(model, True)]
    try:
        return run()
    finally:
        for h in handles:
            h.remove()


def _same_path_pairs(torch_events: list[Event], ms_events: list[Event],
                     taken_torch: set[str], taken_ms: set[str]) -> dict[str, str]:
    torch_paths = {e.path for e in torch_events if e.leaf} - taken_torch
    return {e.path: e.path for e in ms_events
            if e.leaf and e.path in torch_paths and e.path not in taken_ms}


def pair_events(torch_events: list[Event], ms_events: list[Event],
                layer_pairs: list[tuple[str, str]],
                unlike: Callable[[Pair], str | None] | None = None) -> list[Pair]:
    """Pair the two sides' events by name, then leaf layers by order (module docstring).

    Args:
        torch_events / ms_events: as recorded, in execution order.
        layer_pairs: ``(mindspore_path, torch_path)`` from the conversion plan.
        unlike: why a name pair's outputs are not one quantity (:func:`unlike_layers`):
            such a pair is kept, marked, and is no anchor for pairing by order.

    Returns:
        The pairs in PyTorch execution order.
    """
    ms_by_key = {(e.path, e.call): e for e in ms_events}
    torch_for_ms: dict[str, list[str]] = {}
    for ms_path, torch_path in layer_pairs:
        if ms_path and torch_path:
            torch_for_ms.setdefault(ms_path, []).append(torch_path)
    taken_torch = {t for ts in torch_for_ms.values() for t in ts}
    for ms_path, torch_path in _same_path_pairs(torch_events, ms_events, taken_torch,
                                                set(torch_for_ms)).items():
        torch_for_ms.setdefault(ms_path, []).append(torch_path)
    ms_for_torch: dict[str, list[str]] = {}
    for ms_path, torch_paths in torch_for_ms.items():
        for torch_path in torch_paths:
            ms_for_torch.setdefault(torch_path, []).append(ms_path)

    pairs: list[Pair] = []
    used_ms: set[int] = set()
    for t in torch_events:
        for ms_path in ms_for_torch.get(t.path, ()):
            m = ms_by_key.get((ms_path, t.call))
            if m is not None and m.seq not in used_ms:
                pairs.append(Pair(t, m, "name"))
                used_ms.add(m.seq)
    for pair in pairs:
        pair.unlike = unlike(pair) if unlike is not None else None
    pairs += _pair_by_order(torch_events, ms_events,
                            [p for p in pairs if p.unlike is None], used_ms)
    pairs.sort(key=lambda p: (p.torch.seq, p.ms.seq))
    return pairs


def _pair_by_order(torch_events: list[Event], ms_events: list[Event], named: list[Pair],
                   used_ms: set[int]) -> list[Pair]:
    used_torch = {p.torch.seq for p in named}
    # anchors: name pairs whose order agrees on both sides (a longest increasing run);
    # a pair whose outputs cannot be compared (DPN's stem holds its max pool in MindCV,
    # not in timm) does not end where its namesake ends, and anchors nothing
    anchors = []
    for p in sorted(named, key=lambda p: p.torch.seq):
        if not _same_values_shape(p.torch, p.ms):
            continue
        if not anchors or p.ms.seq > anchors[-1].ms.seq:
            anchors.append(p)
    bounds = [(-1, -1), *((a.torch.seq, a.ms.seq) for a in anchors),
              (len(torch_events), len(ms_events))]
    found = []
    for (t0, m0), (t1, m1) in zip(bounds, bounds[1:]):
        # a layer that computes nothing (an Identity) is no evidence paired by order alone
        ts = [e for e in torch_events[t0 + 1:t1] if e.unit and e.seq not in used_torch
              and e.kind not in PASSIVE]
        ms = [e for e in ms_events[m0 + 1:m1] if e.unit and e.seq not in used_ms
              and e.kind not in PASSIVE]
        if not ts or not ms:
            continue
        matcher = difflib.SequenceMatcher(None, [_layout_free(e.shapes) for e in ts],
                                          [_layout_free(e.shapes) for e in ms], autojunk=False)
        blocks = matcher.get_matching_blocks()
        for block in blocks:
            for k in range(block.size):
                found.append(Pair(ts[block.a + k], ms[block.b + k], "order"))
        found += _lone_in_gaps(ts, ms, blocks)
    return found


def _lone_in_gaps(ts: list[Event], ms: list[Event], blocks: list[Any]) -> list[Pair]:
    """Where order leaves one layer on each side between the same two paired ones, both
    of one kind, and their outputs are the same values in another layout (channels last
    against channels first: ConvNeXt's GELU beside 1x1 convolutions): a pair."""
    found = []
    a = b = 0
    for block in blocks:
        gap_t, gap_m = ts[a:block.a], ms[b:block.b]
        if (len(gap_t) == len(gap_m) == 1 and gap_t[0].kind == gap_m[0].kind
                and _same_values_shape(gap_t[0], gap_m[0])):
            found.append(Pair(gap_t[0], gap_m[0], "order"))
        a, b = block.a + block.size, block.b + block.size
    return found


def _same_values_shape(torch_event: Event, ms_event: Event) -> bool:
    if len(torch_event.arrays) != len(ms_event.arrays):
        return False
    return all(not isinstance(comparable(m, t), str)
               for m, t in zip(ms_event.arrays, torch_event.arrays))


def _layout_free(shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """Output shapes with size-1 axes aside and every axis before the last as one (a
    Swin's B×L×C tokens are its B×H×W×C map): the same in two layouts
    :func:`~ms_port.check.compare.comparable` compares; a channel-first map
    (C×H×W) stays apart from a channel-last one."""
    found = []
    for shape in shapes:
        kept = tuple(d for d in shape if d != 1)
        found.append((math.prod(kept[:-1]), kept[-1]) if len(kept) >= 2 else kept)
    return tuple(found)


def layer_error(pair: Pair) -> tuple[float, float, str | None]:
    """(relative L2 error, max abs difference, why not comparable) of a pair's outputs;
    the worst over a layer's output tensors."""
    error = max_abs = 0.0
    if len(pair.ms.arrays) != len(pair.torch.arrays):
        return float("inf"), float("inf"), (f"{len(pair.ms.arrays)} output tensor(s) in "
                                            f"MindSpore, {len(pair.torch.arrays)} in PyTorch")
    for ms_arr, torch_arr in zip(pair.ms.arrays, pair.torch.arrays):
        shaped = comparable(ms_arr, torch_arr)
        if isinstance(shaped, str):
            return float("inf"), float("inf"), shaped
        e, m = relative_error(shaped, torch_arr)
        error, max_abs = max(error, e), max(max_abs, m)
    return error, max_abs, None

"""A mixture of experts' routed experts a group at a time: verify by layers at the size of
the attention and one group of experts.

DeepSeek-V3's MoE layer holds 256 experts, 11.3B parameters: 45 GB in float32, 90 GB in
the float64 of the noise pass. Verify by layers (:mod:`ms_port.check.blocks`) runs such a
layer (where its family gives :class:`~ms_port.archs.experts.RoutedExperts`) in three
steps, each side's network built without its routed experts:

1. **What the experts are given.** The layer runs on every pass (PyTorch float32, second
   input, float64, fed; MindSpore, fed) with its routed experts replaced by a stand-in
   that keeps what the layer hands them (the tokens, the router's expert indices and
   weights) and returns zeros.
2. **The experts, a group at a time.** Each group's tensors are read (both sides, float32
   and float64), put into the framework's own experts module built for that many experts
   (transformers' ``Qwen3MoeExperts`` / ``DeepseekV3Experts``, MindFormers'
   ``FFNGroupedGEMM``) and run on each pass's tokens with the indices outside the group
   masked out (transformers' own sentinel, MindFormers' weight 0): the group's share of
   the routed sum. Every expert is also run on every token of PyTorch's input on both
   sides (and on the second input and in float64, for its sensitivity and noise) and
   compared: each group reports its worst expert. The group is freed before the next.
3. **The layer.** The layer runs again on every pass, the stand-in now returning the
   routed sum of its pass (and refusing an input other than the one it was given in
   step 1): the recorded outputs, the measures and the comparisons are those of
   :func:`~ms_port.check.blocks._whole_piece`.

The routed sum adds the groups' shares in turn where the framework adds the experts in
turn: the same sum but for float32 rounding, on both sides alike.
"""

from __future__ import annotations

import copy
import gc
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from ..archs.experts import RoutedExperts
from ..errors import ParityError, shown
from .compare import relative_error
from .devices import release_ms_pool
from .layers import distance
from .report import LayerComparison
from .verdict import bound_for, status_of

#: experts per group; None: as many as make :data:`GROUP_NUMEL` parameters (tests set it)
EXPERTS_PER_GROUP: int | None = None
#: parameters per group by default: a group's work is about 5x its float32 bytes (float32,
#: float64 and MindSpore's copy, and the host stand-in's); at DeepSeek-V3's widths a group
#: of 4 experts ran at 9.7 GiB, of 1 at 6.9 GiB, in about the same time per expert
GROUP_NUMEL = 64 << 20


@dataclass(frozen=True)
class Groups:
    """A layer's routed experts and the experts per group."""

    experts: RoutedExperts
    size: int

    @property
    def starts(self) -> range:
        return range(0, self.experts.count, self.size)


def plan_groups(blocks: Any, piece: Any, source: Any) -> Groups | None:
    """How a block's routed experts run (:class:`Groups`), or None: the block has none,
    its family cannot run them apart, or they are no larger than a group."""
    routed_of = getattr(blocks, "routed_of", None)
    routed = None if routed_of is None else routed_of(piece, set(source.tensors))
    if routed is None:
        return None
    count = routed.count
    experts = sum(source.tensors[n].numel for names in routed.torch.values() for n in names)
    if EXPERTS_PER_GROUP is not None:
        size = EXPERTS_PER_GROUP
    else:
        if experts <= GROUP_NUMEL:
            return None
        size = max(1, GROUP_NUMEL * count // experts)
    size = max(d for d in range(1, min(size, count) + 1) if count % d == 0)
    return Groups(routed, size) if size < count else None


def without_experts(piece: Any, groups: Groups) -> Any:
    """The piece without its routed experts' tensors (on either side)."""
    theirs = {n for names in groups.experts.torch.values() for n in names}
    mine = set(groups.experts.ms.values())
    return replace(piece, torch={k: v for k, v in piece.torch.items() if v not in theirs},
                   ms={k: v for k, v in piece.ms.items() if v not in mine})


def group_numel(groups: Groups, source: Any) -> int:
    """The parameters of one group (PyTorch's side)."""
    total = sum(source.tensors[n].numel for names in groups.experts.torch.values()
                for n in names)
    return total // groups.experts.count * groups.size


@dataclass
class _Seen:
    """One call of the routed experts: the tokens ``[N, H]``, the router's expert indices
    and weights ``[N, k]``."""

    tokens: np.ndarray
    index: np.ndarray
    weights: np.ndarray


@dataclass
class _Book:
    """Every pass's call of the routed experts (step 1) and its routed sum (step 2), by
    ``(side, dtype, call)``."""

    replay: bool = False
    #: the block, to name it
    block: str = ""
    seen: dict[tuple[str, str, int], _Seen] = field(default_factory=dict)
    routed: dict[tuple[str, str, int], np.ndarray] = field(default_factory=dict)

    def check(self, key: tuple[str, str, int], tokens: np.ndarray) -> None:
        seen = self.seen.get(key)
        if seen is None or seen.tokens.shape != tokens.shape or not np.array_equal(
                seen.tokens, tokens, equal_nan=True):
            raise ParityError(f"block {self.block}: {key[0]}'s routed experts were given other "
                              "tokens when the "
                              "layer ran again (its forward is not deterministic here), so "
                              "they cannot run a group at a time; verify with --mode whole "
                              "where it fits")


_STANDIN: Any = None


def _torch_standin_class() -> Any:
    """A PyTorch module standing in for transformers' routed experts (``forward(hidden
    [N, H], top_k_index, top_k_weights)``), one per network: in step 1 it keeps its
    calls in the book and returns zeros; in step 3 it returns each call's routed sum."""
    global _STANDIN
    if _STANDIN is None:
        import torch

        class RoutedStandIn(torch.nn.Module):
            def __init__(self, book: _Book) -> None:
                super().__init__()
                self.book = book
                self.calls: dict[str, int] = {}

            def forward(self, hidden: Any, index: Any, weights: Any) -> Any:
                dtype = str(hidden.dtype)
                n = self.calls.get(dtype, 0)
                self.calls[dtype] = n + 1
                key = ("PyTorch", dtype, n)
                tokens = hidden.detach().numpy()
                if self.book.replay:
                    self.book.check(key, tokens)
                    return torch.from_numpy(self.book.routed[key]).to(hidden.dtype)
                self.book.seen[key] = _Seen(tokens.copy(), index.detach().numpy().copy(),
                                            weights.detach().numpy().copy())
                return torch.zeros_like(hidden)

        _STANDIN = RoutedStandIn
    return _STANDIN


class _RoutedBlocks:
    """The family's blocks with the piece's routed experts stood in for (steps 1 and 3):
    the five methods :func:`~ms_port.check.blocks._whole_piece` calls."""

    def __init__(self, blocks: Any, book: _Book, tokens: int) -> None:
        self.blocks, self.book, self.tokens = blocks, book, tokens
        #: transformers' experts module as the small network holds it (meta), the template
        #: of each group's
        self.template: Any = None
        self._standin: Any = None
        self._ms_calls = 0

    def torch_network(self, piece: Any, tensors: dict[str, Any]) -> Any:
        model = self.blocks.torch_network(piece, tensors)
        self.template = self.blocks.torch_experts(model, piece,
                                                  _torch_standin_class()(self.book))
        return model

    def torch_step(self, model: Any, piece: Any, state: Any, ids: np.ndarray) -> Any:
        return self.blocks.torch_step(model, piece, state, ids)

    def ms_network(self, piece: Any, tensors: dict[str, Any]) -> Any:
        cell, self._standin = self.blocks.ms_routed(piece, tensors, self.tokens)
        self._ms_calls = 0
        return cell

    def ms_step(self, cell: Any, piece: Any, state: Any, ids: np.ndarray) -> Any:
        import mindspore as ms

        standin, key = self._standin, ("MindSpore", "float32", self._ms_calls)
        self._ms_calls += 1
        shape = tuple(standin.routed.shape)
        routed = self.book.routed[key] if self.book.replay else np.zeros(shape, np.float32)
        standin.routed.set_data(ms.Tensor(routed.reshape(shape).astype(np.float32)))
        out = self.blocks.ms_step(cell, piece, state, ids)
        tokens = standin.tokens.asnumpy().reshape(self.tokens, -1)
        if self.book.replay:
            self.book.check(key, tokens)
        else:
            k = standin.index.shape[-1]
            self.book.seen[key] = _Seen(tokens.copy(),
                                        standin.index.asnumpy().reshape(self.tokens, k).copy(),
                                        standin.probs.asnumpy().reshape(self.tokens, k).copy())
        return out


def run_routed(state: Any, piece: Any, groups: Groups, whole: Callable[[Any, Any], Any]
               ) -> tuple[Any, list[LayerComparison]]:
    """The block with its routed experts a group at a time (module docstring): its
    recorded passes, as ``whole(state, piece)`` (:func:`~ms_port.check.blocks.
    _whole_piece`, lent by the caller) gives them, and each group's worst expert
    compared."""
    sub = without_experts(piece, groups)
    book = _Book(block=piece.name)
    tokens = int(np.asarray(state.ids).size)
    proxy = _RoutedBlocks(state.blocks, book, tokens)
    streams = replace(state.streams)
    whole(replace(state, blocks=proxy, streams=streams), sub)  # step 1
    del streams
    if state.arena is not None:  # the groups' arrays are their own: no slab beside them
        state.arena.release()
    compared = _run_groups(state, piece, groups, proxy.template, book)
    book.replay = True
    recorded = whole(replace(state, blocks=proxy), sub)  # step 3
    return recorded, compared


def _torch_group(state: Any, groups: Groups, first: int, dtype: Any) -> dict[str, Any]:
    """The group's PyTorch tensors in the network's stacked layout (local attribute ->
    ``[size, ...]`` tensor), read from the source: rows of a stacked tensor, or each
    expert's tensors joined as transformers stacks them."""
    import torch

    size, count = groups.size, groups.experts.count
    out = {}
    for local, names in groups.experts.torch.items():
        attr = local.rpartition(".")[2]
        if len(names) == 1:  # stacked in the file: its rows are the experts
            with state.timer("read"):
                array = steps_read(state, state.source, names[0], "PyTorch", dtype,
                                   (first, first + size))
        else:
            per = len(names) // count
            with state.timer("read"):
                experts = [np.concatenate([steps_read(state, state.source, n, "PyTorch",
                                                      dtype, None)
                                           for n in names[e * per:(e + 1) * per]])
                           for e in range(first, first + size)]
            array = np.stack(experts)
            del experts
        out[attr] = torch.from_numpy(np.ascontiguousarray(array))
    return out


def steps_read(state: Any, source: Any, name: str, side: str, dtype: Any,
               rows: tuple[int, int] | None) -> np.ndarray:
    """One tensor (or its rows) in ``dtype``, NaN/Inf counted in float32 (as the blocks'
    reads count them)."""
    info = source.tensors.get(name)
    if info is None:
        raise ParityError(f"{source.path}: no tensor {shown(name)}, which the block needs; "
                          "convert again", path=source.path)
    array = np.asarray(info.load() if rows is None else info.load_rows(*rows))
    if array.dtype != dtype:
        array = array.astype(dtype)
    if dtype == np.float32:
        state.nonfinite.add(side, name, array, rows)
    return array


def _ms_group(state: Any, groups: Groups, first: int) -> dict[str, np.ndarray]:
    """The group's MindSpore tensors (``weight1`` / ``weight2`` -> their rows), float32."""
    out = {}
    for local, name in groups.experts.ms.items():
        info = state.checkpoint.tensors.get(name)
        if info is None or not info.shape or info.shape[0] % groups.experts.count:
            raise ParityError(f"{state.checkpoint.path}: {shown(name)} does not hold "
                              f"{groups.experts.count} experts' rows; convert again",
                              path=state.checkpoint.path)
        per = info.shape[0] // groups.experts.count
        with state.timer("read"):
            out[local.rpartition(".")[2]] = steps_read(
                state, state.checkpoint, name, "MindSpore", np.float32,
                (first * per, (first + groups.size) * per))
    return out


def _small(template: Any, tensors: dict[str, Any], size: int) -> Any:
    """transformers' experts module (a copy of the network's, on the meta device) holding
    ``size`` experts: the group's tensors."""
    import torch

    module = copy.deepcopy(template)
    module.num_experts = size
    for attr, tensor in tensors.items():
        setattr(module, attr, torch.nn.Parameter(tensor, requires_grad=False))
    return module


def _masked_torch(seen: _Seen, first: int, size: int) -> tuple[Any, Any, Any]:
    """A call's tokens, indices and weights for a group: an index outside it is the
    experts module's own sentinel (``size``: skipped)."""
    import torch

    inside = (seen.index >= first) & (seen.index < first + size)
    index = np.where(inside, seen.index - first, size)
    return (torch.from_numpy(seen.tokens), torch.from_numpy(index.astype(np.int64)),
            torch.from_numpy(seen.weights))


def _masked_ms(seen: _Seen, first: int, size: int) -> tuple[np.ndarray, ...]:
    """A call's tokens, coefficients and indices for a group on MindSpore: an index
    outside it goes to the group's first expert with weight 0."""
    inside = (seen.index >= first) & (seen.index < first + size)
    return (seen.tokens.astype(np.float32), np.where(inside, seen.weights, 0).astype(np.float32),
            np.where(inside, seen.index - first, 0).astype(np.int32))


def _each_ms_rows(seen: _Seen, size: int) -> list[tuple[np.ndarray, ...]]:
    """Each of a group's experts on every token of ``seen`` (weight 1), as rows of one
    MindSpore call."""
    n, k = seen.index.shape
    weights = np.zeros((n, k), np.float32)
    weights[:, 0] = 1
    return [(seen.tokens.astype(np.float32), weights, np.full((n, k), e, np.int32))
            for e in range(size)]


def _ms_call(cell: Any, parts: list[tuple[np.ndarray, ...]]) -> list[np.ndarray]:
    """MindSpore's experts on every part's tokens in one call (their rows one after
    another: the experts act on each token alone), each part's output back."""
    import mindspore as ms

    tokens, weights, index = (np.concatenate([p[i] for p in parts]) for i in range(3))
    m, k = index.shape
    out = cell(ms.Tensor(tokens.reshape(1, m, -1)), ms.Tensor(weights.reshape(1, m, k)),
               ms.Tensor(index.reshape(1, m, k))).asnumpy().reshape(m, -1)
    edges = np.cumsum([0] + [len(p[0]) for p in parts])
    return [out[a:b] for a, b in zip(edges[:-1], edges[1:])]


@dataclass
class _Experts:
    """Each expert of a group on every token of PyTorch's input: PyTorch float32, second
    input, float64; MindSpore."""

    main: list[np.ndarray] = field(default_factory=list)
    second: list[np.ndarray] = field(default_factory=list)
    wide: list[np.ndarray] = field(default_factory=list)
    mind: list[np.ndarray] = field(default_factory=list)


def _each_torch(module: Any, seen: _Seen, size: int, dtype: Any) -> list[np.ndarray]:
    """Each of the group's experts on every token of ``seen`` (weight 1)."""
    import torch

    tokens = torch.from_numpy(seen.tokens.astype(dtype))
    n = tokens.shape[0]
    ones = torch.ones((n, 1), dtype=tokens.dtype)
    with torch.no_grad():
        return [module(tokens, torch.full((n, 1), e, dtype=torch.int64), ones).numpy()
                for e in range(size)]


@dataclass
class _GroupRun:
    """What every group of one layer shares: the run, the experts, transformers'
    experts module (the template), the calls kept in step 1 and their routed sums so far,
    PyTorch's main and second-input calls (each expert runs on their tokens)."""

    state: Any
    groups: Groups
    template: Any
    book: _Book
    routed: dict[tuple[str, str, int], np.ndarray]
    main: _Seen
    second: _Seen


def _run_groups(state: Any, piece: Any, groups: Groups, template: Any, book: _Book
                ) -> list[LayerComparison]:
    """Step 2: every group on every pass's call, its share added to the pass's routed
    sum; each group's experts compared. Returns each group's worst expert."""
    import torch

    if template is None:
        raise ParityError(f"block {piece.name}: transformers' network has no routed experts "
                          "where the family says; the family's blocks do not fit it")
    main = book.seen.get(("PyTorch", str(torch.float32), 0))
    second = book.seen.get(("PyTorch", str(torch.float32), 1))
    if main is None or second is None:
        raise ParityError(f"block {piece.name}: the routed experts were not called on "
                          "PyTorch's side; the family's blocks do not fit transformers' "
                          "network")
    routed = {key: np.zeros_like(seen.tokens, dtype=np.float32 if key[0] == "MindSpore"
                                 else seen.tokens.dtype) for key, seen in book.seen.items()}
    run = _GroupRun(state, groups, template, book, routed, main, second)
    compared = []
    for first in groups.starts:
        state.run.step(f"{piece.name}: experts {first}-{first + groups.size - 1} of "
                       f"{groups.experts.count}")
        each = _Experts()
        _torch_pass(run, each, first, np.float32)
        if state.run.noise_floor:
            _torch_pass(run, each, first, np.float64)
        _ms_pass(run, each, first)
        compared.append(_worst(state, piece, groups, first, each))
    book.routed = routed
    return compared


def _torch_pass(run: _GroupRun, each: _Experts, first: int, dtype: Any) -> None:
    """One precision's PyTorch group: its share of each of that precision's calls, and
    each expert on PyTorch's input (float32: and on the second one)."""
    import torch

    state, size = run.state, run.groups.size
    with state.timer("build"):
        module = _small(run.template, _torch_group(state, run.groups, first, dtype), size)
    wanted = str(torch.float32 if dtype == np.float32 else torch.float64)
    with state.timer("torch"), torch.no_grad():
        for key, seen in run.book.seen.items():
            if key[0] == "PyTorch" and key[1] == wanted:
                run.routed[key] += module(*_masked_torch(seen, first, size)).numpy()
        if dtype == np.float32:
            each.main = _each_torch(module, run.main, size, np.float32)
            each.second = _each_torch(module, run.second, size, np.float32)
        else:
            each.wide = _each_torch(module, run.main, size, np.float64)
    del module
    gc.collect()


def _ms_pass(run: _GroupRun, each: _Experts, first: int) -> None:
    """MindSpore's group in one call: its share of every MindSpore call, and each expert
    on PyTorch's input (rows one after another)."""
    state, size = run.state, run.groups.size
    arrays = _ms_group(state, run.groups, first)
    state.handed.watch(arrays.values())
    with state.timer("build"):
        cell = state.blocks.ms_group(size, arrays)
    del arrays
    with state.timer("mindspore"):
        keys = [key for key in run.book.seen if key[0] == "MindSpore"]
        outs = _ms_call(cell, [_masked_ms(run.book.seen[key], first, size) for key in keys]
                        + _each_ms_rows(run.main, size))
        for key, out in zip(keys, outs):
            run.routed[key] += out.reshape(run.routed[key].shape)
        each.mind = outs[len(keys):]
    del cell
    state.handed.hand_back()  # a compiled group keeps them until it runs again
    gc.collect()
    release_ms_pool()


def _worst(state: Any, piece: Any, groups: Groups, first: int, each: _Experts
           ) -> LayerComparison:
    """The group's expert furthest past (or nearest to) its bound, as a comparison."""
    found = []
    tol = state.run.tol
    for e in range(groups.size):
        ref, mine = each.main[e], each.mind[e]
        error, max_abs = relative_error(mine, ref)
        noise = distance(ref, each.wide[e], "float64") if each.wide else None
        bound = bound_for(tol, noise, scaled=True)
        sensitivity = distance(ref, each.second[e], "recorded") if each.second else None
        status = status_of(error, bound, sensitivity)
        found.append((status not in ("ok",), error / bound if bound else error, e, error,
                      max_abs, noise, bound, sensitivity, status, ref.shape))
    _, _, e, error, max_abs, noise, bound, sensitivity, status, shape = max(
        found, key=lambda f: (f[0], f[1]))
    expert, last = first + e, first + groups.size - 1
    routed = groups.experts
    return LayerComparison(
        index=0, ms=f"{routed.ms_layer}.mlp.experts", torch=f"{routed.torch_layer}.mlp.experts."
        f"{expert}", call=0, ms_kind="routed expert", torch_kind="routed expert",
        paired_by="expert", shape=tuple(shape), error=error, max_abs=max_abs, noise=noise,
        bound=bound, sensitivity=sensitivity, status=status, leaf=False,
        note=f"expert {expert}, the worst of experts {first}-{last}: each run on every token "
             "of PyTorch's input to the layer's experts, on both sides")


__all__ = ["EXPERTS_PER_GROUP", "GROUP_NUMEL", "Groups", "group_numel",
           "plan_groups", "run_routed", "without_experts"]

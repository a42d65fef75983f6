"""Stage 5 of matching, by structure: the layer pairs alignment finds
(:mod:`ms_port.match.align`) turned into matches, loose tensors paired by shape and name,
and zero biases a bias-less MindSpore layer can do without."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..read.sources import Source
from ..read.targets import Target
from ..read.tensors import FLOAT_DTYPES, TensorInfo, format_shape
from .closest import shared_words
from .entries import Candidate, Dropped, Match, Planning, cast_dtype, fit
from .layouts import Layout, LayoutError
from .rules import PART_BIAS, is_layer_param, known_drop
from .transforms import Transform


def align_leftovers(state: Planning) -> dict[str, tuple[str, ...]]:
    """Stage 5: fill unambiguous layer pairs by structure; the ambiguous targets' candidates."""
    from .align import align, unit_of
    from .reorder import reorder

    source, target, mapping, dtype = state.source, state.target, state.mapping, state.dtype
    matches, used, dropped, notes = state.matches, state.used, state.dropped, state.notes
    conflicted, proposals = state.conflicted(), state.proposals

    gone = used | {d.name for d in dropped}
    # an integer tensor is a buffer (an index, a counter), never a layer's weight
    pending_s = [(i.name, i.shape) for i in source if i.name not in gone
                 and i.dtype in FLOAT_DTYPES]
    # the target's structure is where the network holds each tensor, not its name
    where = {n: t.path or n for n, t in target.tensors.items()}
    name_of = {p: n for n, p in where.items()}
    pending_t = [(where[n], t.shape) for n, t in target.tensors.items()
                 if n not in matches and n not in conflicted and n not in proposals
                 and mapping.declared_value(n) is None  # a declared value is the user's word
                 and (t.constant is None or is_layer_param(n))]  # the network's own
    if not pending_s or not pending_t:
        return {}
    kinds = {where[n].rpartition(".")[0]: t.lineage or ((t.layer,) if t.layer else None)
             for n, t in target.tensors.items()}
    # a table that declares fused layouts (interleaved, grouped by KV head) owns them
    splits = not (mapping.fuse or mapping.split)
    paired = [(where[m.target], m.source) for m in matches.values()]
    result = align(pending_s, pending_t, ([(i.name, i.shape) for i in source],
                                          [(where[n], t.shape)
                                           for n, t in target.tensors.items()]),
                   paired, kinds, splits=splits)
    reorder(result, [(unit_of(t), unit_of(s)) for t, s in paired if s], splits=splits)
    notes.extend(result.notes)
    for pair in result.pairs:
        made = _pair_matches(pair, source, target, name_of, dtype, notes)
        for m in made or ():
            matches[m.target] = m
            used.update(m.sources)
    for m in loose_pairs(source, target, matches, used | {d.name for d in dropped},
                          pending_t, dtype):
        matches[m.target] = m
        used.add(m.source)
    return {name_of[t]: c for t, c in result.ambiguous.items() if name_of[t] not in matches}


def _pair_matches(pair: Any, source: Source, target: Target, name_of: dict[str, str],
                  dtype: str | None, notes: list[str]) -> list[Match] | None:
    """The matches an aligned layer pair makes, every tensor of the target layers filled
    (else ``None``, with a note): one to one, or through the rows of a layer split into
    several (or several fused into one)."""
    targets, sources = pair.targets or (pair.target,), pair.sources or (pair.source,)
    rule = targets[0].rule
    lone = all(len(x.names) == 1 for x in (*targets, *sources)) and not rule
    if (len(targets) == len(sources) == 1 and not rule and len(targets[0].names) == 1
            and set(sources[0].names) == {"weight", "bias"}):
        lone, sources = True, (_weight_only(sources[0]),)  # its bias is judged alone
    made = []
    for k, layer in enumerate(targets):
        for suffix, held_at in layer.names.items():
            name = name_of[held_at]
            torch_suffix = rule.params.get(suffix, suffix) if rule else suffix
            if len(targets) > 1 and not lone and torch_suffix not in sources[0].names:
                # a part's bias the fused source keeps apart (q_bias beside qkv.weight)
                apart = _part_bias(sources[0], layer, source, (name, target.tensors[name]),
                                   pair, dtype)
                if apart is not None:
                    made.append(apart)
                continue
            infos = [source.tensors[next(iter(s.names.values())) if lone
                                    else s.names[torch_suffix]] for s in sources]
            tt = target.tensors[name]
            declared = rule.transforms.get(suffix, ()) if rule else ()
            if len(targets) > 1:  # one source's rows, split
                sizes = tuple(x.params[suffix][0] for x in targets)
                layout = Layout("concat", 0, 1, sizes)
                part = layout.part_shape(infos[0].shape, k)
                fitted = fit(part, tt, declared)
                m = Match(name, infos[0].name, "aligned", pair.evidence, infos[0].shape,
                          tt.shape, infos[0].dtype, cast_dtype(infos[0].dtype, dtype),
                          fitted or (), layout=layout, part=k)
            elif len(sources) > 1:  # several sources' rows, fused
                layout = Layout("concat", 0, 1, tuple(i.shape[0] for i in infos))
                try:
                    joined = layout.fused_shape([i.shape for i in infos])
                except LayoutError:
                    joined, fitted = None, None
                else:
                    fitted = fit(joined, tt, declared)
                if len({i.dtype for i in infos}) > 1:
                    fitted = None
                m = Match(name, infos[0].name, "aligned", pair.evidence, joined or (),
                          tt.shape, infos[0].dtype, cast_dtype(infos[0].dtype, dtype),
                          fitted or (), parts=tuple(i.name for i in infos), layout=layout)
            else:
                info = infos[0]
                fitted = fit(info.shape, tt, declared)
                if fitted is None and lone and _squeezed(info.shape) == _squeezed(tt.shape):
                    fitted = (Transform("reshape", list(tt.shape)),)  # size-1 axes only
                m = Match(name, info.name, "aligned", pair.evidence, info.shape, tt.shape,
                          info.dtype, cast_dtype(info.dtype, dtype), fitted or ())
            if fitted is None:
                shown = ", ".join(f"{i.name} ({format_shape(i.shape)})" for i in infos)
                notes.append(f"alignment paired {', '.join(s.path for s in sources)} with "
                             f"{', '.join(x.path for x in targets)} by order and sizes, but "
                             f"{shown} does not fit {name} ({format_shape(tt.shape)}): "
                             "not filled")
                return None
            made.append(m)
    return made


def _part_bias(whole: Any, part: Any, source: Source, held: tuple[str, Any], pair: Any,
               dtype: str | None) -> Match | None:
    """The match of a split layer's bias from the loose tensor beside the fused weight
    named for the part (:data:`~ms_port.match.rules.PART_BIAS`), where it fits."""
    target_name, tt = held
    parent, leaf = whole.path.rpartition(".")[0], part.path.rpartition(".")[2]
    for pattern in PART_BIAS:
        name = f"{parent}.{pattern.format(part=leaf)}" if parent else pattern.format(part=leaf)
        info = source.tensors.get(name)
        if info is None or tuple(info.shape) != tuple(tt.shape):
            continue
        return Match(target_name, info.name, "aligned",
                     f"{pair.evidence}; its bias is {info.name}, kept apart beside the fused "
                     "weight", info.shape, tt.shape, info.dtype, cast_dtype(info.dtype, dtype),
                     ())
    return None


def _weight_only(layer: Any) -> Any:
    from dataclasses import replace

    return replace(layer, params={"weight": layer.params["weight"]},
                   names={"weight": layer.names["weight"]})


def loose_pairs(source: Source, target: Target, matches: dict[str, Match], gone: set[str],
                 pending_t: list[tuple[str, tuple[int, ...]]],
                 dtype: str | None) -> list[Match]:
    """A network's loose tensors — held by a block, not by a layer, and named as no layer
    names its tensors (a ViT's class token and position embedding) — have no layer to
    align by. One still left after
    alignment pairs when its shape is unique among the leftovers on *both* sides and the
    two tensors' own names (not their paths) share a word (``class_token`` / ``cls_token``;
    ``encoder.pos_embedding`` / ``pos_embed``): reported as ``aligned`` with that evidence."""

    from .align import layer_params

    params = layer_params()
    left_t = [(n, shape) for n, shape in pending_t if n not in matches]
    left_s = [i for i in source if i.name not in gone and not known_drop(i.name)]
    by_shape_s: dict[tuple[int, ...], list[TensorInfo]] = {}
    for info in left_s:
        by_shape_s.setdefault(_squeezed(info.shape), []).append(info)
    by_shape_t: dict[tuple[int, ...], list[str]] = {}
    for name, shape in left_t:
        by_shape_t.setdefault(_squeezed(shape), []).append(name)
    made = []
    for shape, names in by_shape_t.items():
        sources = by_shape_s.get(shape, [])
        if len(names) != 1 or len(sources) != 1:
            continue
        name, info = names[0], sources[0]
        if {name.rpartition(".")[2], info.name.rpartition(".")[2]} & params:
            continue  # a layer's tensor: alignment's, by its layer
        shared = shared_words(name, info.name)
        if not shared:
            continue
        tt = target.tensors[name]
        fitted = (() if info.shape == tt.shape  # else equal but for size-1 axes
                  else (Transform("reshape", list(tt.shape)),))
        shapes = (format_shape(tt.shape) if not fitted else
                  f"{format_shape(info.shape)} / {format_shape(tt.shape)} (reshaped)")
        made.append(Match(name, info.name, "aligned", (
            f"aligned loose tensor {info.name} -> {name}: the only unpaired tensor of its "
            f"shape on either side ({shapes}, size-1 axes aside); the names share "
            f"{', '.join(repr(w) for w in shared)}"), info.shape, tt.shape, info.dtype,
            cast_dtype(info.dtype, dtype), fitted))
    return made


def leftover_copies(pending: list[TensorInfo], matches: dict[str, Match], source: Source,
                    dropped: list[Dropped]) -> list[TensorInfo]:
    """Source tensors nothing took that hold exactly what a tensor that was taken holds,
    under a name that ends the same way (:mod:`ms_port.match.copies`), dropped as what
    they are; and integer buffers (an index, a counter: what a network computes, never a
    trained weight) that nothing took. The rest is returned."""
    from .copies import shared_copies

    used = {s for m in matches.values() for s in m.sources}
    floats = [i for i in pending if i.dtype in FLOAT_DTYPES]
    copies = dict(shared_copies(floats, [i for i in source if i.name in used]))
    kept = []
    for info in pending:
        original = copies.get(info)
        if original is not None:
            dropped.append(Dropped(info.name, f"tied: holds exactly what {original.name} "
                                              "holds (one tensor under a second name: a module "
                                              "reached by two paths); MindSpore holds it once"))
        elif info.dtype not in FLOAT_DTYPES:
            dropped.append(Dropped(info.name, "an integer buffer (an index or a counter the "
                                              "network computes), not a weight: the MindSpore "
                                              "network computes its own"))
        else:
            kept.append(info)
    return kept


def zero_biases(pending: list[TensorInfo], matches: dict[str, Match], target: Target,
                dropped: list[Dropped]) -> list[TensorInfo]:
    """A bias whose layer's weight was matched into a MindSpore layer without a bias (MindCV's
    VGG convs): dropped when every value is zero (the layer computes the same without it),
    else kept as a leftover (:mod:`ms_port.match.differences` names the difference)."""
    layer_of = {m.source.rpartition(".")[0]: m.target.rpartition(".")[0]
                for m in matches.values()
                if m.source and not m.parts and m.part is None
                and m.source.rpartition(".")[2] == "weight"}
    kept = []
    for info in pending:
        path, _, leaf = info.name.rpartition(".")
        layer = layer_of.get(path)
        if leaf != "bias" or layer is None or any(
                f"{layer}.{b}" in target for b in ("bias", "beta")):
            kept.append(info)
            continue
        if not np.any(np.asarray(info.load()) != 0):
            dropped.append(Dropped(info.name, f"zero bias: {layer} has no bias, and this one "
                                              "is all zeros (the layer computes the same)"))
            continue
        kept.append(info)  # a difference of the networks (match.differences) says so
    return kept


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def aligned_candidates(source: Source, layers: tuple[str, ...]) -> tuple[Candidate, ...]:
    prefixes = tuple(f"{p}." for p in layers)
    return tuple(Candidate(i.name, i.shape) for i in source
                 if i.name.startswith(prefixes))[:6]


__all__ = ["align_leftovers", "aligned_candidates", "loose_pairs", "zero_biases"]

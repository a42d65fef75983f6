"""Stage 5 of matching, by structure: the layer pairs alignment finds
(:mod:`ms_port.match.align`) turned into matches, loose tensors paired by shape and name,
and zero biases a bias-less MindSpore layer can do without."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..read.sources import Source
from ..read.targets import Target
from ..read.tensors import TensorInfo, format_shape
from .entries import Candidate, Dropped, Match, cast_dtype, fit
from .mapping import MappingTable
from .rules import known_drop
from .transforms import Transform


def align_leftovers(source: Source, target: Target, mapping: MappingTable,
                     matches: dict[str, Match], used: set[str], conflicted: set[str],
                     proposals: dict[str, Any], dropped: list[Dropped],
                     layer_of: dict[str, Any], dtype: str | None,
                     notes: list[str]) -> dict[str, tuple[str, ...]]:
    """Stage 5: fill unambiguous layer pairs by structure; the ambiguous targets' candidates."""
    from .align import align

    gone = used | {d.name for d in dropped}
    pending_s = [(i.name, i.shape) for i in source if i.name not in gone]
    pending_t = [(t.name, t.shape) for n, t in target.tensors.items()
                 if n not in matches and n not in conflicted and n not in proposals
                 and mapping.declared_value(n) is None]  # a declared value is the user's word
    if not pending_s or not pending_t:
        return {}
    result = align(pending_s, pending_t, list(source.tensors), list(target.tensors),
                   [(m.target, m.source) for m in matches.values()], layer_of)
    notes.extend(result.notes)
    for pair in result.pairs:
        rule = pair.target.rule
        made = []
        lone = len(pair.target.names) == 1 == len(pair.source.names) and not rule
        for suffix, name in pair.target.names.items():
            torch_suffix = rule.params.get(suffix, suffix) if rule else suffix
            info = source.tensors[next(iter(pair.source.names.values())) if lone
                                  else pair.source.names[torch_suffix]]
            tt = target.tensors[name]
            fitted = fit(info.shape, tt, rule.transforms.get(suffix, ()) if rule else ())
            if fitted is None and lone and _squeezed(info.shape) == _squeezed(tt.shape):
                fitted = (Transform("reshape", list(tt.shape)),)  # size-1 axes only
            if fitted is None:
                notes.append(f"alignment paired {pair.source.path} with {pair.target.path} by "
                             f"order and sizes, but {info.name} "
                             f"({format_shape(info.shape)}) does not fit {name} "
                             f"({format_shape(tt.shape)}): not filled")
                break
            made.append(Match(name, info.name, "aligned", pair.evidence, info.shape,
                              tt.shape, info.dtype, cast_dtype(info.dtype, dtype), fitted))
        else:
            for m in made:
                matches[m.target] = m
                used.add(m.source)
    for m in loose_pairs(source, target, matches, used | {d.name for d in dropped},
                          pending_t, dtype):
        matches[m.target] = m
        used.add(m.source)
    return {t: c for t, c in result.ambiguous.items() if t not in matches}


def _layer_params() -> frozenset[str]:
    """What layers call their tensors, on either side (a loose tensor is named otherwise):
    every name the layer rules and the alignment's source aliases know."""
    from .align import SOURCE_ALIASES
    from .rules import RULES

    return frozenset({n for rule in RULES for pair in rule.params.items() for n in pair}
                     | set(SOURCE_ALIASES) | {"weight", "bias"})


def loose_pairs(source: Source, target: Target, matches: dict[str, Match], gone: set[str],
                 pending_t: list[tuple[str, tuple[int, ...]]],
                 dtype: str | None) -> list[Match]:
    """A network's loose tensors — held by a block, not by a layer, and named as no layer
    names its tensors (a ViT's class token and position embedding) — have no layer to
    align by. One still left after
    alignment pairs when its shape is unique among the leftovers on *both* sides and the
    two tensors' own names (not their paths) share a word (``class_token`` / ``cls_token``;
    ``encoder.pos_embedding`` / ``pos_embed``): reported as ``aligned`` with that evidence."""
    from .closest import _tokens

    layer_params = _layer_params()
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
        if {name.rpartition(".")[2], info.name.rpartition(".")[2]} & layer_params:
            continue  # a layer's tensor: alignment's, by its layer
        # a word of the tensors' own names, not of their paths (`blocks`, `attn`)
        words = {w for w in _tokens(name.rpartition(".")[2].lower()) if not w.isdigit()}
        theirs = _tokens(info.name.rpartition(".")[2].lower())
        shared = sorted({a for a in words for b in theirs
                         if len(min(a, b, key=len)) >= 3 and (a.startswith(b) or
                                                              b.startswith(a))})
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


def zero_biases(pending: list[TensorInfo], matches: dict[str, Match], target: Target,
                 dropped: list[Dropped], notes: list[str]) -> list[TensorInfo]:
    """A bias whose layer's weight was matched into a MindSpore layer without a bias (MindCV's
    VGG convs): dropped when every value is zero (the layer computes the same without it),
    else kept as a leftover with a note that the networks differ."""
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
        kept.append(info)
        notes.append(f"{info.name} holds nonzero values, but {layer} has no bias: the "
                     "networks differ — give the MindSpore layer a bias (has_bias=True)")
    return kept


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def aligned_candidates(source: Source, layers: tuple[str, ...]) -> tuple[Candidate, ...]:
    prefixes = tuple(f"{p}." for p in layers)
    return tuple(Candidate(i.name, i.shape) for i in source
                 if i.name.startswith(prefixes))[:6]


__all__ = ["align_leftovers", "aligned_candidates", "loose_pairs", "zero_biases"]

"""Matching: rules propose, the target disposes. The result is a :class:`Plan`.

For every source tensor, candidates are proposed in order of trust and the first that
exists in the target is taken:

1. an explicit ``tensors:`` entry of the mapping table;
2. the exact name;
3. the name after the mapping table's segment/regex renames;
4. the built-in layer rules (:mod:`ms_port.match.rules`) on that name.

A proposal becomes a match only if the shapes agree, directly or after a declared
transform. Two sources claiming one target, or a proposal whose shape does not fit,
are conflicts. Shape/order fallback runs only when asked and is flagged. Nothing is
written here: the Plan says what would be.
"""

from __future__ import annotations

import collections
import difflib
from dataclasses import dataclass
from typing import Any

from ..errors import MappingError
from ..read.sources import Skipped, Source
from ..read.targets import Target, TargetTensor
from ..read.tensors import FLOAT_DTYPES, TensorInfo, format_shape
from .closest import NameIndex
from .constants import checked as checked_constants
from .differences import find as differences
from .entries import (
    Candidate,
    Conflict,
    Dropped,
    Match,
    Missing,
    Planning,
    Unused,
    cast_dtype,
    fit,
    shape_or_none,
)
from .many import Many
from .mapping import MappingTable
from .result import Plan
from .rules import NETWORK, initial_value, is_layer_param, known_drop, propose
from .structure import align_leftovers, aligned_candidates, leftover_copies, zero_biases
from .transforms import Transform


def _renaming(mapping: MappingTable, name: str) -> tuple[str | None, str | None]:
    """(the name the mapping's renames produce, the entry) — or (None, None)."""
    new, fired = mapping.rename(name)
    return (new, "; ".join(fired)) if new != name else (None, None)


#: leftovers per side that get "did you mean" suggestions: reports show far fewer, and
#: 100,000 unmatched names must not cost minutes of scoring
SUGGESTED = 2000


def _skipped_by_name(source: Source, mapping: MappingTable) -> dict[str, Skipped]:
    """The source's skipped entries under the names they would have had as tensors: as
    read, with the wrapper prefixes the tensors lost, and after the mapping's renames."""
    prefix = "".join(source.stripped)
    found: dict[str, Skipped] = {}
    for s in source.skipped:
        name = s.name.removeprefix(prefix)
        for key in (s.name, name, mapping.rename(name)[0]):
            found.setdefault(key, s)
    return found


def _closest(index: NameIndex, name: str, shape: tuple[int, ...]) -> tuple[Candidate, ...]:
    return tuple(Candidate(n, s) for n, s in index.closest(name, shape))


@dataclass(frozen=True)
class PlanOptions:
    """How strictly :func:`make_plan` matches, and what it casts to.

    Attributes:
        allow_missing / allow_unused: accept leftovers (they are still reported).
        allow_shape_match: fill leftovers by equal shape in order; flagged ``fallback``.
        dtype: cast floating-point tensors to this dtype (``float16``, ``bfloat16``,
            ``float32``); integer and bool tensors keep theirs.
        align: pair the layers names leave unpaired by structure (order, kinds, shapes;
            :mod:`ms_port.match.align`); only unambiguous pairs fill, as ``aligned``.
    """

    allow_missing: bool = False
    allow_unused: bool = False
    allow_shape_match: bool = False
    dtype: str | None = None
    align: bool = True


#: leftovers on both sides accepted (a comparison's plan, not a conversion's)
LENIENT = PlanOptions(allow_missing=True, allow_unused=True)


def make_plan(
    source: Source,
    target: Target,
    mapping: MappingTable | None = None,
    *,
    options: PlanOptions | None = None,
    config: dict[str, Any] | None = None,
) -> Plan:
    """Match every target tensor to a source tensor (see the module docstring).

    Args:
        source: what the PyTorch checkpoint holds.
        target: what the MindSpore side expects.
        mapping: the mapping table(s) to apply on top of the built-in rules.
        options: strictness, cast and alignment (:class:`PlanOptions`; default: strict,
            no cast, aligned).
        config: the model's config (``config.json``), for tables that take numbers from
            it (fused layouts, tied tensors); defaults to the source's own.

    Returns:
        The :class:`Plan`; check ``plan.ok`` — this function never raises for
        leftovers, only for a mapping table that names tensors that do not exist.
    """
    options = options or PlanOptions()
    allow_missing, allow_unused = options.allow_missing, options.allow_unused
    allow_shape_match, dtype, align = options.allow_shape_match, options.dtype, options.align
    mapping = mapping or MappingTable.empty()
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise ValueError(f"cannot cast to {dtype!r}; choose one of {sorted(FLOAT_DTYPES)}")
    _check_explicit(mapping, source, target)

    config = config if config is not None else source.config
    many = Many(source, target, mapping, config, dtype)
    many.run()
    proposals, dropped, fan_out = _propose(source, target, mapping, many)
    state = Planning(source, target, mapping, dtype, proposals=proposals,
                     matches=dict(many.matches), used=set(many.consumed),
                     conflicts=list(fan_out), dropped=dropped)
    _accept(state)
    ambiguous = align_leftovers(state) if align else {}
    _initialise(state)
    conflicted = state.conflicted()
    pending_t = [tt for name, tt in target.tensors.items()
                 if name not in state.matches and name not in conflicted]
    dropped_names = {d.name for d in dropped}
    pending_s = [i for i in source if i.name not in state.used and i.name not in dropped_names]
    if allow_shape_match:
        pending_t, pending_s = _by_shape(state, pending_t, pending_s)
    pending_s = _known_drops(state, pending_s)
    pending_s, constants_differ = checked_constants(state, pending_s)
    plan = Plan(source, target, mapping,
                [state.matches[name] for name in target.tensors if name in state.matches],
                *_leftovers(state, pending_t, pending_s, ambiguous), dropped, state.conflicts,
                allow_missing=allow_missing, allow_unused=allow_unused,
                notes=list(target.notes) + many.notes + state.notes, params=many.params)
    plan.differences = differences(plan, constants_differ)
    return plan


def _accept(state: Planning) -> None:
    """The name stages' proposals: one claim fills its target once its shape fits (through
    the declared transforms, which are applied or the pair refused); several claims on one
    target are a conflict."""
    source, mapping = state.source, state.mapping
    for t, props in state.proposals.items():
        tt = state.target.tensors[t]
        if len(props) > 1:
            srcs = tuple(p[0] for p in props)
            state.conflicts.append(Conflict("claim", (t,), srcs,
                                            f"{len(srcs)} source tensors claim {t!r}: "
                                            f"{', '.join(map(repr, srcs))}; add a tensors: "
                                            "entry to pick one and drop: the others"))
            state.used.update(srcs)
            continue
        (s, how, detail, tfs) = props[0]
        state.used.add(s)
        info = source.tensors[s]
        # transforms a mapping file declares are applied, or the pair refused: never
        # skipped because the shapes happen to agree (a square weight to transpose)
        declared = (tfs if how == "mapping" else ()) or mapping.transforms_for(t)
        fitted = _declared_fit(info.shape, tt, declared) if declared else \
            fit(info.shape, tt, tfs)
        if fitted is None:
            made = shape_or_none(declared, info.shape) if declared else None
            why = (f"the declared transforms {', '.join(map(str, declared))} make it "
                   f"{format_shape(made)}" if made is not None else
                   f"the declared transforms {', '.join(map(str, declared))} do not apply"
                   ) if declared else "declare a transform in your mapping file"
            state.conflicts.append(Conflict(
                "shape", (t,), (s,),
                f"{s!r} ({format_shape(info.shape)}) cannot fill {t!r} "
                f"({format_shape(tt.shape)}), matched by {how} ({detail}); {why} — fix "
                "the transforms or map another tensor"))
            continue
        state.matches[t] = Match(t, s, how, detail, info.shape, tt.shape, info.dtype,
                                 cast_dtype(info.dtype, state.dtype, tt.dtype), fitted)


def _initialise(state: Planning) -> None:
    """What PyTorch has no counterpart for: a declared value, a rule's initial value, or
    the network's own constant; never a silent default."""
    layer_of = state.target.layers()
    conflicted = state.conflicted()
    for name, tt in state.target.tensors.items():
        if name in state.matches or name in conflicted or name in state.proposals:
            continue
        declared = state.mapping.declared_value(name)
        by_rule = initial_value(name, layer_of)
        chosen = declared or (by_rule and (by_rule[0], f"{by_rule[1]}: {by_rule[0]} (PyTorch "
                                                       "has no counterpart)"))
        if not chosen and tt.constant is not None and not is_layer_param(name):
            chosen = (NETWORK, "the network's own value: a constant it computes when it is "
                               "built, not a weight (PyTorch has no such tensor)")
        if chosen:
            state.matches[name] = Match(name, "", "initialised", chosen[1], (), tt.shape,
                                        tt.dtype, cast_dtype(tt.dtype, state.dtype),
                                        init=chosen[0])


def _by_shape(state: Planning, pending_t: list[TargetTensor], pending_s: list[TensorInfo]
              ) -> tuple[list[TargetTensor], list[TensorInfo]]:
    """``--allow-shape-match``: leftovers filled by equal shape, in order (per-shape
    queues: linear, not a scan per target); flagged ``fallback``."""
    by_shape: dict[tuple[int, ...], collections.deque] = collections.defaultdict(
        collections.deque)
    for i in pending_s:
        by_shape[i.shape].append(i)
    taken: set[str] = set()
    still: list[TargetTensor] = []
    for tt in pending_t:
        queue = by_shape.get(tt.shape)
        if not queue:
            still.append(tt)
            continue
        info = queue.popleft()
        taken.add(info.name)
        state.matches[tt.name] = Match(tt.name, info.name, "fallback", "same shape, in order",
                                       info.shape, tt.shape, info.dtype,
                                       cast_dtype(info.dtype, state.dtype))
    return still, [i for i in pending_s if i.name not in taken]


def _known_drops(state: Planning, pending_s: list[TensorInfo]) -> list[TensorInfo]:
    """The source's leftovers less what is known to hold nothing the target needs (a
    known drop, a copy of a used tensor, a zero bias the target lacks)."""
    kept = []
    for info in pending_s:
        reason = known_drop(info.name)
        if reason is None:
            kept.append(info)
        else:
            state.dropped.append(Dropped(info.name, f"known drop: {reason}"))
    return zero_biases(leftover_copies(kept, state.matches, state.source, state.dropped),
                       state.matches, state.target, state.dropped)


def _leftovers(state: Planning, pending_t: list[TargetTensor], pending_s: list[TensorInfo],
               ambiguous: dict[str, tuple[str, ...]]) -> tuple[list[Missing], list[Unused]]:
    """What nothing filled and what nothing used, each with its likeliest counterparts."""
    source, mapping = state.source, state.mapping
    s_index = NameIndex((i.name, i.shape) for i in pending_s)
    t_index = NameIndex((t.name, t.shape) for t in pending_t)
    unusable = _skipped_by_name(source, mapping)
    missing = [Missing(t.name, t.shape, t.dtype,
                       aligned_candidates(source, ambiguous[t.name]) if t.name in ambiguous
                       else _closest(s_index, t.name, t.shape) if k < SUGGESTED else (),
                       skipped=unusable.get(t.name))
               for k, t in enumerate(pending_t)]
    unused = [Unused(i.name, i.shape, i.dtype,
                     _closest(t_index, i.name, i.shape) if k < SUGGESTED else (),
                     *_renaming(mapping, i.name))
              for k, i in enumerate(pending_s)]
    return missing, unused


def _propose(source: Source, target: Target, mapping: MappingTable, many: Many) -> tuple[
        dict[str, list[tuple[str, str, str, tuple[Transform, ...]]]], list[Dropped],
        list[Conflict]]:
    """Stages 1-4 for every source tensor the fused/split stage left: (target -> the
    sources proposed for it, the dropped, the fan-out conflicts)."""
    layer_of, siblings = target.layers(), target.siblings()
    by_path = _ByPath(target)
    proposals: dict[str, list[tuple[str, str, str, tuple[Transform, ...]]]] = {}
    dropped: list[Dropped] = list(many.dropped)
    explicit_sources = {e.source: e for e in mapping.tensors.values() if e.init is None}
    fan_out: list[Conflict] = list(many.conflicts)

    for info in source:
        s = info.name
        if s in many.consumed:
            continue
        if s in explicit_sources:
            e = explicit_sources[s]
            proposals.setdefault(e.target, []).append(
                (s, "mapping", f"tensors entry in {mapping.origin}", e.transforms))
            continue
        pattern = mapping.dropped_by(s)
        if pattern is not None:
            dropped.append(Dropped(s, f"drop: {pattern} ({mapping.origin})"))
            continue
        found = _propose_one(s, mapping, target, layer_of, siblings)
        if not found and by_path.names:
            by_path.found[s] = by_path.propose(info, mapping, target)
            continue
        if len({t for t, *_ in found}) > 1:
            names = tuple(t for t, *_ in found)
            fan_out.append(Conflict("fan-out", names, (s,),
                                    f"source {s!r} could fill {', '.join(map(repr, names))}; "
                                    "add a tensors: entry to say which"))
            continue
        for t, how, detail, tfs in found:
            if t in mapping.tensors or t in many.matches:  # an explicit/fused entry owns it
                continue
            proposals.setdefault(t, []).append((s, how, detail, tfs))
    # by path only where no name claims the tensor (a module two paths reach, timm's and
    # MindCV's CoaT position encoding, is claimed by its name)
    by_target: dict[str, list[tuple[str, str, str, tuple]]] = {}
    for s, found in by_path.found.items():
        if len(found) == 1:
            t, how, detail, tfs = found[0]
            by_target.setdefault(t, []).append((s, how, detail, tfs))
    for t, props in by_target.items():
        if t not in proposals and t not in mapping.tensors and t not in many.matches:
            proposals[t] = props  # two sources by one path: a claim, as by names

    return proposals, dropped, fan_out


def _propose_one(s: str, mapping: MappingTable, target: Target,
                 layer_of: dict[str, tuple[str, ...] | None],
                 siblings: dict[str, frozenset[str]]) -> list[tuple[str, str, str, tuple]]:
    """Proposals for one source name, most trusted first; the first kind that hits wins."""
    by_rule = {p.target: p for p in propose(s, layer_of, siblings)}
    if s in target:
        rule = by_rule.get(s)  # a rule may still declare a layout transform (Conv1d)
        return [(s, "exact", rule.rule if rule else "same name",
                 rule.transforms if rule else ())]
    renamed, fired = mapping.rename(s)
    entries = ", ".join(fired)
    if fired and renamed in target:
        rule = next((p for p in propose(renamed, layer_of, siblings) if p.target == renamed),
                    None)
        return [(renamed, "mapping", f"{entries} ({mapping.origin})",
                 rule.transforms if rule else ())]
    if fired:  # the mapping's rename made the match possible: counted as the mapping's
        return [(p.target, "mapping", f"{entries} ({mapping.origin}), then rule {p.rule}",
                 p.transforms) for p in propose(renamed, layer_of, siblings)]
    return [(p.target, "rule", p.rule, p.transforms) for p in by_rule.values()]


class _ByPath:
    """The target's tensors by where the network holds them, where that is not their
    name (MindCV's SwinV2 and RegNet name ``0.blocks.0.norm1.gamma`` what sits at
    ``layers.0.blocks.0.norm1``): a source name is matched against those paths by the
    same stages as against the names, and the match is made to the name."""

    def __init__(self, target: Target) -> None:
        self.names = {t.path: n for n, t in target.tensors.items() if t.path and t.path != n
                      and t.path not in target.tensors}
        self.layer_of: dict[str, tuple[str, ...] | None] = {}
        siblings: dict[str, set[str]] = {}
        for path, name in self.names.items():
            t = target.tensors[name]
            prefix, _, suffix = path.rpartition(".")
            self.layer_of[prefix] = t.lineage or ((t.layer,) if t.layer else None)
            siblings.setdefault(prefix, set()).add(suffix)
        self.siblings = {k: frozenset(v) for k, v in siblings.items()}
        #: source name -> its proposals by path, taken after the names'
        self.found: dict[str, list[tuple[str, str, str, tuple]]] = {}

    def propose(self, info: TensorInfo, mapping: MappingTable,
                target: Target) -> list[tuple[str, str, str, tuple]]:
        """As :func:`_propose_one`, where the shapes fit: a path is weaker evidence than a
        name (timm's SwinV2 downsamples at the start of a stage, MindCV's at the end of the
        one before, under the same path), and one that does not fit is left to alignment."""
        found = _propose_one(info.name, mapping, self.names,  # type: ignore[arg-type]
                             self.layer_of, self.siblings)
        return [(self.names[t], how, f"{detail}, at {t}", tfs)
                for t, how, detail, tfs in found if t in self.names
                and fit(info.shape, target.tensors[self.names[t]], tfs) is not None]


def _declared_fit(shape: tuple[int, ...], tt: TargetTensor,
                  transforms: tuple[Transform, ...]) -> tuple[Transform, ...] | None:
    """Declared transforms, if they turn ``shape`` into the target's; else ``None``."""
    return transforms if shape_or_none(transforms, shape) == tt.shape else None


def _check_explicit(mapping: MappingTable, source: Source, target: Target) -> None:
    for entry in mapping.tensors.values():
        if entry.target not in target:
            close = difflib.get_close_matches(entry.target, list(target.tensors), n=2)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise MappingError(
                f"{mapping.origin}: tensors entry {entry.target!r}: the target has no such "
                f"tensor{hint} — fix the name or remove the entry", path=mapping.origin)
        if entry.init is None and entry.source not in source:
            close = difflib.get_close_matches(entry.source, list(source.tensors), n=2)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise MappingError(
                f"{mapping.origin}: tensors entry {entry.target!r}: source {entry.source!r} "
                f"is not in {source.path}{hint} — fix the name or remove the entry",
                path=mapping.origin)


__all__ = ["LENIENT", "PlanOptions", "make_plan"]

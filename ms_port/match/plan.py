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
import contextlib
import difflib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from ..display import Renderable
from ..errors import MappingError, shown
from ..read.sources import Skipped, Source
from ..read.targets import Target, TargetTensor
from ..read.tensors import FLOAT_DTYPES, TensorInfo, format_shape, itemsize, numpy_dtype
from .closest import NameIndex
from .derived import DERIVED, agrees
from .layouts import Layout, LayoutError
from .mapping import MappingTable, Template
from .params import ParamError, evaluate, resolve
from .patterns import MAX_DIGITS
from .rules import initial_value, known_drop, propose
from .transforms import Transform, apply_all, shape_after

#: how a target was filled; "initialised": a declared value where PyTorch has no
#: counterpart; "restored": export only
#: "tied": filled from the tensor a tied one is the same as (a tied LM head)
HOW = ("exact", "rule", "mapping", "aligned", "fallback", "initialised", "tied", "restored")


@dataclass(frozen=True)
class Match:
    """One target tensor and the source tensor that fills it.

    Attributes:
        how: ``exact``, ``rule``, ``mapping``, ``fallback`` (shape/order only) or
            ``initialised`` (a declared value: PyTorch has no such tensor).
        detail: which rule or mapping entry (``batchnorm``, ``segment fc->end_point``).
        transforms: applied to the source data, in order.
        dtype: the source dtype; ``out_dtype`` what is written (differs under a cast).
    """

    target: str
    source: str
    how: str
    detail: str
    source_shape: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    out_dtype: str
    transforms: tuple[Transform, ...] = ()
    #: for ``how == "initialised"``: the declared value (``zeros``, ``ones``, a number)
    init: str | float | None = None
    #: a fused target: every source it is made of, joined by ``layout`` (``source`` is
    #: the first); ``source_shape`` is then the joined shape
    parts: tuple[str, ...] = ()
    layout: Layout | None = None
    #: a split source: this target is part ``part`` of ``source`` laid out by ``layout``
    part: int | None = None
    #: for a part: transforms that bring the source back to its layout first (export of a
    #: target fused and then transformed: the experts' transpose and reshapes undone)
    before: tuple[Transform, ...] = ()
    #: a fused target computed group by group (its ``over:`` groups, an expert each):
    #: ``parts`` come in ``groups`` equal runs, and the target's rows are, group after
    #: group, ``group_transforms`` of that group's parts joined. Set only where the plan
    #: checked this equals the whole computation (:func:`_separable`); 0 otherwise
    groups: int = 0
    group_transforms: tuple[Transform, ...] = ()
    #: for a part of a grouped fuse (export): the rows ``start, stop`` of ``source`` that
    #: hold its group, which alone are read and brought back (``before``), not the whole
    rows: tuple[int, int] | None = None

    @property
    def sources(self) -> tuple[str, ...]:
        """Every source tensor this target is made from."""
        return self.parts or ((self.source,) if self.source else ())

    @property
    def nbytes(self) -> int:
        """The bytes the target holds once written (its shape in ``out_dtype``)."""
        return _numel(self.shape) * itemsize(self.out_dtype)

    @property
    def lossy(self) -> bool:
        """Whether the cast to ``out_dtype`` can lose information."""
        return self.dtype != self.out_dtype and not _widens(self.dtype, self.out_dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "source": self.source, "how": self.how,
                "detail": self.detail, "shape": list(self.shape),
                "source_shape": list(self.source_shape), "dtype": self.dtype,
                "out_dtype": self.out_dtype,
                "transforms": [t.to_data() for t in self.transforms],
                **({"parts": list(self.parts)} if self.parts else {}),
                **({"layout": str(self.layout)} if self.layout else {}),
                **({"part": self.part} if self.part is not None else {})}


@dataclass(frozen=True)
class Candidate:
    """A near miss offered as "did you mean"."""

    name: str
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.name!r} ({format_shape(self.shape)})"


@dataclass(frozen=True)
class Leftover:
    """A tensor on one side that nothing on the other side takes, with near misses."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    candidates: tuple[Candidate, ...] = ()
    #: for a source tensor a mapping renamed: the name it produced, and by which entry
    renamed: str | None = None
    renamed_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "candidates": [c.name for c in self.candidates], "renamed": self.renamed,
                "renamed_by": self.renamed_by}


@dataclass(frozen=True)
class Missing(Leftover):
    """A target tensor nothing fills."""

    #: the source entry under this name that was skipped as unusable (a meta tensor, a
    #: sparse one): why the source has no tensor for it
    skipped: Skipped | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(),
                **({"skipped": self.skipped.to_dict()} if self.skipped else {})}


class Unused(Leftover):
    """A source tensor nothing uses."""


@dataclass(frozen=True)
class Dropped:
    """A source tensor left out on purpose, and why."""

    name: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}


@dataclass(frozen=True)
class Conflict:
    """Something that cannot be resolved by relaxing strictness.

    Attributes:
        kind: ``shape`` (a proposal whose shape does not fit), ``claim`` (several
            sources for one target) or ``fan-out`` (one source for several targets).
    """

    kind: str
    targets: tuple[str, ...]
    sources: tuple[str, ...]
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "targets": list(self.targets),
                "sources": list(self.sources), "message": self.message}


@dataclass(repr=False)
class Plan(Renderable):
    """The result of matching a Source against a Target, before any byte is written.

    Attributes:
        matches: one per filled target tensor, in target order.
        missing: target tensors nothing fills. unused: source tensors nothing uses.
        dropped: source tensors left out on purpose. conflicts: unresolvable clashes.
        notes: what a stage could not do (an alignment too large to weigh, …).
    """

    source: Source = field(repr=False)
    target: Target = field(repr=False)
    mapping: MappingTable = field(repr=False)
    matches: list[Match]
    missing: list[Missing]
    unused: list[Unused]
    dropped: list[Dropped]
    conflicts: list[Conflict]
    allow_missing: bool = False
    allow_unused: bool = False
    notes: list[str] = field(default_factory=list)
    #: numbers the mapping table took from the model's config: name -> (value, from what)
    params: dict[str, tuple[int, str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No conflicts, and nothing missing or unused unless allowed."""
        return (not self.conflicts and (self.allow_missing or not self.missing)
                and (self.allow_unused or not self.unused))

    @property
    def counts(self) -> dict[str, int]:
        """Matches by how they were found."""
        c = Counter(m.how for m in self.matches)
        shown_if_any = ("aligned", "initialised", "restored")
        return {how: c[how] for how in HOW if how not in shown_if_any or c[how]}

    @property
    def fallbacks(self) -> list[Match]:
        return [m for m in self.matches if m.how == "fallback"]

    @property
    def lossy_casts(self) -> list[Match]:
        return [m for m in self.matches if m.lossy]

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.matches)

    def problems(self) -> list[str]:
        """One line per reason the plan is not ok, for messages."""
        lines = [c.message for c in self.conflicts]
        if not self.allow_missing:
            lines += [_missing_line(m) for m in self.missing]
        if not self.allow_unused:
            lines += [_unused_line(u) for u in self.unused]
        return lines

    def arrays(self):
        """Yield ``(match, array)`` in target order: source data, transformed and cast."""
        for m in self.matches:
            yield m, self.expected(m)

    def grouped(self, m: Match) -> Iterator[np.ndarray]:
        """What ``m``'s target must hold, one group at a time (``m.groups``), in order:
        the writer and the read-back hold one expert's rows, not the whole tensor."""
        for names, layout in _groups(m):
            array = apply_all(m.group_transforms,
                              layout.join([self.source.tensors[n].load() for n in names]))
            if m.out_dtype != m.dtype:
                array = array.astype(numpy_dtype(m.out_dtype))
            yield array

    def expected(self, m: Match) -> np.ndarray:
        """What ``m``'s target must hold: its source's data transformed and cast, or the
        declared value of an ``initialised`` tensor."""
        if m.init is not None:
            return initial_array(m.init, m.shape, m.out_dtype)
        if m.parts:
            return materialize(m, [self.source.tensors[p] for p in m.parts])
        return materialize(m, self.source.tensors[m.source])

    def to_mapping(self, *, full: bool = False) -> dict[str, Any]:
        """The Plan as a mapping table (``--save-map``), which ``--map`` accepts back.

        By default the smallest one (:mod:`ms_port.match.suggest`): segment renames and
        renumbering regexes that explain many pairs, then one ``tensors:`` line per pair
        nothing else reproduces
        (exact names and rules need none); declared values and deliberate drops always.
        ``full=True`` pins every tensor as its own line.
        """
        from .suggest import minimal

        dropped = {d.name for d in self.dropped}  # dropped by their original names
        # fused, split and tied targets are stated as such below, never as one-source lines
        single = [m for m in self.matches
                  if not m.parts and m.part is None and m.how != "tied"]
        segments, regexes, lines = ({}, [], single) if full else minimal(
            single, [n for n in self.source.tensors if n not in dropped])
        tensors: dict[str, Any] = {}
        for m in self.matches:
            if m.init is not None:
                tensors[m.target] = {"init": m.init}
        for m in lines:
            if m.init is not None:
                continue
            tensors[m.target] = (
                {"source": m.source, "transforms": [t.to_data() for t in m.transforms]}
                if m.transforms else m.source)
        data: dict[str, Any] = {
            "version": 1,
            "description": f"plan: {self.source.path} -> {self.target.description}",
        }
        if segments or regexes:
            data["rename"] = {**({"segments": segments} if segments else {}),
                              **({"regex": regexes} if regexes else {})}
        data["tensors"] = tensors
        fuse = [{"target": _braced(m.target), "sources": [_braced(p) for p in m.parts],
                 "layout": m.layout.to_data(),
                 **({"transforms": [t.to_data() for t in m.transforms]} if m.transforms
                    else {})}
                for m in self.matches if m.parts and m.layout is not None]
        if fuse:
            data["fuse"] = fuse
        splits: dict[str, list[Match]] = {}
        for m in self.matches:
            if m.part is not None:
                splits.setdefault(m.source, []).append(m)
        if splits:
            data["split"] = [
                {"source": _braced(src), "targets": [_braced(m.target) for m in
                                                     sorted(ms, key=lambda x: x.part)],
                 "layout": ms[0].layout.to_data(),
                 **({"transforms": [t.to_data() for t in ms[0].transforms]}
                    if ms[0].transforms else {})}
                for src, ms in splits.items() if ms[0].layout is not None]
        if self.mapping.tied:
            data["tied"] = [{"source": e.source, "same_as": e.same_as,
                             **({"when": e.when} if e.when else {}),
                             **({"at": dict(e.at)} if e.at else {})}
                            for e in self.mapping.tied]
        drops = [d.name for d in self.dropped if (full or not known_drop(d.name))
                 and not d.reason.startswith("tied")]
        if drops:
            data["drop"] = [_literal(n) for n in drops]
        return data

    def to_yaml(self) -> str:
        """:meth:`to_mapping` as YAML, with the leftovers as comments to act on."""
        head = ["# ms-port plan; edit and pass back with --map",
                "# how each tensor was matched: " + ", ".join(
                    f"{k} {v}" for k, v in self.counts.items() if v)]
        head += [f"# MISSING  {_missing_line(m)}" for m in self.missing]
        head += [f"# UNUSED   {_unused_line(u)}" for u in self.unused]
        head += [f"# CONFLICT {c.message}" for c in self.conflicts]
        from .suggest import group_line, leftover_groups

        head += [f"# SUGGEST  {group_line(*g)}" for g in leftover_groups(self.unused)]
        head += [f"# NOTE     {n}" for n in self.notes]
        head += ["# exact names and built-in rules need no line; the rest follows"]
        body = yaml.safe_dump(self.to_mapping(), sort_keys=False, width=120)
        return "\n".join(head) + "\n" + body

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in self.counts.items() if v)
        return (f"Plan(ok={self.ok}, filled={len(self.matches)}/{len(self.target)}, {counts}, "
                f"missing={len(self.missing)}, unused={len(self.unused)}, "
                f"conflicts={len(self.conflicts)})")

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "source": self.source.path, "target": self.target.description,
            "filled": len(self.matches), "total": len(self.target),
            "counts": self.counts, "matches": [m.to_dict() for m in self.matches],
            "missing": [m.to_dict() for m in self.missing],
            "unused": [u.to_dict() for u in self.unused],
            "dropped": [d.to_dict() for d in self.dropped],
            "notes": list(self.notes),
            "mapping": self.mapping.origin,
            "params": {k: {"value": v, "from": w} for k, (v, w) in self.params.items()},
            "conflicts": [c.to_dict() for c in self.conflicts],
            "lossy_casts": [m.target for m in self.lossy_casts],
        }


def _numel(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _braced(name: str) -> str:
    """A literal name in a ``fuse:``/``split:`` entry, where ``{x}`` is a placeholder."""
    if "{" in name or "}" in name:
        raise MappingError(f"tensor {name!r} has braces, which a saved fuse/split entry "
                           "cannot write literally; rename it or write the entry by hand")
    return name


def _literal(name: str) -> str:
    import re

    return re.escape(name)


def _missing_line(m: Missing) -> str:
    if m.skipped is not None:  # the source has the name, without usable data under it
        s = m.skipped
        return (f"no source tensor for {m.name!r} ({format_shape(m.shape)}): the source "
                f"holds {s.name!r} as {s.kind}, which was skipped: {s.reason} — or pass "
                "--allow-missing (allow_missing=True)")
    hint = f"; closest: {', '.join(map(str, m.candidates))}" if m.candidates else ""
    return (f"no source tensor for {m.name!r} ({format_shape(m.shape)}){hint} — add it to "
            "your mapping file's tensors: or pass --allow-missing (allow_missing=True)")


def _unused_line(u: Unused) -> str:
    hint = f"; could fill: {', '.join(map(str, u.candidates))}" if u.candidates else ""
    renamed = (f", renamed to {u.renamed!r} by {u.renamed_by}, which the target does not "
               "have" if u.renamed else "")
    return (f"source tensor {u.name!r} ({format_shape(u.shape)}) is not used{renamed}{hint} "
            "— map it, add it to drop:, or pass --allow-unused (allow_unused=True)")


_FLOAT_BITS = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}


def _widens(src: str, dst: str) -> bool:
    """Whether every ``src`` value is exactly representable in ``dst``."""
    if src in _FLOAT_BITS and dst in _FLOAT_BITS:
        (e1, m1), (e2, m2) = _FLOAT_BITS[src], _FLOAT_BITS[dst]
        return e2 >= e1 and m2 >= m1
    return src == dst


def materialize(match: Match, info: TensorInfo | list[TensorInfo]) -> np.ndarray:
    """The array written for ``match``: source data (its parts joined, or its part taken),
    transformed, then cast. A fused target reads only its own parts."""
    if isinstance(info, list):
        assert match.layout is not None
        array = match.layout.join([i.load() for i in info])
    elif match.part is not None:
        assert match.layout is not None
        held = info.load() if match.rows is None else info.load_rows(*match.rows)
        array = match.layout.part(apply_all(match.before, held), match.part)
    else:
        array = info.load()
    array = apply_all(match.transforms, array)
    if match.out_dtype != match.dtype:
        array = array.astype(numpy_dtype(match.out_dtype))
    return array


def initial_array(init: str | float, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The array a declared value stands for: ``zeros``, ``ones`` or a number."""
    value = {"zeros": 0, "ones": 1}.get(init, init) if isinstance(init, str) else init
    return np.full(shape, value, dtype=numpy_dtype(dtype))


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


def make_plan(
    source: Source,
    target: Target,
    mapping: MappingTable | None = None,
    *,
    allow_missing: bool = False,
    allow_unused: bool = False,
    allow_shape_match: bool = False,
    dtype: str | None = None,
    align: bool = True,
    config: dict[str, Any] | None = None,
) -> Plan:
    """Match every target tensor to a source tensor (see the module docstring).

    Args:
        source: what the PyTorch checkpoint holds.
        target: what the MindSpore side expects.
        mapping: the mapping table(s) to apply on top of the built-in rules.
        allow_missing / allow_unused: accept leftovers (they are still reported).
        allow_shape_match: fill leftovers by equal shape in order; flagged ``fallback``.
        align: pair the layers names leave unpaired by structure (order, kinds, shapes;
            :mod:`ms_port.match.align`); only unambiguous pairs fill, as ``aligned``.
        dtype: cast floating-point tensors to this dtype (``float16``, ``bfloat16``,
            ``float32``); integer and bool tensors keep theirs.
        config: the model's config (``config.json``), for tables that take numbers from
            it (fused layouts, tied tensors); defaults to the source's own.

    Returns:
        The :class:`Plan`; check ``plan.ok`` — this function never raises for
        leftovers, only for a mapping table that names tensors that do not exist.
    """
    mapping = mapping or MappingTable.empty()
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise ValueError(f"cannot cast to {dtype!r}; choose one of {sorted(FLOAT_DTYPES)}")
    _check_explicit(mapping, source, target)

    layer_of, siblings = target.layers(), target.siblings()
    proposals: dict[str, list[tuple[str, str, str, tuple[Transform, ...]]]] = {}
    dropped: list[Dropped] = []
    explicit_sources = {e.source: e for e in mapping.tensors.values() if e.init is None}
    fan_out: list[Conflict] = []
    config = config if config is not None else source.config
    many = _Many(source, target, mapping, config, dtype)
    many.run()
    dropped += many.dropped
    fan_out += many.conflicts

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

    matches: dict[str, Match] = dict(many.matches)
    conflicts: list[Conflict] = list(fan_out)
    used: set[str] = set(many.consumed)
    for t, props in proposals.items():
        tt = target.tensors[t]
        if len(props) > 1:
            srcs = tuple(p[0] for p in props)
            conflicts.append(Conflict("claim", (t,), srcs,
                                      f"{len(srcs)} source tensors claim {t!r}: "
                                      f"{', '.join(map(repr, srcs))}; add a tensors: entry "
                                      "to pick one and drop: the others"))
            used.update(srcs)
            continue
        (s, how, detail, tfs) = props[0]
        used.add(s)
        info = source.tensors[s]
        # transforms a mapping file declares are applied, or the pair refused: never
        # skipped because the shapes happen to agree (a square weight to transpose)
        declared = (tfs if how == "mapping" else ()) or mapping.transforms_for(t)
        fitted = _declared_fit(info.shape, tt, declared) if declared else \
            _fit(info.shape, tt, tfs)
        if fitted is None:
            made = _shape_or_none(declared, info.shape) if declared else None
            why = (f"the declared transforms {', '.join(map(str, declared))} make it "
                   f"{format_shape(made)}" if made is not None else
                   f"the declared transforms {', '.join(map(str, declared))} do not apply"
                   ) if declared else "declare a transform in your mapping file"
            conflicts.append(Conflict(
                "shape", (t,), (s,),
                f"{s!r} ({format_shape(info.shape)}) cannot fill {t!r} "
                f"({format_shape(tt.shape)}), matched by {how} ({detail}); {why} — fix "
                "the transforms or map another tensor"))
            continue
        matches[t] = Match(t, s, how, detail, info.shape, tt.shape, info.dtype,
                           _cast(info.dtype, dtype), fitted)

    conflicted_targets = {t for c in conflicts for t in c.targets}
    ambiguous: dict[str, tuple[str, ...]] = {}
    notes: list[str] = []
    if align:
        ambiguous = _align_leftovers(source, target, mapping, matches, used, conflicted_targets,
                                     proposals, dropped, layer_of, dtype, notes)
    for name, tt in target.tensors.items():
        # what PyTorch has no counterpart for: a declared value, never a silent default
        if name in matches or name in conflicted_targets or name in proposals:
            continue
        declared = mapping.declared_value(name)
        by_rule = initial_value(name, layer_of)
        chosen = declared or (by_rule and (by_rule[0], f"{by_rule[1]}: {by_rule[0]} (PyTorch "
                                                       "has no counterpart)"))
        if chosen:
            matches[name] = Match(name, "", "initialised", chosen[1], (), tt.shape, tt.dtype,
                                  _cast(tt.dtype, dtype), init=chosen[0])
    pending_t = [tt for name, tt in target.tensors.items()
                 if name not in matches and name not in conflicted_targets]
    dropped_names = {d.name for d in dropped}
    pending_s = [i for i in source if i.name not in used and i.name not in dropped_names]
    if allow_shape_match:  # per-shape queues: linear, not a scan per target
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
            matches[tt.name] = Match(tt.name, info.name, "fallback", "same shape, in order",
                                     info.shape, tt.shape, info.dtype,
                                     _cast(info.dtype, dtype))
        pending_t = still
        pending_s = [i for i in pending_s if i.name not in taken]
    kept = []
    for info in pending_s:
        reason = known_drop(info.name)
        if reason is None:
            kept.append(info)
        else:
            dropped.append(Dropped(info.name, f"known drop: {reason}"))
    pending_s = _zero_biases(kept, matches, target, dropped, notes)

    s_index = NameIndex((i.name, i.shape) for i in pending_s)
    t_index = NameIndex((t.name, t.shape) for t in pending_t)
    unusable = _skipped_by_name(source, mapping)
    missing = [Missing(t.name, t.shape, t.dtype,
                       _aligned_candidates(source, ambiguous[t.name]) if t.name in ambiguous
                       else _closest(s_index, t.name, t.shape) if k < SUGGESTED else (),
                       skipped=unusable.get(t.name))
               for k, t in enumerate(pending_t)]
    unused = [Unused(i.name, i.shape, i.dtype,
                     _closest(t_index, i.name, i.shape) if k < SUGGESTED else (),
                     *_renaming(mapping, i.name))
              for k, i in enumerate(pending_s)]
    ordered = [matches[name] for name in target.tensors if name in matches]
    return Plan(source, target, mapping, ordered, missing, unused, dropped, conflicts,
                allow_missing=allow_missing, allow_unused=allow_unused,
                notes=list(target.notes) + many.notes + notes, params=many.params)


#: the most tensors one ``over:`` placeholder may count (experts of the largest MoE: 384)
MAX_OVER = 4096


class _Many:
    """The table's ``fuse:``, ``split:`` and ``tied:`` entries: targets made of several
    sources, sources that fill several targets, and tensors that are another one.

    Runs before the one-to-one stages; what it fills and consumes they leave alone.
    Numbers come from the config through the table's ``params:``; a config that does not
    fit the tensors is a :class:`~ms_port.errors.MappingError` (bad input), never a guess.
    """

    def __init__(self, source: Source, target: Target, mapping: MappingTable,
                 config: dict[str, Any] | None, dtype: str | None) -> None:
        self.source, self.target, self.mapping = source, target, mapping
        self.config, self.dtype = config, dtype
        self.matches: dict[str, Match] = {}
        self.consumed: set[str] = set()
        self.dropped: list[Dropped] = []
        self.conflicts: list[Conflict] = []
        self.notes: list[str] = []
        self.params: dict[str, tuple[int, str]] = {}
        self._values: dict[str, Any] | None = None
        self._separable: dict[Any, tuple[Transform, ...] | None] = {}

    def values(self) -> dict[str, Any]:
        """Config scalars and the table's params, computed once, on first need."""
        if self._values is None:
            if self.config is None:
                raise MappingError(
                    f"{self.mapping.origin} takes numbers from the model's config "
                    f"({', '.join(self.mapping.params) or 'layout sizes'}), and no config.json "
                    f"was found for {self.source.path} — put config.json beside the "
                    "checkpoint or pass --config FILE", path=self.mapping.origin)
            try:
                self.params = resolve(dict(self.mapping.params), self.config)
            except ParamError as exc:
                raise MappingError(f"{self.mapping.origin}: {exc} — check config.json",
                                   path=self.mapping.origin) from None
            self._values = {**self.config, **{k: v for k, (v, _) in self.params.items()}}
        return self._values

    def run(self) -> None:
        if self.mapping.params and self.config is not None:
            # report the numbers even where no entry fires; raised where one needs them
            with contextlib.suppress(MappingError):
                self.values()
        settings = {**self.mapping.settings, **self.target.settings}
        for entry in self.mapping.fuse:
            if all(key in settings and type(settings[key]) is type(value)
                   and settings[key] == value for key, value in entry.when):
                self._fuse(entry)
        for entry in self.mapping.split:
            self._split(entry)
        for entry in self.mapping.tied:
            self._tied(entry)
        for entry in self.mapping.derived:
            self._derived(entry)

    def _layout(self, entry: Any, lengths: list[int], what: str) -> Layout:
        spec = entry.layout
        needs_config = spec.groups is not None or spec.sizes is not None
        try:
            return spec.resolve(self.values() if needs_config else {}, lengths)
        except (LayoutError, ParamError) as exc:
            raise MappingError(f"{entry.where}: {what}: {exc}",
                               path=self.mapping.origin) from None

    def _counted(self, entry: Any) -> list[dict[str, str]]:
        """The values of an entry's ``over:`` placeholders, in order (``[{}]`` without)."""
        combos: list[dict[str, str]] = [{}]
        for name, count in entry.over:
            try:
                n = evaluate(count, self.values())
            except ParamError as exc:
                raise MappingError(f"{entry.where}: over.{name}: {exc} — check config.json",
                                   path=self.mapping.origin) from None
            if not 0 < n <= MAX_OVER:
                raise MappingError(f"{entry.where}: over.{name} is {n}; expected 1 to "
                                   f"{MAX_OVER} — check config.json", path=self.mapping.origin)
            combos = [{**c, name: str(k)} for c in combos for k in range(n)]
        return combos

    def _at(self, entry: Any, got: dict[str, str]) -> dict[str, str] | None:
        """The numbers an entry's ``at:`` gives its source-only placeholders, computed from
        the config and the target's placeholders ``got``; ``None`` where a placeholder's
        digits are too many to be a block number (that name is no match)."""
        if any(len(v) > MAX_DIGITS for v in got.values()):
            return None
        known = {**self.values(), **{k: int(v) for k, v in got.items()}}
        out: dict[str, str] = {}
        for name, expr in entry.at:
            try:
                n = evaluate(expr, known)
            except ParamError as exc:
                raise MappingError(f"{entry.where}: at.{name}: {exc} — check config.json",
                                   path=self.mapping.origin) from None
            if n < 0:
                raise MappingError(f"{entry.where}: at.{name} is {n}, not a tensor's number "
                                   "— check config.json", path=self.mapping.origin)
            out[name] = str(n)
        return out

    def _resolved(self, entry: Any) -> tuple[Transform, ...]:
        """The entry's transforms with the config values they name computed."""
        def value(expr: str) -> int:
            try:
                return evaluate(expr, self.values())
            except ParamError as exc:
                raise MappingError(f"{entry.where}: transforms: {exc} — check config.json",
                                   path=self.mapping.origin) from None
        return tuple(t.resolved(value) for t in entry.transforms)

    def _fuse(self, entry: Any) -> None:
        axis = entry.layout.axis
        counted = self._counted(entry) if entry.over else [{}]
        transforms = self._resolved(entry)
        for t, tt in self.target.tensors.items():
            got = entry.target.match(t)
            if got is None or t in self.matches or t in self.mapping.tensors:
                continue
            fixed = self._at(entry, got) if entry.at else {}
            if fixed is None:
                continue
            names = [s.fill({**got, **fixed, **c}) for c in counted for s in entry.sources]
            present = [n for n in names if n in self.source and n not in self.consumed]
            if not present:
                continue
            self.consumed.update(present)
            if len(entry.sources) == 1 and not entry.over:
                self._renamed(entry, t, tt, names[0], transforms)
                continue
            if len(present) < len(names):
                lacking = [n for n in names if n not in present]
                self.conflicts.append(Conflict(
                    "parts", (t,), tuple(present),
                    f"{t!r} is fused from {', '.join(map(repr, names))} ({entry.where}), but "
                    f"the source has no {', '.join(map(repr, lacking))} — check the "
                    "checkpoint is complete"))
                continue
            infos = [self.source.tensors[n] for n in names]
            what = f"cannot fuse {t!r} from {', '.join(names)}"
            if any(len(i.shape) <= axis for i in infos):
                raise MappingError(f"{entry.where}: {what}: a part "
                                   f"has no axis {axis}", path=self.mapping.origin)
            layout = self._layout(entry, [i.shape[axis] for i in infos], what)
            try:
                joined = layout.fused_shape([i.shape for i in infos])
            except LayoutError as exc:
                raise MappingError(f"{entry.where}: {what}: {exc}",
                                   path=self.mapping.origin) from None
            dtypes = {i.dtype for i in infos}
            made = _shape_or_none(transforms, joined)
            if made != tt.shape or len(dtypes) > 1:
                why = (f"its parts have dtypes {sorted(dtypes)}" if len(dtypes) > 1 else
                       f"{layout} makes {format_shape(joined)}"
                       + (f", then {format_shape(made)}" if transforms else ""))
                self.conflicts.append(Conflict(
                    "shape", (t,), tuple(names),
                    f"{t!r} ({format_shape(tt.shape)}) cannot be fused from "
                    f"{', '.join(map(repr, names))} ({entry.where}): {why}"))
                continue
            groups, per_group = self._grouping(entry, infos, layout, transforms, len(counted))
            self.matches[t] = Match(
                t, names[0], "mapping", f"fuse: {layout} of {len(names)} ({entry.where})",
                joined, tt.shape, infos[0].dtype, _cast(infos[0].dtype, self.dtype),
                transforms, parts=tuple(names), layout=layout, groups=groups,
                group_transforms=per_group)

    def _grouping(self, entry: Any, infos: list[TensorInfo], layout: Layout,
                  transforms: tuple[Transform, ...], groups: int
                  ) -> tuple[int, tuple[Transform, ...]]:
        """``(groups, per-group transforms)`` where a transformed ``over:`` fuse can be
        computed one group at a time, else ``(0, ())``.

        Each group's transforms are the entry's with its ``over:`` count set to 1 (the
        experts' ``reshape: [experts, …]`` becomes one expert's). Whether the groups'
        results, one after the other, are the whole computation is not assumed: it is
        checked on two groups of the real sizes, each element numbered
        (:func:`_separable`), once per entry and part shapes.
        """
        if (groups < 2 or not transforms or layout.kind != "concat" or layout.groups != 1
                or len(entry.over) != 1 or len(infos) % groups):
            return 0, ()
        (_, count), = entry.over
        if not isinstance(count, str) or not count.isidentifier():
            return 0, ()
        k = len(infos) // groups
        shapes = tuple(tuple(i.shape) for i in infos[:2 * k])
        key = (entry.where, shapes, tuple(map(str, transforms)))
        if key not in self._separable:
            values = {**self.values(), count: 1}
            try:
                one = tuple(t.resolved(lambda x: evaluate(x, values)) for t in entry.transforms)
                two = tuple(t.resolved(lambda x: evaluate(x, {**values, count: 2}))
                            for t in entry.transforms)
            except ParamError:
                one = two = ()
            ok = bool(one) and _separable(layout.axis, shapes, k, two, one)
            self._separable[key] = one if ok else None
        per_group = self._separable[key]
        return (groups, per_group) if per_group else (0, ())

    def _renamed(self, entry: Any, t: str, tt: TargetTensor, name: str,
                 transforms: tuple[Transform, ...]) -> None:
        """A one-source ``fuse:`` entry: ``name`` fills ``t`` as it is, or through the
        entry's transforms."""
        info = self.source.tensors[name]
        made = _shape_or_none(transforms, info.shape)
        if made != tt.shape:
            self.conflicts.append(Conflict(
                "shape", (t,), (name,),
                f"{name!r} ({format_shape(info.shape)}) cannot fill {t!r} "
                f"({format_shape(tt.shape)}) ({entry.where})"
                + (f": its transforms make {format_shape(made)}" if transforms and made
                   else "")))
            return
        self.matches[t] = Match(t, name, "mapping", f"renamed by {entry.where}", info.shape,
                                tt.shape, info.dtype, _cast(info.dtype, self.dtype), transforms)

    def _split(self, entry: Any) -> None:
        axis = entry.layout.axis
        for info in self.source:
            got = entry.source.match(info.name)
            if got is None or info.name in self.consumed:
                continue
            names = [t.fill(got) for t in entry.targets]
            present = [n for n in names if n in self.target and n not in self.matches
                       and n not in self.mapping.tensors]
            if not present:
                continue
            self.consumed.add(info.name)
            what = f"cannot split {info.name!r} into {', '.join(names)}"
            if len(present) < len(names):
                lacking = [n for n in names if n not in present]
                self.conflicts.append(Conflict(
                    "parts", tuple(present), (info.name,),
                    f"{info.name!r} splits into {', '.join(map(repr, names))} "
                    f"({entry.where}), but the target has no (free) "
                    f"{', '.join(map(repr, lacking))} — check the target network"))
                continue
            shapes = [_before(entry.transforms, self.target.tensors[n].shape) for n in names]
            if any(s is None or len(s) <= axis for s in shapes):
                raise MappingError(f"{entry.where}: {what}: the "
                                   "transforms cannot be undone to find each part's shape; "
                                   "declare the layout's sizes", path=self.mapping.origin)
            layout = self._layout(entry, [s[axis] for s in shapes], what)
            try:
                joined = layout.fused_shape(shapes)
            except LayoutError as exc:
                raise MappingError(f"{entry.where}: {what}: {exc}",
                                   path=self.mapping.origin) from None
            if joined != info.shape:
                self.conflicts.append(Conflict(
                    "shape", tuple(names), (info.name,),
                    f"{info.name!r} ({format_shape(info.shape)}) cannot be split into "
                    f"{', '.join(map(repr, names))} ({entry.where}): their parts make "
                    f"{format_shape(joined)}"))
                continue
            for k, n in enumerate(names):
                self.matches[n] = Match(
                    n, info.name, "mapping",
                    f"split: part {k + 1} of {layout} ({entry.where})", info.shape,
                    self.target.tensors[n].shape, info.dtype, _cast(info.dtype, self.dtype),
                    entry.transforms, layout=layout, part=k)

    def _tied(self, entry: Any) -> None:
        if entry.when is not None and not (self.config or {}).get(entry.when):
            return
        why = f"tied ({entry.when}, {entry.where})" if entry.when else f"tied ({entry.where})"
        source, same_as = entry.source, entry.same_as
        if entry.at:
            fixed = self._at(entry, {})
            source, same_as = Template(source).fill(fixed), Template(same_as).fill(fixed)
            if source not in self.source:  # a numbered block's copy this checkpoint lacks
                return
        partner = self.source.tensors.get(same_as)
        if partner is None or source in self.consumed:  # a table layered on itself
            return
        renamed, _ = self.mapping.rename(source)
        own = source in self.target or renamed in self.target
        if source in self.source:
            info = self.source.tensors[source]
            if not (info.shape == partner.shape
                    and np.array_equal(info.load(), partner.load())):
                self.notes.append(f"{source} should be tied to {same_as} "
                                  f"({why}) but holds other values; it is matched on its own")
            elif not own:  # else the target has its own head, filled like any tensor
                self.consumed.add(source)
                self.dropped.append(Dropped(source, f"{why}: the same tensor as {same_as}"))
            return
        if not own:
            self.notes.append(f"{source} is {same_as}: {why}; stored once, on both sides")
            return
        for name in dict.fromkeys((source, renamed)):
            if name in self.target and name not in self.matches:
                tt = self.target.tensors[name]
                if tt.shape != partner.shape:
                    continue
                self.matches[name] = Match(
                    name, same_as, "tied", f"{source} is {same_as}: {why}",
                    partner.shape, tt.shape, partner.dtype, _cast(partner.dtype, self.dtype))
                return


    def _derived(self, entry: Any) -> None:
        value = DERIVED[entry.value]
        found = [i for i in self.source
                 if i.name not in self.consumed and entry.source.match(i.name) is not None]
        if not found:
            return
        if self.config is None:
            raise MappingError(f"{found[0].name} is computed from the model's config "
                               f"({value.keys}; {entry.where}), and no config.json was found "
                               f"for {self.source.path} — put config.json beside the "
                               "checkpoint or pass --config FILE", path=self.mapping.origin)
        for info in found:
            same, how = agrees(value, info.load(), self.config)
            if not same:
                raise MappingError(
                    f"{shown(info.name, 200)} is not what config.json implies ({value.keys}; "
                    f"{how}): that config computes another network — use the config the "
                    f"checkpoint was saved with ({entry.where})", path=self.mapping.origin)
            self.consumed.add(info.name)
            self.dropped.append(Dropped(info.name, f"derived from config.json ({value.keys}), "
                                        "checked equal; not a weight"))


def _before(transforms: tuple[Transform, ...], shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape that ``transforms`` turn into ``shape``, where it can be known."""
    for t in reversed(transforms):
        if t.op == "reshape":
            return None
        try:
            undo = t.inverse(())
            shape = undo.shape(shape)
        except ValueError:
            return None
    return shape


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


def _fit(shape: tuple[int, ...], tt: TargetTensor,
         transforms: tuple[Transform, ...]) -> tuple[Transform, ...] | None:
    """The transforms that make ``shape`` fit the target, or ``None`` if nothing does."""
    if shape == tt.shape:
        return ()
    if transforms:
        try:
            if shape_after(transforms, shape) == tt.shape:
                return transforms
        except ValueError:
            return None
    return None


def _declared_fit(shape: tuple[int, ...], tt: TargetTensor,
                  transforms: tuple[Transform, ...]) -> tuple[Transform, ...] | None:
    """Declared transforms, if they turn ``shape`` into the target's; else ``None``."""
    return transforms if _shape_or_none(transforms, shape) == tt.shape else None


#: the most elements of one group :func:`_separable` numbers (two groups are numbered):
#: DeepSeek-V3's experts are 29M each; larger groups are written whole
MAX_PROBE = 1 << 25


def _separable(axis: int, shapes: tuple[tuple[int, ...], ...], k: int,
               whole: tuple[Transform, ...], each: tuple[Transform, ...]) -> bool:
    """Whether a concat of two groups of ``k`` parts (``shapes``) along ``axis``,
    transformed by ``whole``, is the two groups each joined and transformed by ``each``,
    one after the other: checked on numbered elements (int32), so any element taken from
    the other group, or put elsewhere, shows."""
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    if sum(sizes) > 2 * MAX_PROBE:
        return False
    starts = np.cumsum([0, *sizes])
    parts = [np.arange(a, a + n, dtype=np.int32).reshape(s)
             for a, n, s in zip(starts, sizes, shapes)]
    try:
        joined = apply_all(whole, np.concatenate(parts, axis=axis))
        pieces = [apply_all(each, np.concatenate(parts[g * k:(g + 1) * k], axis=axis))
                  for g in (0, 1)]
        return (joined.ndim >= 1 and all(p.shape[1:] == joined.shape[1:] for p in pieces)
                and np.array_equal(joined, np.concatenate(pieces)))
    except ValueError:  # a transform that does not fit one group
        return False


def _groups(m: Match) -> Iterator[tuple[tuple[str, ...], Layout]]:
    """Each group of a grouped fuse: its parts, and the layout joining them."""
    assert m.layout is not None and m.groups
    k = len(m.parts) // m.groups
    for g in range(m.groups):
        sizes = m.layout.sizes[g * k:(g + 1) * k]
        yield m.parts[g * k:(g + 1) * k], Layout("concat", m.layout.axis, 1, sizes)


def _shape_or_none(transforms: tuple[Transform, ...],
                   shape: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return shape_after(transforms, shape)
    except ValueError:
        return None


def _cast(dtype: str, wanted: str | None) -> str:
    return wanted if wanted and dtype in FLOAT_DTYPES else dtype


def _align_leftovers(source: Source, target: Target, mapping: MappingTable,
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
            fitted = _fit(info.shape, tt, rule.transforms.get(suffix, ()) if rule else ())
            if fitted is None and lone and _squeezed(info.shape) == _squeezed(tt.shape):
                fitted = (Transform("reshape", list(tt.shape)),)  # size-1 axes only
            if fitted is None:
                notes.append(f"alignment paired {pair.source.path} with {pair.target.path} by "
                             f"order and sizes, but {info.name} "
                             f"({format_shape(info.shape)}) does not fit {name} "
                             f"({format_shape(tt.shape)}): not filled")
                break
            made.append(Match(name, info.name, "aligned", pair.evidence, info.shape,
                              tt.shape, info.dtype, _cast(info.dtype, dtype), fitted))
        else:
            for m in made:
                matches[m.target] = m
                used.add(m.source)
    for m in _loose_pairs(source, target, matches, used | {d.name for d in dropped},
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


def _loose_pairs(source: Source, target: Target, matches: dict[str, Match], gone: set[str],
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
            _cast(info.dtype, dtype), fitted))
    return made


def _zero_biases(pending: list[TensorInfo], matches: dict[str, Match], target: Target,
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


def _aligned_candidates(source: Source, layers: tuple[str, ...]) -> tuple[Candidate, ...]:
    prefixes = tuple(f"{p}." for p in layers)
    return tuple(Candidate(i.name, i.shape) for i in source
                 if i.name.startswith(prefixes))[:6]


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


__all__ = ["HOW", "Candidate", "Conflict", "Dropped", "Match", "Missing", "Plan", "Unused",
           "initial_array", "make_plan", "materialize"]

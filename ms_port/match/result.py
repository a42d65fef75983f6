"""The :class:`Plan`: what matching found, before any byte is written; what each target
tensor must hold (:func:`materialize`), and the plan as a mapping table (``--save-map``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import yaml

from ..display import Renderable
from ..errors import MappingError
from ..read.sources import Source
from ..read.targets import Target
from ..read.tensors import TensorInfo, format_shape, numpy_dtype
from .entries import HOW, INT_DTYPES, Conflict, Dropped, Match, Missing, Unused
from .layouts import Layout
from .mapping import MappingTable
from .rules import NETWORK, known_drop
from .transforms import apply_all, fast_swap, swap_into, swap_of


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
    #: how the two networks differ, where the leftovers show it
    #: (:mod:`ms_port.match.differences`): each a line that replaces its tensors' own
    differences: list[Any] = field(default_factory=list)
    #: the training state written beside the weights (:mod:`ms_port.match.training`):
    #: its matches are ``how == "state"``
    training_state: Any = None

    @property
    def ok(self) -> bool:
        """No conflicts, and nothing missing or unused unless allowed."""
        return (not self.conflicts and (self.allow_missing or not self.missing)
                and (self.allow_unused or not self.unused))

    @property
    def counts(self) -> dict[str, int]:
        """Matches by how they were found."""
        c = Counter(m.how for m in self.matches)
        shown_if_any = ("aligned", "initialised", "restored", "state")
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
        """One line per reason the plan is not ok, for messages: how the networks differ
        first (one line for all the tensors each difference accounts for), then the
        conflicts, then each other tensor left."""
        explained = {n for d in self.differences for n in d.tensors}
        shown = [d for d in self.differences if not (
            (self.allow_missing or not any(m.name in d.tensors for m in self.missing))
            and (self.allow_unused or not any(u.name in d.tensors for u in self.unused)))]
        lines = [d.text for d in shown] + [c.message for c in self.conflicts]
        if not self.allow_missing:
            lines += [missing_line(m) for m in self.missing if m.name not in explained]
        if not self.allow_unused:
            lines += [unused_line(u) for u in self.unused if u.name not in explained]
        return lines

    def arrays(self):
        """Yield ``(match, array)`` in target order: source data, transformed and cast."""
        for m in self.matches:
            yield m, self.expected(m)

    def grouped(self, m: Match) -> Iterator[np.ndarray]:
        """What ``m``'s target must hold, one group at a time (``m.groups``), in order:
        the writer and the read-back hold one expert's rows, not the whole tensor. A
        one-source target's groups are its source's rows along the first axis, each read
        alone."""
        return (make() for make in self.group_makers(m))

    def group_makers(self, m: Match, empty: Callable[..., np.ndarray] = np.empty
                     ) -> list[Callable[[], np.ndarray]]:
        """:meth:`grouped`'s groups as functions, each making its group on its own (a
        writer makes two at once, in two threads). A group transposed (the usual expert)
        is made into ``empty(shape, dtype)``: a writer's buffers used again
        (:mod:`ms_port.write.recycle`)."""
        if not m.parts:  # equal groups of rows (many.Many._row_groups)
            info = self.source.tensors[m.source]
            rows = info.shape[0] // m.groups

            def rows_of(g: int) -> np.ndarray:
                array = np.asarray(info.load_rows(g * rows, (g + 1) * rows))
                swapped = _swapped_into(array, m, empty)
                if swapped is not None:
                    return swapped
                array = apply_all(m.group_transforms, array)
                return exact_cast(array, m) if m.out_dtype != m.dtype else array
            return [partial(rows_of, g) for g in range(m.groups)]

        def joined(names: tuple[str, ...], layout: Layout) -> np.ndarray:
            parts = [np.asarray(self.source.tensors[n].load()) for n in names]
            # an expert joined and transposed (the usual group) in one pass
            final = swap_of(m.group_transforms, layout.fused_shape([p.shape for p in parts]))
            swapped = None if final is None else layout.join_swapped(parts, empty)
            array = (apply_all(m.group_transforms, layout.join(parts)) if swapped is None
                     else swapped.reshape(final))
            return exact_cast(array, m) if m.out_dtype != m.dtype else array
        return [partial(joined, names, layout) for names, layout in grouped_parts(m)]

    def expected(self, m: Match) -> np.ndarray:
        """What ``m``'s target must hold: its source's data transformed and cast, or the
        declared value of an ``initialised`` tensor."""
        if m.init == NETWORK:
            return np.asarray(self.target.tensors[m.target].constant()).astype(
                numpy_dtype(m.out_dtype))
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
            if m.init is not None and m.init != NETWORK:  # the network's own: found again
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
        head += [f"# DIFFERS  {d.text}" for d in self.differences]
        head += [f"# MISSING  {missing_line(m)}" for m in self.missing]
        head += [f"# UNUSED   {unused_line(u)}" for u in self.unused]
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
            "differences": [d.to_dict() for d in self.differences],
            "mapping": self.mapping.origin,
            "params": {k: {"value": v, "from": w} for k, (v, w) in self.params.items()},
            "conflicts": [c.to_dict() for c in self.conflicts],
            "lossy_casts": [m.target for m in self.lossy_casts],
        }


def _braced(name: str) -> str:
    """A literal name in a ``fuse:``/``split:`` entry, where ``{x}`` is a placeholder."""
    if "{" in name or "}" in name:
        raise MappingError(f"tensor {name!r} has braces, which a saved fuse/split entry "
                           "cannot write literally; rename it or write the entry by hand")
    return name


def _literal(name: str) -> str:
    import re

    return re.escape(name)


def missing_line(m: Missing) -> str:
    if m.skipped is not None:  # the source has the name, without usable data under it
        s = m.skipped
        return (f"no source tensor for {m.name!r} ({format_shape(m.shape)}): the source "
                f"holds {s.name!r} as {s.kind}, which was skipped: {s.reason} — or pass "
                "--allow-missing (allow_missing=True)")
    hint = f"; closest: {', '.join(map(str, m.candidates))}" if m.candidates else ""
    return (f"no source tensor for {m.name!r} ({format_shape(m.shape)}){hint} — add it to "
            "your mapping file's tensors: or pass --allow-missing (allow_missing=True)")


def unused_line(u: Unused) -> str:
    hint = f"; could fill: {', '.join(map(str, u.candidates))}" if u.candidates else ""
    renamed = (f", renamed to {u.renamed!r} by {u.renamed_by}, which the target does not "
               "have" if u.renamed else "")
    return (f"source tensor {u.name!r} ({format_shape(u.shape)}) is not used{renamed}{hint} "
            "— map it, add it to drop:, or pass --allow-unused (allow_unused=True)")


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
        array = exact_cast(array, match)
    return array


def _swapped_into(rows: np.ndarray, m: Match, empty: Callable[..., np.ndarray]
                  ) -> np.ndarray | None:
    """``m``'s group transforms of ``rows`` made into ``empty(shape, dtype)`` where all
    they do is swap two axes (:func:`~.transforms.swap_of`) of a native dtype OpenCV moves,
    with no cast; else None."""
    final = swap_of(m.group_transforms, rows.shape)
    if final is None or m.out_dtype != m.dtype or not rows.dtype.isnative \
            or not fast_swap(rows.dtype):
        return None
    two = [n for n in rows.shape if n != 1]
    out = empty(final, rows.dtype)
    swap_into(rows.reshape(two), out.reshape(two[::-1]))
    return out


def exact_cast(array: np.ndarray, match: Match) -> np.ndarray:
    """``array`` as ``match.out_dtype``; an integer source must fit its target's integer
    dtype value for value (a token id table written as int32), or nothing is written."""
    out = array.astype(numpy_dtype(match.out_dtype))
    if match.dtype in INT_DTYPES and not np.array_equal(out, array):
        info = np.iinfo(out.dtype)
        raise MappingError(
            f"{match.source!r} holds values outside {match.out_dtype} [{info.min}, "
            f"{info.max}], which {match.target!r} holds; the checkpoint is not what the "
            "target expects — check the source tensor")
    return out


def initial_array(init: str | float, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The array a declared value stands for: ``zeros``, ``ones`` or a number."""
    value = {"zeros": 0, "ones": 1}.get(init, init) if isinstance(init, str) else init
    return np.full(shape, value, dtype=numpy_dtype(dtype))


def grouped_parts(m: Match) -> Iterator[tuple[tuple[str, ...], Layout]]:
    """Each group of a grouped fuse: its parts, and the layout joining them."""
    assert m.layout is not None and m.groups
    k = len(m.parts) // m.groups
    for g in range(m.groups):
        sizes = m.layout.sizes[g * k:(g + 1) * k]
        yield m.parts[g * k:(g + 1) * k], Layout("concat", m.layout.axis, 1, sizes)


__all__ = ["Plan", "grouped_parts", "initial_array", "materialize", "missing_line", "unused_line"]

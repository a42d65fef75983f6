"""A mapping table's many-to-one entries: ``fuse:`` (a target made of several sources),
``split:`` (a source that fills several targets), ``tied:`` (a tensor that is another one)
and ``derived:`` (a buffer computed from the config, checked and dropped).

They run before the one-to-one stages (:mod:`ms_port.match.matching`); what they fill and
consume those stages leave alone."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ..errors import MappingError, shown
from ..read.sources import Source
from ..read.targets import Target, TargetTensor
from ..read.tensors import TensorInfo, format_shape
from .derived import DERIVED, agrees
from .entries import Conflict, Dropped, Match, cast_dtype, shape_or_none, transforms_made
from .layouts import Layout, LayoutError
from .mapping import MappingTable, Template
from .params import ParamError, evaluate, resolve
from .patterns import MAX_DIGITS
from .transforms import Transform, apply_all

#: the most tensors one ``over:`` placeholder may count (experts of the largest MoE: 384)
MAX_OVER = 4096


class Many:
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
        self.separable: dict[Any, tuple[Transform, ...] | None] = {}

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
        def holds(entry: Any) -> bool:
            return all(key in settings and type(settings[key]) is type(value)
                       and settings[key] == value for key, value in entry.when)

        for entry in self.mapping.fuse:
            if holds(entry):
                self._fuse(entry)
        for entry in self.mapping.split:
            if holds(entry):
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
        try:
            return tuple(t.resolved(value) for t in entry.transforms)
        except ValueError as exc:  # a size the config computes that the op cannot take
            raise MappingError(f"{entry.where}: transforms: {exc} — check config.json",
                               path=self.mapping.origin) from None

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
            made = shape_or_none(transforms, joined)
            if made != tt.shape or len(dtypes) > 1:
                why = (f"its parts have dtypes {sorted(dtypes)}" if len(dtypes) > 1 else
                       f"{layout} makes {format_shape(joined)}"
                       + (f", {transforms_made(transforms, joined)}" if transforms else ""))
                self.conflicts.append(Conflict(
                    "shape", (t,), tuple(names),
                    f"{t!r} ({format_shape(tt.shape)}) cannot be fused from "
                    f"{', '.join(map(repr, names))} ({entry.where}): {why}"))
                continue
            groups, per_group = self._grouping(entry, infos, layout, transforms, len(counted))
            self.matches[t] = Match(
                t, names[0], "mapping", f"fuse: {layout} of {len(names)} ({entry.where})",
                joined, tt.shape, infos[0].dtype, cast_dtype(infos[0].dtype, self.dtype),
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
        (:func:`separable`), once per entry and part shapes.
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
        if key not in self.separable:
            values = {**self.values(), count: 1}
            try:
                one = tuple(t.resolved(lambda x: evaluate(x, values)) for t in entry.transforms)
                two = tuple(t.resolved(lambda x: evaluate(x, {**values, count: 2}))
                            for t in entry.transforms)
            except ValueError:  # ParamError among them
                one = two = ()
            ok = bool(one) and separable(layout.axis, shapes, k, two, one)
            self.separable[key] = one if ok else None
        per_group = self.separable[key]
        return (groups, per_group) if per_group else (0, ())

    def _renamed(self, entry: Any, t: str, tt: TargetTensor, name: str,
                 transforms: tuple[Transform, ...]) -> None:
        """A one-source ``fuse:`` entry: ``name`` fills ``t`` as it is, or through the
        entry's transforms."""
        info = self.source.tensors[name]
        made = shape_or_none(transforms, info.shape)
        if made != tt.shape:
            self.conflicts.append(Conflict(
                "shape", (t,), (name,),
                f"{name!r} ({format_shape(info.shape)}) cannot fill {t!r} "
                f"({format_shape(tt.shape)}) ({entry.where})"
                + (f": {transforms_made(transforms, info.shape)}" if transforms else "")))
            return
        groups, per_row = self._row_groups(info, transforms)
        self.matches[t] = Match(t, name, "mapping", f"renamed by {entry.where}", info.shape,
                                tt.shape, info.dtype, cast_dtype(info.dtype, self.dtype),
                                transforms, groups=groups, group_transforms=per_row)

    def _row_groups(self, info: TensorInfo, transforms: tuple[Transform, ...]
                    ) -> tuple[int, tuple[Transform, ...]]:
        """``(rows, transforms)`` where a one-source entry's transforms can be computed a
        row of the source's first axis at a time (an expert of transformers 5's stacked
        ``experts.gate_up_proj [E, 2F, H]``): the writer and the read-back then hold one
        expert, not the whole stack transposed (7.9 GiB at DeepSeek-V3's widths). The same
        transforms must give, row after row, exactly the whole result: checked on two
        numbered rows (:func:`separable`) once per row shape and transforms; a transform
        naming the whole first axis (``reshape: [experts, …]``) does not fit one row, and
        the tensor is written whole. Tensors under :data:`ROWS_FROM_BYTES` are written
        whole."""
        if (not transforms or len(info.shape) < 2 or info.shape[0] < 2
                or info.nbytes < ROWS_FROM_BYTES or info.rows_loader is None):
            return 0, ()  # (a format that reads only whole tensors would read it per group)
        rows = info.shape[0]
        per = _rows_per_group(rows, info.nbytes // rows)
        block = (per, *info.shape[1:])
        key = ("rows", block, tuple(map(str, transforms)))
        if key not in self.separable:
            ok = rows // per >= 2 and separable(0, (block, block), 1, transforms, transforms)
            self.separable[key] = transforms if ok else None
        return (rows // per, transforms) if self.separable[key] else (0, ())

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
                    self.target.tensors[n].shape, info.dtype, cast_dtype(info.dtype, self.dtype),
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
                    partner.shape, tt.shape, partner.dtype, cast_dtype(partner.dtype, self.dtype))
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


#: a one-source tensor this large or larger is transformed a row of its first axis at a time
#: where that is exact (``Many._row_groups``); a smaller one is written whole
ROWS_FROM_BYTES = 64 << 20

#: the bytes a row group holds at most, where a row is smaller (an expert is one group)
ROW_GROUP_BYTES = 8 << 20


def _rows_per_group(rows: int, row_bytes: int) -> int:
    """The most rows, dividing ``rows``, whose bytes stay within :data:`ROW_GROUP_BYTES`
    (at least one)."""
    most = max(1, min(rows, ROW_GROUP_BYTES // max(1, row_bytes)))
    return next(n for n in range(most, 0, -1) if rows % n == 0)


#: the most elements of one group :func:`separable` numbers (two groups are numbered):
#: DeepSeek-V3's experts are 29M each; larger groups are written whole
MAX_PROBE = 1 << 25


def separable(axis: int, shapes: tuple[tuple[int, ...], ...], k: int,
               whole: tuple[Transform, ...], each: tuple[Transform, ...]) -> bool:
    """Whether a concat of two groups of ``k`` parts (``shapes``) along ``axis``,
    transformed by ``whole``, is the two groups each joined and transformed by ``each``,
    one after the other: checked on numbered elements (int32), so any element taken from
    the other group, or put elsewhere, shows. (A plan asks each question once:
    ``Many.separable``.)

    Parts joined on their first axis are numbered as one array, each group its rows of it,
    and each group's result compared with its rows of the whole in place: no copies (at
    DeepSeek-V4's widths each question numbers 134 MB of elements; its plan's two took
    0.9 s with copies, 0.46 s without)."""
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    if sum(sizes) > 2 * MAX_PROBE:
        return False
    try:
        if axis == 0 and len({s[1:] for s in shapes}) == 1:
            # parts numbered one after another and joined on their first axis are one
            # numbering: the whole and each group's rows of it, no copy made
            rows = np.cumsum([0, *(s[0] for s in shapes)])
            numbered = np.arange(sum(sizes), dtype=np.int32).reshape(-1, *shapes[0][1:])
            groups = [numbered[rows[g * k]:rows[(g + 1) * k]] for g in (0, 1)]
        else:
            starts = np.cumsum([0, *sizes])
            parts = [np.arange(a, a + n, dtype=np.int32).reshape(s)
                     for a, n, s in zip(starts, sizes, shapes)]
            numbered = np.concatenate(parts, axis=axis)
            groups = [np.concatenate(parts[g * k:(g + 1) * k], axis=axis) for g in (0, 1)]
        joined = apply_all(whole, numbered)
        if joined.ndim < 1:
            return False
        at = 0  # each group's piece, compared with its rows of the whole in place
        for group in groups:
            piece = apply_all(each, group)
            if piece.ndim < 1 or piece.shape[1:] != joined.shape[1:] \
                    or not np.array_equal(joined[at:at + len(piece)], piece):
                return False
            at += len(piece)
        return at == len(joined)
    except ValueError:  # a transform that does not fit one group
        return False


__all__ = ["MAX_OVER", "MAX_PROBE", "ROWS_FROM_BYTES", "Many", "separable"]

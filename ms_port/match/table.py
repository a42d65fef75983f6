"""A mapping table's entries and the table they make (the YAML format is
:mod:`ms_port.match.mapping_yaml`'s; reading and choosing tables,
:mod:`ms_port.match.mapping`'s)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .layouts import Layout, LayoutError
from .params import evaluate
from .patterns import Pattern
from .transforms import Transform


@dataclass(frozen=True)
class TensorEntry:
    """An explicit ``tensors:`` entry: fill ``target`` from ``source`` — or, where PyTorch
    has no counterpart, with a declared value (``init``: ``zeros``, ``ones`` or a number)."""

    target: str
    source: str
    transforms: tuple[Transform, ...] = ()
    init: str | float | None = None


@dataclass(frozen=True)
class RegexRename:
    pattern: Pattern
    replacement: str

    def __str__(self) -> str:
        return f"{self.pattern} -> {self.replacement}"


@dataclass(frozen=True)
class TransformEntry:
    match: Pattern
    ops: tuple[Transform, ...]


class Template:
    """A tensor name with ``{i}``-style placeholders, each standing for a number."""

    def __init__(self, text: str) -> None:
        self.text = text
        pieces = re.split(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", text)
        self.literals, self.names = pieces[0::2], pieces[1::2]
        if any(lit == "" for lit in self.literals[1:-1]):
            raise ValueError(f"{text!r}: two placeholders must be separated by text")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"{text!r}: a placeholder appears twice")
        # literal text escaped, placeholders digits only: linear-time matching
        self._regex = re.compile("".join(
            re.escape(lit) + ("([0-9]+)" if k < len(self.names) else "")
            for k, lit in enumerate(self.literals)))

    def match(self, name: str) -> dict[str, str] | None:
        m = self._regex.fullmatch(name)
        return dict(zip(self.names, m.groups())) if m else None

    def fill(self, values: dict[str, str]) -> str:
        out = self.literals[0]
        for k, n in enumerate(self.names):
            out += values[n] + self.literals[k + 1]
        return out

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class LayoutSpec:
    """A layout as the table writes it; numbers are expressions over the config."""

    kind: str
    axis: int = 0
    groups: Any = None
    sizes: tuple[Any, ...] | None = None

    def resolve(self, values: dict[str, int], lengths: list[int]) -> Layout:
        """The concrete :class:`Layout` for parts of ``lengths`` rows on the axis.

        Raises:
            ParamError / LayoutError: the config lacks a value, or does not fit the parts.
        """
        sizes = [evaluate(e, values) for e in self.sizes] if self.sizes is not None else None
        why = ""
        if self.kind == "concat":
            return Layout("concat", self.axis, 1, tuple(sizes or lengths))
        if self.kind == "interleave":
            if len(set(lengths)) != 1:
                raise LayoutError(f"interleave needs parts of equal length, got {lengths}")
            return Layout("interleave", self.axis, lengths[0], (1,) * len(lengths))
        groups = evaluate(self.groups, values)
        why = f"groups {self.groups} = {groups}"
        if sizes is not None:
            why += f", sizes {', '.join(f'{e} = {v}' for e, v in zip(self.sizes, sizes))}"
        else:
            bad = [n for n in lengths if n % groups]
            if bad:
                raise LayoutError(f"{bad[0]} rows do not split into {self.groups} = {groups} "
                                  "groups — the config does not fit the tensors")
            sizes = [n // groups for n in lengths]
        return Layout("grouped", self.axis, groups, tuple(sizes), why)

    def to_data(self) -> Any:
        if self.kind == "grouped":
            data: dict[str, Any] = {"grouped": self.groups}
            if self.sizes is not None:
                data["sizes"] = list(self.sizes)
            if self.axis:
                data["axis"] = self.axis
            return data
        return {self.kind: self.axis} if self.axis else self.kind


@dataclass(frozen=True)
class FuseEntry:
    """``fuse:``: fill targets matching ``target`` from ``sources`` joined by ``layout``."""

    target: Template
    sources: tuple[Template, ...]
    layout: LayoutSpec
    transforms: tuple[Transform, ...]
    where: str
    #: placeholders of the sources alone, each counted over a config value
    #: (``{e: experts}``: the sources for e = 0 .. experts-1, in that order)
    over: tuple[tuple[str, Any], ...] = ()
    #: placeholders of the sources alone, each one number computed from the config and the
    #: target's placeholders (``{n: num_hidden_layers + k}``: a block numbered after others)
    at: tuple[tuple[str, Any], ...] = ()
    #: the target network's settings this entry is for (``{SETTING: VALUE}``, each one the
    #: table's ``settings:`` declares); the entry applies only where they all hold
    when: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class SplitEntry:
    """``split:``: fill ``targets`` from the parts of one source laid out by ``layout``."""

    source: Template
    targets: tuple[Template, ...]
    layout: LayoutSpec
    transforms: tuple[Transform, ...]
    where: str
    #: the target network's settings this entry is for, as :attr:`FuseEntry.when`
    when: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class TiedEntry:
    """``tied:``: ``source`` is the same tensor as ``same_as`` when config ``when`` is true;
    their placeholders, if any, take the numbers ``at`` computes from the config."""

    source: str
    same_as: str
    when: str | None
    where: str
    at: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class DeclaredEntry:
    """``declared:``: target tensors matching ``target`` hold ``init`` (Hugging Face has no
    counterpart: a MoE router's load statistics)."""

    target: Template
    init: str | float
    where: str


@dataclass(frozen=True)
class DerivedEntry:
    """``derived:``: ``source`` is computed from the config by :data:`~.derived.DERIVED`
    ``[value]``; checked against it, then dropped."""

    source: Template
    value: str
    where: str


@dataclass(frozen=True)
class MappingTable:
    """One or more mapping files merged; the format: :mod:`ms_port.match.mapping_yaml`.

    Attributes:
        origin: where the table came from (file paths, ``+``-joined when merged).
    """

    origin: str = "<empty>"
    description: str = ""
    segments: dict[str, str] = field(default_factory=dict)
    regex: tuple[RegexRename, ...] = ()
    tensors: dict[str, TensorEntry] = field(default_factory=dict)
    drop: tuple[Pattern, ...] = ()
    transforms: tuple[TransformEntry, ...] = ()
    select: dict[str, tuple[str, ...]] = field(default_factory=dict)
    params: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    fuse: tuple[FuseEntry, ...] = ()
    split: tuple[SplitEntry, ...] = ()
    tied: tuple[TiedEntry, ...] = ()
    #: model type -> config values its architecture implies (``implies:``)
    implies: dict[str, dict[str, Any]] = field(default_factory=dict)
    derived: tuple[DerivedEntry, ...] = ()
    declared: tuple[DeclaredEntry, ...] = ()
    #: the target network's settings the ``when:`` of entries read, with the value the
    #: network has unless its target says otherwise (``settings:``)
    settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> MappingTable:
        return cls()

    def rename(self, name: str) -> tuple[str, list[str]]:
        """Rename a PyTorch name; every rename reads the *original* name, never another
        rename's output (no chaining: the order of entries does not matter).

        The first ``rename.regex`` entry that matches the whole original name gives the new
        name (one replacement: ``(.*)`` -> ``net.\\1`` never adds an empty-match copy);
        a name no regex matches has its ``rename.segments`` renamed, each segment once.

        Returns:
            The renamed name and the entry that fired (``"segment fc->end_point"``).
        """
        for rule in self.regex:
            new = rule.pattern.replace_full(name, rule.replacement)
            if new is not None:
                return new, [f"regex {rule}"]
        fired: list[str] = []
        parts = name.split(".")
        for i, part in enumerate(parts):
            if part in self.segments:
                parts[i] = self.segments[part]
                fired.append(f"segment {part}->{self.segments[part]}")
        return ".".join(parts), fired

    def dropped_by(self, source_name: str) -> str | None:
        """The ``drop:`` pattern matching a PyTorch name, if any."""
        return next((p.pattern for p in self.drop if p.fullmatch(source_name)), None)

    def transforms_for(self, target_name: str) -> tuple[Transform, ...]:
        for entry in self.transforms:
            if entry.match.fullmatch(target_name):
                return entry.ops
        return ()

    def merged(self, other: MappingTable) -> MappingTable:
        """This table with ``other`` layered on top (``other`` wins on clashes)."""
        if self.origin == "<empty>":
            return other
        return MappingTable(
            origin=f"{self.origin}+{other.origin}",
            description=other.description or self.description,
            segments={**self.segments, **other.segments},
            regex=other.regex + self.regex,
            tensors={**self.tensors, **other.tensors},
            drop=self.drop + other.drop,
            transforms=other.transforms + self.transforms,
            select=other.select or self.select,
            params={**self.params, **other.params},
            fuse=other.fuse + self.fuse,
            split=other.split + self.split,
            tied=other.tied + self.tied,
            implies={**self.implies, **other.implies},
            derived=other.derived + self.derived,
            declared=other.declared + self.declared,
            settings={**self.settings, **other.settings},
        )

    def declared_value(self, target_name: str) -> tuple[str | float, str] | None:
        """``(value, where)`` a ``tensors:`` or ``declared:`` entry gives a target, if any."""
        entry = self.tensors.get(target_name)
        if entry is not None and entry.init is not None:
            return entry.init, f"tensors entry {{init: {entry.init}}} in {self.origin}"
        for d in self.declared:
            if d.target.match(target_name) is not None:
                return d.init, f"{{init: {d.init}}} ({d.where})"
        return None

    def selects(self, config: dict[str, Any] | None, target: str) -> bool:
        """Whether this table's ``select:`` fits a source config and a target family."""
        if not self.select or not config:
            return False
        wanted = self.select
        if "model_type" in wanted and config.get("model_type") not in wanted["model_type"]:
            return False
        archs = config.get("architectures") or []
        if "architectures" in wanted and not (isinstance(archs, list) and set(
                a for a in archs if isinstance(a, str)) & set(wanted["architectures"])):
            return False
        if "pairs" in wanted and f"{target}={config.get('model_type')}" not in wanted["pairs"]:
            return False
        return "target" not in wanted or target in wanted["target"]

    def pairs(self) -> tuple[tuple[str, str], ...]:
        """(target, model type) this table converts: ``select.pairs`` where given, else
        every target with every model type."""
        if "pairs" in self.select:
            return tuple(tuple(p.split("=", 1)) for p in self.select["pairs"])  # type: ignore
        return tuple((t, m) for t in self.select.get("target", ())
                     for m in self.select.get("model_type", ()))

"""Mapping tables: what the built-in rules cannot infer, kept as YAML.

Format (every section optional; names run PyTorch -> MindSpore)::

    version: 1
    description: torchvision ResNet -> MindSpore model-zoo ResNet
    rename:
      segments:                 # whole dotted-name segments
        downsample: down_sample_layer
        fc: end_point
      regex:                    # RE2, full match on the ORIGINAL name, first match wins
        - {from: 'blocks\\.(\\d+)\\.attn', to: 'layers.\\1.attention'}   # \\1: group 1
        - {from: 'features\\.denselayer(\\d+)\\.(.*)', to: 'cell_list.{1-1}.\\2'}
                                # {1-1}: group 1's number minus one (renumbered blocks)
    tensors:                    # exact pairs, MindSpore name: PyTorch name
      head.weight: classifier.weight
      stem.weight: {source: conv.weight, transforms: [{unsqueeze: 2}]}
      norm.moving_mean: {init: zeros}   # no PyTorch counterpart: a declared value
    drop:                       # PyTorch tensors left out on purpose (RE2, full match)
      - 'aux_head\\..*'
    transforms:                 # transforms by MindSpore-name regex
      - {match: '.*\\.conv1d\\.weight', ops: [{unsqueeze: 2}]}

Renames never chain: each one reads the original PyTorch name, so their order in the
file only matters when two regexes match the same name (the first wins). A name no regex
matches has its segments renamed.

``ms-port convert --save-map`` writes a Plan in this format (as ``tensors:`` entries);
edit one line and pass it back with ``--map``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..errors import MappingError
from .patterns import Pattern, PatternError, compile_pattern
from .transforms import Transform

_SECTIONS = {"version", "description", "rename", "tensors", "drop", "transforms"}
_RENAME_KEYS = {"segments", "regex"}


@dataclass(frozen=True)
class TensorEntry:
    """An explicit ``tensors:`` entry: fill ``target`` from ``source`` — or, where PyTorch
    has no counterpart, with a declared value (``init``: ``zeros``, ``ones`` or a number)."""

    target: str
    source: str
    transforms: tuple[Transform, ...] = ()
    init: str | float | None = None


#: declared values for target tensors PyTorch has no counterpart for
INIT_VALUES = ("zeros", "ones")


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


@dataclass(frozen=True)
class MappingTable:
    """One or more mapping files merged; see the module docstring for the format.

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
        )


def builtin_mappings() -> list[str]:
    """Names of the mapping tables shipped with ms-port."""
    root = resources.files("ms_port.mappings")
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def load_mapping(spec: str | Path) -> MappingTable:
    """Load a mapping table by built-in name (``"resnet"``) or path, validating it.

    Raises:
        MappingError: naming the file, the entry and the fix.
    """
    path = Path(spec)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise MappingError(f"{path}: no such mapping file; check the path", path=path)
        try:
            if path.stat().st_size > MAX_MAPPING_BYTES:
                raise MappingError(f"{path}: {path.stat().st_size} bytes is too large for a "
                                   f"mapping file (at most {MAX_MAPPING_BYTES})", path=path)
            text = path.read_text()
        except UnicodeDecodeError:
            raise MappingError(f"{path}: not UTF-8 text; a mapping file is YAML",
                               path=path) from None
        except OSError as exc:
            raise MappingError(f"{path}: cannot read mapping file ({exc.strerror})",
                               path=path) from None
        return parse_mapping(text, origin=str(path))
    resource = resources.files("ms_port.mappings") / f"{spec}.yaml"
    if not resource.is_file():
        raise MappingError(
            f"no mapping table {str(spec)!r}; built-in: {', '.join(builtin_mappings())} "
            "(or give a path to a .yaml file)")
    return parse_mapping(resource.read_text(), origin=f"mappings/{spec}.yaml")


#: the largest mapping file read (a saved plan of 100,000 tensors is ~10 MiB)
MAX_MAPPING_BYTES = 32 << 20


def _without_aliases(text: str, origin: str) -> None:
    """Refuse anchors and aliases before anything is built: a few hundred bytes of
    nested aliases expand to gigabytes ("billion laughs"), and a table never needs them."""
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            mark = event.start_mark
            raise MappingError(
                f"{origin}: line {mark.line + 1}: YAML anchors and aliases (&name, *name) are "
                "not allowed in mapping files; write the entries out", path=origin)


def parse_mapping(text: str, *, origin: str = "<string>") -> MappingTable:
    """Parse and validate mapping YAML text (see the module docstring)."""
    if len(text) > MAX_MAPPING_BYTES:
        raise MappingError(f"{origin}: {len(text)} characters is too large for a mapping "
                           f"file (at most {MAX_MAPPING_BYTES}); refused", path=origin)
    try:
        _without_aliases(text, origin)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise MappingError(f"{origin}: YAML syntax error{line} "
                           f"({getattr(exc, 'problem', exc)}); fix the file", path=origin) from None
    return mapping_from_data({} if data is None else data, origin=origin)


def mapping_from_data(data: Any, *, origin: str = "mapping=") -> MappingTable:
    """Validate an already-parsed mapping (a dict shaped like the YAML file)."""
    _expect(isinstance(data, dict), origin, "top level", "a mapping of sections")
    unknown = set(data) - _SECTIONS
    _expect(not unknown, origin, f"section {sorted(unknown)[0]!r}" if unknown else "",
            f"one of {', '.join(sorted(_SECTIONS))}")
    _expect(data.get("version", 1) == 1, origin, "version", "1")

    rename = data.get("rename") or {}
    _expect(isinstance(rename, dict) and not set(rename) - _RENAME_KEYS, origin, "rename",
            "a mapping with 'segments' and/or 'regex'")
    segments = rename.get("segments") or {}
    _expect(isinstance(segments, dict), origin, "rename.segments", "a mapping old: new")
    for old, new in segments.items():
        for s in (old, new):
            _expect(isinstance(s, str) and s and "." not in s, origin,
                    f"rename.segments {old!r}", "segment names without dots")
    regex = tuple(_regex_rename(r, origin, i) for i, r in enumerate(rename.get("regex") or []))

    tensors_data = data.get("tensors") or {}
    _expect(isinstance(tensors_data, dict), origin, "tensors", "a mapping target: source")
    tensors = {t: _tensor_entry(t, v, origin) for t, v in tensors_data.items()}
    seen: set[str] = set()
    dup = next((e.source for e in tensors.values() if e.init is None
                and (e.source in seen or seen.add(e.source))), None)  # linear, not count()
    _expect(dup is None, origin, f"tensors (source {dup!r})",
            "each source used by one target only")

    drop_data = data.get("drop") or []
    _expect(isinstance(drop_data, list), origin, "drop", "a list of regexes")
    drop = tuple(_compile(p, origin, f"drop[{i}]") for i, p in enumerate(drop_data))

    tf_data = data.get("transforms") or []
    _expect(isinstance(tf_data, list), origin, "transforms", "a list of {match, ops}")
    transforms = tuple(_transform_entry(e, origin, i) for i, e in enumerate(tf_data))
    return MappingTable(origin=origin, description=str(data.get("description") or ""),
                        segments=dict(segments), regex=regex, tensors=tensors, drop=drop,
                        transforms=transforms)


def _expect(ok: bool, origin: str, entry: str, wanted: str) -> None:
    if not ok:
        raise MappingError(f"{origin}: invalid {entry}: expected {wanted}; fix the entry "
                           "(format: see the README, 'Mapping files')", path=origin)


def _compile(pattern: Any, origin: str, entry: str) -> Pattern:
    _expect(isinstance(pattern, str), origin, entry, "a regex string")
    try:
        return compile_pattern(pattern)
    except PatternError as exc:
        raise MappingError(f"{origin}: {entry}: bad regex {pattern!r} ({exc}); fix the "
                           "pattern (RE2 syntax, linear-time: no backreferences or "
                           "lookarounds; quote it in single quotes)", path=origin) from None


def _ops(data: Any, origin: str, entry: str) -> tuple[Transform, ...]:
    _expect(isinstance(data, list), origin, entry, "a list of transforms like {unsqueeze: 2}")
    try:
        return tuple(Transform.from_data(op) for op in data)
    except ValueError as exc:
        raise MappingError(f"{origin}: {entry}: {exc}", path=origin) from None


def _regex_rename(data: Any, origin: str, i: int) -> RegexRename:
    entry = f"rename.regex[{i}]"
    _expect(isinstance(data, dict) and set(data) == {"from", "to"}, origin, entry,
            "{from: REGEX, to: REPLACEMENT}")
    pattern = _compile(data["from"], origin, entry)
    _expect(isinstance(data["to"], str), origin, entry, "a replacement string")
    try:
        pattern.check_template(data["to"])
    except PatternError as exc:
        raise MappingError(f"{origin}: {entry}: bad replacement {data['to']!r} ({exc}); "
                           "refer only to groups the pattern has", path=origin) from None
    return RegexRename(pattern, data["to"])


def _tensor_entry(target: Any, value: Any, origin: str) -> TensorEntry:
    entry = f"tensors.{target}"
    _expect(isinstance(target, str), origin, entry, "a tensor name")
    if isinstance(value, str):
        return TensorEntry(target, value)
    if isinstance(value, dict) and set(value) == {"init"}:
        init = value["init"]
        _expect(init in INIT_VALUES or (isinstance(init, (int, float))
                                        and not isinstance(init, bool)
                                        and math.isfinite(init)), origin, entry,
                "{init: zeros}, {init: ones} or {init: NUMBER} (a finite number)")
        return TensorEntry(target, "", init=init)
    _expect(isinstance(value, dict) and "source" in value
            and not set(value) - {"source", "transforms"}, origin, entry,
            "a source name, {source: NAME, transforms: [...]} or {init: zeros|ones|NUMBER}")
    _expect(isinstance(value["source"], str), origin, entry, "a source tensor name")
    return TensorEntry(target, value["source"],
                       _ops(value.get("transforms") or [], origin, entry))


def _transform_entry(data: Any, origin: str, i: int) -> TransformEntry:
    entry = f"transforms[{i}]"
    _expect(isinstance(data, dict) and set(data) == {"match", "ops"}, origin, entry,
            "{match: REGEX, ops: [...]}")
    return TransformEntry(_compile(data["match"], origin, entry), _ops(data["ops"], origin, entry))

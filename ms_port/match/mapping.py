"""Mapping tables: the shipped ones, chosen by a model's config and target, loaded
from a name or a file, and layered under the user's (the format:
:mod:`ms_port.match.mapping_yaml`; the entries: :mod:`ms_port.match.table`)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import MappingError, shown
from .mapping_yaml import MAX_MAPPING_BYTES, mapping_from_data, parse_mapping
from .table import MappingTable, Template


def shipped_tables() -> tuple[MappingTable, ...]:
    """The mapping tables shipped with ms-port, loaded once."""
    global _SHIPPED
    if _SHIPPED is None:
        _SHIPPED = tuple(load_mapping(name) for name in builtin_mappings())
    return _SHIPPED


_SHIPPED: tuple[MappingTable, ...] | None = None


def select_table(config: dict[str, Any], target_keys: tuple[str, ...]) -> MappingTable | None:
    """The shipped table whose ``select:`` fits the source's config and one of the
    target's keys (``mindformers:llama``, its class), if one does."""
    return next((t for t in shipped_tables()
                 if any(t.selects(config, key) for key in target_keys)), None)


def selected_model_types(target_key: str) -> list[str]:
    """The model types the shipped tables take into ``target_key`` (for messages)."""
    return sorted({m for t in shipped_tables() for target, m in t.pairs()
                   if target == target_key})


#: model types a family is sometimes handed that no shipped table takes yet: what they are,
#: and what ms-port offers for them (said where a family refuses the config)
PLANNED_MODEL_TYPES: dict[str, str] = {}


def families_for(model_type: object) -> list[str]:
    """The families (``mindformers:llama``…) whose shipped tables take ``model_type``."""
    return sorted({target for t in shipped_tables() for target, m in t.pairs()
                   if m == model_type and ":" in target})  # families, not class paths


def elsewhere(model_type: object, family: str) -> str:
    """What to say of a ``model_type`` that ``family`` refuses: the other family whose
    shipped tables take it (``--ms-model`` that one), or what it is where none does yet
    (:data:`PLANNED_MODEL_TYPES`); empty where ms-port knows nothing of it."""
    others = [f for f in families_for(model_type) if f != family]
    if others:
        return f"; it is {' or '.join(others)}'s: pass --ms-model {others[0]}"
    planned = PLANNED_MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
    return f"; {model_type} is {planned}" if planned else ""


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


def layered(mapping: Any, *, base: MappingTable | None = None,
            config: dict[str, Any] | None = None, target: Any = None) -> MappingTable:
    """``base`` (an architecture's table), else the shipped table whose ``select:`` fits
    the source's config and the target (a :class:`~ms_port.read.targets.Target`), with the
    user's tables layered on top: YAML paths, built-in names, dicts shaped like a mapping
    file, or MappingTables, one or a list.

    Raises:
        MappingError: a table that does not load, or a user's ``implies:`` that differs
            from what the family's network was computed with.
    """
    table = base if base is not None else MappingTable.empty()
    if base is None and config is not None and target is not None:
        table = select_table(config, tuple(target.keys)) or table
    shipped = table
    items = mapping if isinstance(mapping, (list, tuple)) else [mapping]
    for item in items:
        if item is None:
            continue
        if isinstance(item, MappingTable):
            given = item
        elif isinstance(item, dict):
            given = mapping_from_data(item, origin="mapping (a dict)")
        elif isinstance(item, (str, Path)):
            given = load_mapping(item)
        else:
            raise MappingError(f"mapping= takes a YAML path, a built-in table's name, a dict "
                              f"shaped like a mapping file or a MappingTable (or a list of "
                              f"them); got {type(item).__name__}")
        if target is not None and target.family and config is not None:
            _implies_agree(given, shipped, config, target.family)
        table = table.merged(given)
    return table


def _implies_agree(given: MappingTable, shipped: MappingTable, config: dict[str, Any],
                   family: str) -> None:
    """Refuse a user's ``implies:`` that differs from what the family's network was
    computed with: that comes from the tables in mappings/, and would be dropped here."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in given.implies:
        return
    wanted, used = given.implies[model_type], shipped.implies.get(model_type, {})
    if wanted != used:
        raise MappingError(
            f"{given.origin}: implies.{shown(model_type)} is {shown(wanted)}, but {family} "
            f"was computed with {shown(used)} (from {shipped.origin}): what a model type "
            "implies is read from the tables in mappings/, not from --map; put the table "
            "there (docs/llm.md: 'Adding a family')", path=given.origin)


__all__ = [
    "MAX_MAPPING_BYTES",
    "PLANNED_MODEL_TYPES",
    "MappingTable",
    "Template",
    "builtin_mappings",
    "elsewhere",
    "families_for",
    "layered",
    "load_mapping",
    "mapping_from_data",
    "parse_mapping",
    "select_table",
    "selected_model_types",
    "shipped_tables",
]

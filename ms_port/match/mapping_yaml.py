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

Tables for language models add numbers from the model's ``config.json``, fused and
split tensors, and tied ones (see :mod:`ms_port.match.layouts`, :mod:`ms_port.match.params`)::

    select:                     # picked automatically when the source's config says so
      model_type: [llama, mistral, qwen2]
      target: [mindformers:llama]
      # pairs: {TARGET: MODEL_TYPE, ...}   where one table serves several targets, which
      #                                    model type each takes (the others refused)
    params:                     # integers from config.json (first alternative that is set)
      kv_heads: [num_key_value_heads, num_attention_heads]
      groups: [{if: multi_query_attention, then: multi_query_group_num},
               num_attention_heads]     # an alternative only where a switch is true
      head_dim: [head_dim, hidden_size / num_attention_heads]
    fuse:                       # one MindSpore tensor from several PyTorch ones
      - target: 'model.layers.{i}.attention.w_qkv.weight'     # {i}: a number, same in all
        sources: ['model.layers.{i}.self_attn.q_proj.weight', ...k_proj..., ...v_proj...]
        layout: {grouped: kv_heads, sizes: ['num_attention_heads / kv_heads * head_dim',
                                            head_dim, head_dim]}
      - target: 'decoder.layers.{i}.mlp.experts.weight2'      # experts stacked:
        sources: ['model.layers.{i}.mlp.experts.{e}.down_proj.weight']
        over: {e: experts}      # the sources for e = 0 .. experts-1, in that order
        layout: {concat: 1}
        transforms: [{transpose: [1, 0]}]   # a reshape may name config values:
                                            # {reshape: [experts, -1, hidden]}
      - target: 'decoder.layers.{i}.mlp.linear_fc1.weight'    # one layout of two, by the
        sources: [...gate_proj..., ...up_proj...]             # target network's setting
        layout: concat
        when: {use_interleaved_weight_layout_mlp: false}
      - target: 'mtp.layers.{k}.enorm.weight'                 # one source: a rename that
        sources: ['model.layers.{n}.enorm.weight']            # applies where the target
        at: {n: num_hidden_layers + k}  # has the tensor; at: numbers a source-only
                                        # placeholder from the config and the target's
    split:                      # several MindSpore tensors from one PyTorch one
      - source: 'h.{i}.attn.c_attn.weight'
        targets: ['h.{i}.q.weight', 'h.{i}.k.weight', 'h.{i}.v.weight']
        layout: {concat: 1}
        transforms: [{transpose: [1, 0]}]                  # applied to each part
        when: {qkv_concat: false}                          # as a fuse entry's
    tied:                       # a PyTorch tensor that is another one (tied embeddings)
      - {source: lm_head.weight, same_as: model.embed_tokens.weight, when: tie_word_embeddings}
      - {source: 'model.layers.{n}.embed_tokens.weight', same_as: model.embed_tokens.weight,
         at: {n: num_hidden_layers}}   # a numbered copy; absent from a checkpoint: no note
    implies:                    # per selected model type: what its code fixes and its
      qwen2: {qkv_bias: true}   # config.json does not say (config.json cannot change it)
    settings:                   # the target network's settings when: reads, and their
      use_interleaved_weight_layout_mlp: true   # defaults (its target, or --ms-option,
                                                # says otherwise)
    declared:                   # target tensors Hugging Face has no counterpart for
      - {target: 'decoder.layers.{i}.mlp.router.fi_accu', init: zeros}
    derived:                    # buffers computed from config.json (old checkpoints hold
      - {source: 'model.layers.{i}.self_attn.rotary_emb.inv_freq', value: rope_inv_freq}
                                # them): checked against the config, then dropped

Transforms: ``unsqueeze``, ``squeeze``, ``transpose``, ``reshape`` (which may name config
values), and ``{rope_halves: [BLOCK, ROWS]}`` (the first ROWS rows, block by block, even
rows then odd ones: rotary pairs as halves, MindFormers' ``use_rearrange_rope``; its
inverse ``rope_pairs``), ``{roll: [BLOCK, SHIFT]}`` (each block of BLOCK rows rolled by
SHIFT: a head's two halves swapped; its inverse a roll by BLOCK - SHIFT).

Layouts: ``concat`` / ``{concat: AXIS}``, ``interleave`` / ``{interleave: AXIS}`` (one row
of each part in turn), ``{grouped: GROUPS, sizes: [...], axis: 0}`` (per group, ``sizes[i]``
rows of part i). A fused target's ``transforms`` apply after fusing. A ``fuse:`` entry with
one source, no ``over:`` and no ``layout:`` is a rename that fires only where the target has
that tensor (two layouts of one network in one table).

Renames never chain: each one reads the original PyTorch name, so their order in the
file only matters when two regexes match the same name (the first wins). A name no regex
matches has its segments renamed.

``ms-port convert --save-map`` writes a Plan in this format (as ``tensors:`` entries);
edit one line and pass it back with ``--map``.
"""
from __future__ import annotations

import math
from typing import Any, NoReturn

import yaml

from ..errors import MappingError, MsPortError, shown
from .layouts import KINDS
from .params import ParamError, check_alternative, check_expression, names_in
from .patterns import Pattern, PatternError, compile_pattern
from .table import (
    DeclaredEntry,
    DerivedEntry,
    FuseEntry,
    LayoutSpec,
    MappingTable,
    RegexRename,
    SplitEntry,
    Template,
    TensorEntry,
    TiedEntry,
    TransformEntry,
)
from .transforms import Transform

_SECTIONS = {"version", "description", "rename", "tensors", "drop", "transforms", "select",
             "params", "fuse", "split", "tied", "implies", "derived", "declared", "settings"}
_SELECT_KEYS = {"model_type", "architectures", "target", "pairs"}
_RENAME_KEYS = {"segments", "regex"}


#: declared values for target tensors PyTorch has no counterpart for
INIT_VALUES = ("zeros", "ones")




MAX_MAPPING_BYTES = 32 << 20
#: PyYAML's libyaml parser where PyYAML was built with it (the wheels are), its pure-Python
#: one otherwise: the same safe loader, ~10x faster (the shipped tables are read on every
#: conversion, to select one)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _without_aliases(text: str, origin: str, loader: Any) -> None:
    """Refuse anchors and aliases before anything is built: a few hundred bytes of
    nested aliases expand to gigabytes ("billion laughs"), and a table never needs them."""
    for event in yaml.parse(text, Loader=loader):
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
        data = _load(text, origin, _LOADER)
    except yaml.YAMLError:
        try:  # the pure-Python parser's words and line for what libyaml refused
            data = _load(text, origin, yaml.SafeLoader)
        except yaml.YAMLError as exc:
            _syntax_error(exc, origin)
    return mapping_from_data({} if data is None else data, origin=origin)


def safe_documents(text: str, *, origin: str, error: type[MsPortError] = MappingError,
                   limit: int = MAX_MAPPING_BYTES) -> list[Any]:
    """Every document of a YAML text read with the safe loader, after the checks a mapping
    file gets (size, no anchors or aliases): for configuration files of other tools that
    ms-port reads (MindYOLO's, whose own loader is PyYAML's FullLoader). Errors are
    ``error`` naming ``origin`` and the line."""
    if len(text) > limit:
        raise error(f"{origin}: {len(text)} characters is too large for a configuration file "
                    f"(at most {limit}); refused", path=origin)
    try:
        _without_aliases(text, origin, _LOADER)
        return list(yaml.load_all(text, Loader=_LOADER))
    except MappingError as exc:
        raise error(str(exc), path=origin) from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise error(f"{origin}: YAML syntax error{line} ({getattr(exc, 'problem', exc)}); "
                    "fix the file", path=origin) from None


def _load(text: str, origin: str, loader: Any) -> Any:
    _without_aliases(text, origin, loader)
    return yaml.load(text, Loader=loader)  # a safe loader (CSafeLoader or SafeLoader)


def _syntax_error(exc: yaml.YAMLError, origin: str) -> NoReturn:
    where = getattr(exc, "problem_mark", None)
    line = f" at line {where.line + 1}" if where is not None else ""
    raise MappingError(f"{origin}: YAML syntax error{line} "
                       f"({getattr(exc, 'problem', exc)}); fix the file", path=origin) from None


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
    select = _select(data.get("select"), origin)
    params = _params(data.get("params"), origin)
    settings = _settings(data.get("settings"), origin)
    fuse = tuple(_fuse_entry(e, origin, i, settings)
                 for i, e in enumerate(_list(data, "fuse", origin)))
    split = tuple(_split_entry(e, origin, i, settings)
                  for i, e in enumerate(_list(data, "split", origin)))
    tied = tuple(_tied_entry(e, origin, i) for i, e in enumerate(_list(data, "tied", origin)))
    implies = _implies(data.get("implies"), select, origin)
    derived = tuple(_derived_entry(e, origin, i)
                    for i, e in enumerate(_list(data, "derived", origin)))
    declared = tuple(_declared_entry(e, origin, i)
                     for i, e in enumerate(_list(data, "declared", origin)))
    return MappingTable(origin=origin, description=str(data.get("description") or ""),
                        segments=dict(segments), regex=regex, tensors=tensors, drop=drop,
                        transforms=transforms, select=select, params=params, fuse=fuse,
                        split=split, tied=tied, implies=implies, derived=derived,
                        declared=declared, settings=settings)


def _list(data: dict, key: str, origin: str) -> list:
    value = data.get(key) or []
    _expect(isinstance(value, list), origin, key, "a list of entries")
    return value


def _settings(data: Any, origin: str) -> dict[str, Any]:
    """``settings:``: the target network's settings entries may depend on, each with its
    default (a boolean, an integer or a name)."""
    if data is None:
        return {}
    _expect(isinstance(data, dict) and all(
        isinstance(k, str) and k.isidentifier() and isinstance(v, (bool, int, str))
        for k, v in data.items()), origin, "settings",
        "a mapping SETTING: DEFAULT (a boolean, an integer or a name)")
    return dict(data)


def _when(data: Any, settings: dict[str, Any], origin: str, entry: str
          ) -> tuple[tuple[str, Any], ...]:
    """An entry's ``when: {SETTING: VALUE}``: settings the table declares, with values of
    their defaults' types."""
    if data is None:
        return ()
    _expect(isinstance(data, dict) and data and all(
        k in settings and type(v) is type(settings[k]) for k, v in data.items()), origin,
        f"{entry}.when", "{SETTING: VALUE}, each SETTING one the table's settings: declares "
        f"({', '.join(sorted(settings)) or 'none'}), with a value of its default's type")
    return tuple(data.items())


def _select(data: Any, origin: str) -> dict[str, tuple[str, ...]]:
    if data is None:
        return {}
    _expect(isinstance(data, dict) and data and not set(data) - _SELECT_KEYS, origin, "select",
            f"a mapping with some of {', '.join(sorted(_SELECT_KEYS))}")
    out = {}
    for key, value in data.items():
        if key == "pairs":
            continue
        values = [value] if isinstance(value, str) else value
        _expect(isinstance(values, list) and values and all(isinstance(v, str) for v in values),
                origin, f"select.{key}", "a name or a list of names")
        out[key] = tuple(values)
    if "pairs" in data:  # which model type each target takes, where one table serves several
        pairs = data["pairs"]
        _expect(isinstance(pairs, dict) and pairs and all(
            k in out.get("target", ()) and isinstance(v, str)
            and v in out.get("model_type", ()) for k, v in pairs.items()),
            origin, "select.pairs", "a mapping of select.target names to select.model_type "
            "names (the model type each target takes)")
        out["pairs"] = tuple(f"{k}={v}" for k, v in pairs.items())
    return out


def _implies(data: Any, select: dict[str, tuple[str, ...]], origin: str
             ) -> dict[str, dict[str, Any]]:
    if data is None:
        return {}
    types = select.get("model_type", ())
    _expect(isinstance(data, dict) and bool(types), origin, "implies",
            "a mapping model type: {key: value}, for model types the table's "
            "select.model_type names")
    out: dict[str, dict[str, Any]] = {}
    for model_type, values in data.items():
        entry = f"implies.{shown(model_type)}"
        _expect(model_type in types, origin, entry,
                f"one of select.model_type ({', '.join(types)})")
        # what an architecture has or lacks: true or false (the family names the keys)
        _expect(isinstance(values, dict) and all(
            isinstance(k, str) and k.isidentifier() and isinstance(v, bool)
            for k, v in values.items()), origin, entry, "a mapping of names to true or false")
        out[model_type] = dict(values)
    return out


def _params(data: Any, origin: str) -> dict[str, tuple[Any, ...]]:
    if data is None:
        return {}
    _expect(isinstance(data, dict), origin, "params", "a mapping name: expression")
    out: dict[str, tuple[Any, ...]] = {}
    for name, value in data.items():
        entry = f"params.{name}"
        _expect(isinstance(name, str) and name.isidentifier(), origin, entry,
                "a name made of letters, digits and _")
        alternatives = value if isinstance(value, list) else [value]
        _expect(bool(alternatives), origin, entry, "an expression or a list of them")
        for expr in alternatives:
            try:
                check_alternative(expr)
            except ParamError as exc:
                raise MappingError(f"{origin}: {entry}: {exc}; fix the entry",
                                   path=origin) from None
        out[name] = tuple(alternatives)
    return out


def _template(text: Any, origin: str, entry: str) -> Template:
    _expect(isinstance(text, str) and text, origin, entry, "a tensor name ({i} for a number)")
    try:
        return Template(text)
    except ValueError as exc:
        raise MappingError(f"{origin}: {entry}: {exc}", path=origin) from None


def _layout(data: Any, origin: str, entry: str) -> LayoutSpec:
    wanted = ("concat, interleave, {concat: AXIS}, {interleave: AXIS} or "
              "{grouped: GROUPS, sizes: [...], axis: AXIS}")
    if isinstance(data, str):
        _expect(data in ("concat", "interleave"), origin, f"{entry}.layout", wanted)
        return LayoutSpec(data)
    _expect(isinstance(data, dict) and data, origin, f"{entry}.layout", wanted)
    kind = next((k for k in KINDS if k in data), None)
    _expect(kind is not None, origin, f"{entry}.layout", wanted)
    allowed = {"grouped", "sizes", "axis"} if kind == "grouped" else {kind}
    _expect(not set(data) - allowed, origin, f"{entry}.layout", wanted)
    axis = data.get("axis", 0) if kind == "grouped" else data[kind]
    _expect(isinstance(axis, int) and not isinstance(axis, bool) and 0 <= axis < 8, origin,
            f"{entry}.layout axis", "an axis from 0 to 7")
    if kind != "grouped":
        return LayoutSpec(kind, axis)
    sizes = data.get("sizes")
    _expect(sizes is None or (isinstance(sizes, list) and sizes), origin,
            f"{entry}.layout.sizes", "a list of expressions, one per part")
    try:
        for expr in [data["grouped"], *(sizes or [])]:
            check_expression(expr)
    except ParamError as exc:
        raise MappingError(f"{origin}: {entry}.layout: {exc}; fix the entry",
                           path=origin) from None
    return LayoutSpec("grouped", axis, data["grouped"], tuple(sizes) if sizes else None)


def _fuse_entry(data: Any, origin: str, i: int, settings: dict[str, Any]) -> FuseEntry:
    entry = f"fuse[{i}]"
    _expect(isinstance(data, dict) and {"target", "sources"} <= set(data)
            and not set(data) - {"target", "sources", "layout", "transforms", "over", "at",
                                 "when"},
            origin, entry, "{target: NAME, sources: [NAME, ...], layout: ..., "
            "transforms: [...], over: {PLACEHOLDER: COUNT}, at: {PLACEHOLDER: NUMBER}, "
            "when: {SETTING: VALUE}}")
    when = _when(data.get("when"), settings, origin, entry)
    target = _template(data["target"], origin, f"{entry}.target")
    over = _bound(data, "over", target.names, origin, entry)
    at = _bound(data, "at", target.names, origin, entry)
    _expect(not {k for k, _ in over} & {k for k, _ in at}, origin, f"{entry}.at",
            "placeholders over: does not count")
    # one source is a rename, which states no layout; with a layout, a list cut short
    _expect(isinstance(data["sources"], list) and len(data["sources"]) >= 1
            and (len(data["sources"]) > 1 or bool(over) or "layout" not in data), origin,
            f"{entry}.sources", "a list of two or more source names (one with over:, or one "
            "and no layout: for a rename)")
    sources = tuple(_template(s, origin, f"{entry}.sources") for s in data["sources"])
    own = {k for k, _ in over + at}
    # a target placeholder an at: expression uses may leave the source names
    spent = {n for _, expr in at for n in names_in(expr)} & set(target.names)
    for s in sources:
        _expect(own <= set(s.names) <= set(target.names) | own
                and set(target.names) - spent <= set(s.names), origin, f"{entry}.sources ({s})",
                f"the placeholders {', '.join(sorted(set(target.names) | own)) or 'none'} "
                "(the target's, and over:'s and at:'s; a target's that at: uses may be left "
                "out)")
    _expect((len(sources) == 1 and not over) or "layout" in data, origin, entry,
            "a layout: for several sources (concat, interleave or grouped)")
    layout = _layout(data["layout"], origin, entry) if "layout" in data else LayoutSpec("concat")
    _expect(over or layout.sizes is None or len(layout.sizes) == len(sources), origin,
            f"{entry}.layout.sizes", f"one size per source ({len(sources)})")
    ops = _ops(data.get("transforms") or [], origin, entry)
    for op in ops:
        for name in op.names:
            _expression(name, origin, f"{entry}.transforms")
    return FuseEntry(target, sources, layout, ops, f"{entry} in {origin}", over, at, when)


def _bound(data: dict, key: str, target_names: list[str], origin: str,
           entry: str) -> tuple[tuple[str, Any], ...]:
    """An entry's ``over:`` or ``at:``: source-only placeholders, each with an expression."""
    given = data.get(key) or {}
    _expect(isinstance(given, dict) and all(
        isinstance(k, str) and k not in target_names for k in given), origin, f"{entry}.{key}",
        f"{{PLACEHOLDER: {'COUNT' if key == 'over' else 'NUMBER'}}}, placeholders the target "
        "does not have")
    return tuple((k, _expression(v, origin, f"{entry}.{key}.{k}")) for k, v in given.items())


def _expression(value: Any, origin: str, entry: str) -> Any:
    try:
        check_expression(value)
    except ParamError as exc:
        raise MappingError(f"{origin}: {entry}: {exc}", path=origin) from None
    return value


def _split_entry(data: Any, origin: str, i: int, settings: dict[str, Any]) -> SplitEntry:
    entry = f"split[{i}]"
    _expect(isinstance(data, dict) and {"source", "targets", "layout"} <= set(data)
            and not set(data) - {"source", "targets", "layout", "transforms", "when"}, origin,
            entry, "{source: NAME, targets: [NAME, ...], layout: ..., transforms: [...], "
            "when: {SETTING: VALUE}}")
    when = _when(data.get("when"), settings, origin, entry)
    source = _template(data["source"], origin, f"{entry}.source")
    _expect(isinstance(data["targets"], list) and len(data["targets"]) >= 2, origin,
            f"{entry}.targets", "a list of two or more target names")
    targets = tuple(_template(t, origin, f"{entry}.targets") for t in data["targets"])
    for t in targets:
        _expect(set(t.names) == set(source.names), origin, f"{entry}.targets ({t})",
                f"the same placeholders as the source ({', '.join(source.names) or 'none'})")
    layout = _layout(data["layout"], origin, entry)
    _expect(layout.kind != "interleave" or layout.sizes is None, origin, f"{entry}.layout",
            "no sizes for interleave")
    _expect(layout.sizes is None or len(layout.sizes) == len(targets), origin,
            f"{entry}.layout.sizes", f"one size per target ({len(targets)})")
    return SplitEntry(source, targets, layout,
                      _ops(data.get("transforms") or [], origin, entry), f"{entry} in {origin}",
                      when)


def _tied_entry(data: Any, origin: str, i: int) -> TiedEntry:
    entry = f"tied[{i}]"
    _expect(isinstance(data, dict) and {"source", "same_as"} <= set(data)
            and not set(data) - {"source", "same_as", "when", "at"}
            and all(isinstance(v, str) and v for k, v in data.items() if k != "at"), origin,
            entry, "{source: NAME, same_as: NAME, when: CONFIG_KEY, at: {PLACEHOLDER: NUMBER}}")
    _expect(data["source"] != data["same_as"], origin, entry,
            "two different tensors (source is same_as itself)")
    at = _bound(data, "at", [], origin, entry)
    for key in ("source", "same_as"):
        _expect(set(_template(data[key], origin, f"{entry}.{key}").names) <= {k for k, _ in at},
                origin, f"{entry}.{key}", "placeholders that at: gives a number")
    return TiedEntry(data["source"], data["same_as"], data.get("when"), f"{entry} in {origin}",
                     at)


def _declared_entry(data: Any, origin: str, i: int) -> DeclaredEntry:
    entry = f"declared[{i}]"
    _expect(isinstance(data, dict) and set(data) == {"target", "init"}, origin, entry,
            "{target: NAME, init: zeros|ones|NUMBER}")
    init = data["init"]
    _expect(init in INIT_VALUES or (isinstance(init, (int, float)) and not isinstance(init, bool)
                                    and math.isfinite(init)), origin, f"{entry}.init",
            "zeros, ones or a finite number")
    return DeclaredEntry(_template(data["target"], origin, f"{entry}.target"), init,
                         f"{entry} in {origin}")


def _derived_entry(data: Any, origin: str, i: int) -> DerivedEntry:
    from .derived import DERIVED

    entry = f"derived[{i}]"
    _expect(isinstance(data, dict) and set(data) == {"source", "value"}
            and isinstance(data["value"], str) and data["value"] in DERIVED, origin, entry,
            f"{{source: NAME, value: {' | '.join(DERIVED)}}}")
    return DerivedEntry(_template(data["source"], origin, f"{entry}.source"), data["value"],
                        f"{entry} in {origin}")


def _expect(ok: bool, origin: str, entry: str, wanted: str) -> None:
    if not ok:
        raise MappingError(f"{origin}: invalid {entry}: expected {wanted}; fix the entry "
                           "(format: see docs/mapping.md)", path=origin)


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

"""What a command works on, resolved from what the user gave: the source read with its
config, the MindSpore target, the mapping tables, and the plan between them. The doors
(:mod:`ms_port.api`) and the verify engine (:mod:`ms_port.check.engine`) both stand on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import TargetError
from .match.mapping import MappingTable, layered
from .match.plan import Plan, PlanOptions, make_plan
from .read.sources import Source, read_source
from .read.targets import Target, from_arch, from_cell, from_factory, from_template


def read_with_config(source: str | Path | Source, *, config: Any = None, **kw: Any) -> Source:
    """``source`` read (a path or Hub id; ``kw`` as for read_source), with the user's
    config."""
    src = source if isinstance(source, Source) else read_source(source, **kw)
    if config is not None:  # the user's config wins over one found beside the file
        from .read.sources import read_config

        if isinstance(config, dict):
            src.config, src.config_path = config, "config (a dict)"
        else:
            src.config, src.config_path = read_config(config), str(config)
    return src



def resolve_target(
    *,
    arch: str | None = None,
    target: str | Path | Target | None = None,
    ms_model: Any = None,
    config: dict[str, Any] | None = None,
    ms_options: dict[str, Any] | None = None,
) -> Target:
    """One Target from exactly one of ``arch``, ``target`` (template) or ``ms_model``.

    A known family (``mindformers:llama``) is computed from ``config`` (the model's
    ``config.json``) with ``ms_options`` (``{"qkv_concat": True}``), building nothing.
    """
    given = [x is not None for x in (arch, target, ms_model)]
    if sum(given) != 1:
        raise TargetError("give exactly one target: --arch NAME, --target TEMPLATE.ckpt "
                          "or --ms-model module:callable")
    if arch is not None:
        return from_arch(arch)
    if isinstance(target, Target):
        return target
    if target is not None:
        return from_template(target)
    from .read.targets import FAMILIES, from_family

    if isinstance(ms_model, str) and ms_model in FAMILIES:
        return from_family(ms_model, config, ms_options)
    if ms_options:
        raise TargetError(f"--ms-option is for the known families ({', '.join(FAMILIES)}); "
                          "a factory takes its own arguments")
    if isinstance(ms_model, str):
        return from_factory(ms_model)
    from .read.targets import instantiate, without_weights

    # a Cell, or a factory / class that builds one: the same contract as verify's
    return from_cell(without_weights(lambda: instantiate(ms_model, "--ms-model")))


def resolve_mapping(mapping: Any, *, arch: str | None = None,
                    config: dict[str, Any] | None = None,
                    target: Target | None = None) -> MappingTable:
    """The architecture's table (if any), or the shipped table whose ``select:`` fits the
    source's config and the target, with the user's tables layered on top
    (:func:`ms_port.match.mapping.layered`)."""
    base = None
    if arch is not None:
        from .archs import get_arch

        base = get_arch(arch).mapping_table()
    return layered(mapping, base=base, config=config, target=target)


def plan_for(src: Source, *, arch: str | None = None,
             target: str | Path | Target | None = None, ms_model: Any = None,
             mapping: Any = None, ms_options: dict[str, Any] | None = None,
             **options: Any) -> Plan:
    """The plan from a read source to the target picked by exactly one of ``arch``,
    ``target`` and ``ms_model``; ``options`` as for
    :func:`~ms_port.match.plan.make_plan`. A family target the config does not fit is
    refused in one line."""
    tgt = resolve_target(arch=arch, target=target, ms_model=ms_model, config=src.config,
                         ms_options=ms_options)
    table = resolve_mapping(mapping, arch=arch, config=src.config, target=tgt)
    made = make_plan(src, tgt, table, options=PlanOptions(**options))
    shapes = [c for c in made.conflicts if c.kind == "shape"]
    if tgt.kind == "family" and shapes:
        # the target was computed from the config: a shape clash means the config is wrong
        raise TargetError(f"{src.config_path}: the config does not fit the checkpoint "
                          f"({len(shapes)} tensors), e.g. {shapes[0].message.split(';')[0]} — "
                          "check config.json (num_key_value_heads, hidden_size, "
                          "intermediate_size, vocab_size)")
    return made


def family_fits(src: Source, family: str, ms_options: Any) -> None:
    """Raise (one line) when a family target computed from the config does not fit."""
    plan_for(src, ms_model=family, ms_options=ms_options, allow_missing=True,
             allow_unused=True)

"""``diff``: two checkpoints compared tensor by tensor (:func:`ms_port.diff` is the door).

A PyTorch file and a MindSpore ``.ckpt`` (either order) are compared through the
conversion plan; two files of one framework are paired by name.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import MsPortError
from ..match.plan import LENIENT, make_plan
from ..options import DiffOptions
from ..read.distributed import find_training_output
from ..read.hub import is_hub_id
from ..read.sources import MINDSPORE_FORMATS, Source, detect_format, read_source
from ..read.targets import Target, from_infos, mark_family
from ..resolve import read_with_config, resolve_mapping, resolve_target
from .tensors import TensorDiff, compare_by_name, compare_through_plan


def diff(a: str | Path | Source, b: str | Path | Source, opts: DiffOptions) -> TensorDiff:
    """Compare ``a`` and ``b`` as :func:`ms_port.diff` documents."""
    ids = [p for p in (a, b) if is_hub_id(p)]
    if opts.revision is not None and not ids:
        raise MsPortError(f"revision= (--revision) is for a Hugging Face id, and neither "
                          f"{a} nor {b} is one — drop it")

    def read(path: str | Path | Source) -> Source:
        if isinstance(path, Source):
            return path
        if path in ids:  # a Hugging Face model: never a MindSpore checkpoint
            return read_source(path, **opts.reading())
        if find_training_output(Path(path)) is not None:  # names are kept as saved
            return read_source(path, strip_prefixes=False, **opts.cluster())
        if not Path(path).is_dir() and detect_format(path) == "mindspore-ckpt":
            return read_source(path, strip_prefixes=False)  # names kept exactly as saved
        # a PyTorch file or a Hugging Face directory, with its config (a family needs it)
        return read_with_config(path, config=opts.config, key=opts.key,
                                unsafe_pickle=opts.unsafe_pickle)

    if (opts.strategy, opts.step) != (None, None) and not any(
            find_training_output(Path(p)) for p in (a, b) if p not in ids):
        raise MsPortError(f"--strategy and --step are for a distributed training output (a "
                          f"folder of rank_N/ folders), and neither {a} nor {b} is one — "
                          "drop them")
    src_a, src_b = read(a), read(b)
    ms_a, ms_b = (s.format in MINDSPORE_FORMATS for s in (src_a, src_b))
    if ms_a == ms_b:
        given = [n for n in ("arch", "ms_model", "mapping", "config", "ms_options")
                 if getattr(opts, n) not in (None, [], (), {})]
        if given:
            raise MsPortError(f"{src_a.path} and {src_b.path} are both "
                              f"{'MindSpore' if ms_a else 'PyTorch'} checkpoints, compared "
                              f"by name; {', '.join(given)} "
                              f"{'apply' if len(given) > 1 else 'applies'} only to a PyTorch "
                              f"and MindSpore pair — drop {'them' if len(given) > 1 else 'it'}")
        return compare_by_name(src_a, src_b)
    torch_src, ms_src = (src_b, src_a) if ms_a else (src_a, src_b)
    tgt, hints = _target(torch_src, ms_src, opts)
    table = resolve_mapping(opts.mapping, arch=opts.arch, config=torch_src.config, target=tgt)
    p = make_plan(torch_src, tgt, table, options=LENIENT)
    values = {info.name: info.load for info in ms_src}
    found = compare_through_plan(p, values, a=torch_src.path, b=ms_src.path)
    if not found.ok:  # what the family says of a layout its names cannot show
        found.notes += [n for n in (hints or tgt.notes) if n not in found.notes]
    return found


def _target(torch_src: Source, ms_src: Source, opts: DiffOptions) -> tuple[Target, list[str]]:
    """The MindSpore side to compare through, and the notes to give where they differ:
    ``--arch`` or ``--ms-model``, else the checkpoint's own names, as a known family's
    where they are one (its table, and the settings that table reads)."""
    if opts.arch is not None and opts.ms_options:
        raise MsPortError("--ms-option is for a known family (--ms-model mindformers:…), not "
                          "an architecture; drop it")
    if opts.arch is not None or opts.ms_model is not None:
        return resolve_target(arch=opts.arch, ms_model=opts.ms_model, config=torch_src.config,
                              ms_options=opts.ms_options), []
    tgt = from_infos(ms_src.tensors.values(), ms_src.path)
    family = mark_family(tgt, torch_src.config, opts.ms_options)
    if family is not None:
        return tgt, family.notes
    # a family's model type in a config that family cannot read: say why
    refused = _family_config_refused(torch_src)
    if opts.ms_options:
        raise MsPortError("--ms-option is for a known family's checkpoint, and this one is "
                          "none (name it with --ms-model, or drop the options)"
                          f"{'; ' + refused[0] if refused else ''}")
    return tgt, [f"{why}: the checkpoint was compared by its own names — fix the config, or "
                 "pass --config" for why in refused]


def _family_config_refused(src: Source) -> list[str]:
    """Why a known family did not recognise the checkpoint (one line, or none), where
    ``src``'s config names that family's model type and the family cannot read it (a
    string where a switch belongs): the comparison by names alone then reports the
    family's fused tensors as unplanned, and this note says why (the config may also be
    right for a network of the user's own, which is compared by names as before)."""
    from ..match.mapping import selected_model_types
    from ..read.targets import FAMILIES, family_module

    config = src.config or {}
    for spec in FAMILIES:
        if config.get("model_type") not in selected_model_types(spec):
            continue
        try:
            family_module(spec).target(config)
        except MsPortError as exc:
            why = exc.message.removeprefix("config.json: ").rstrip(".")
            return [f"{src.config_path} names {spec}'s model type, and {spec} cannot read "
                    f"it ({why})"]
    return []


__all__ = ["diff"]

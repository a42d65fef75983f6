"""Export: MindSpore -> PyTorch through the same matching, inverted.

No reverse rule set exists. The PyTorch side's names and shapes (the architecture's
reference network, a user's module, or a template file) are matched *forward* against
the MindSpore checkpoint with the very rules and mapping tables convert uses; then each
match is turned around: the MindSpore tensor fills the PyTorch one and every transform
is replaced by its inverse (:func:`ms_port.match.transforms.invert`). The result is an
ordinary :class:`~ms_port.match.plan.Plan`, written and read back by the same writers.

BatchNorm's ``num_batches_tracked`` has no MindSpore counterpart: it is restored as an
int64 zero (the step count is unknown), and the report says so.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TargetError
from ..options import ExportOptions
from ..read.distributed import cluster_notes
from ..read.sources import Source, read_source
from ..read.targets import Target, TargetTensor, from_arch, from_cell, from_infos, instantiate
from ..read.tensors import TensorInfo
from ..reports import ConversionReport
from .entries import cast_dtype
from .layouts import Layout
from .mapping import layered
from .plan import Conflict, Dropped, Match, Missing, Plan, PlanOptions, Unused, make_plan
from .rules import known_drop
from .transforms import invert

FORMATS = ("pth", "safetensors")


class ExportReport(ConversionReport):
    """A :class:`~ms_port.reports.ConversionReport` for the MindSpore -> PyTorch direction."""

    @property
    def message(self) -> str:
        if self.plan.ok and not self.dry_run:
            return f"exported {len(self.plan.matches)} tensors to {self.output}"
        return super().message

    def __repr__(self) -> str:
        return super().__repr__().replace("ConversionReport", "ExportReport", 1)


def _from_config(config: dict[str, Any], where: str) -> tuple[Source, str]:
    """A Hugging Face model's names, shapes and dtypes from its config: computed where the
    family's layout is plain (:mod:`ms_port.archs.hf_layout`), else built with transformers
    on the meta device (no weights allocated); a tied weight is listed once, as
    transformers saves it."""
    from ..archs.hf_layout import hf_tensors
    from ..read.sources import _TORCH_DTYPE_NAMES

    dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    if dtype not in _TORCH_DTYPE_NAMES.values():
        dtype = "float32"
    computed = hf_tensors(config)
    if computed is not None:
        cls, shapes = computed
        what = f"transformers {cls} ({where})"
        return Source(what, "torch-module", {n: TensorInfo(n, s, dtype)
                                             for n, s in shapes.items()},
                      config=config, config_path=where), what
    import torch

    from ..check.language import torch_from_config
    from ..check.networks import tied_names

    with torch.device("meta"):
        module = torch_from_config(config, where)
    tied = tied_names(module)
    kept: dict[str, Any] = {}
    for name, tensor in module.state_dict().items():
        if not tied.get(name, set()) & set(kept):  # else the twin is already listed
            kept[name] = tensor
    infos: dict[str, TensorInfo] = {}
    for name, tensor in _as_saved(module, kept).items():
        own = dtype if tensor.is_floating_point() else \
            _TORCH_DTYPE_NAMES.get(str(tensor.dtype).removeprefix("torch."), dtype)
        for part, shape in _on_disk(name, tuple(tensor.shape)):
            infos[part] = TensorInfo(part, shape, own)
    what = f"transformers {type(module).__name__} ({where})"
    return Source(what, "torch-module", infos, config=config, config_path=where), what


def _as_saved(module: Any, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` under the names ``save_pretrained`` writes: transformers 5 reverts its
    loading conversions when it saves (DeepSeek-V4's ``self_attn.q_a_proj`` is saved as
    ``attn.wq_a``, its stacked experts one tensor each), on the meta device too."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # a transformers without conversions saves what it holds
        return state
    return revert_weight_conversion(module, state)


def _on_disk(name: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """The names and shapes transformers saves a tensor under: a mixture of experts it
    holds stacked in memory is written one tensor per expert, as the Hub's files have it
    (:data:`~ms_port.archs.experts.STACKED_IN_MEMORY`); anything else as it is."""
    from ..archs.experts import STACKED_IN_MEMORY

    for suffix, parts in STACKED_IN_MEMORY.items():
        if name.endswith("." + suffix) and len(shape) == 3 and shape[1] % len(parts) == 0:
            prefix = name[: -len(suffix)]
            each = (shape[1] // len(parts), shape[2])
            return [(prefix + p.format(e=e), each) for e in range(shape[0]) for p in parts]
    return [(name, shape)]


def _on_meta(build: Any) -> Any:
    """Build a PyTorch module on the meta device (names, shapes and dtypes, no memory);
    a factory that needs real tensors (it loads or computes weights) is built normally."""
    import torch

    try:
        with torch.device("meta"):
            return build()
    except TargetError:
        return build()


def _torch_side(arch: str | None, torch_model: Any, target: Any,
                config: dict[str, Any] | None = None,
                config_path: str | None = None) -> tuple[Source, str]:
    """The PyTorch names, shapes and dtypes wanted, as a metadata-only Source."""
    if sum(x is not None for x in (arch, torch_model, target)) == 0 and config is not None:
        return _from_config(config, config_path or "config")
    if sum(x is not None for x in (arch, torch_model, target)) != 1:
        raise TargetError("give exactly one PyTorch target: --arch NAME, --torch-model "
                          "module:callable, --target FILE.pth, or --config config.json "
                          "(a Hugging Face model)")
    if target is not None:
        src = read_source(target)
        return Source(src.path, src.format, {n: replace(i, loader=None)
                                             for n, i in src.tensors.items()},
                      config=config or src.config,
                      config_path=config_path or src.config_path), str(target)
    if arch is not None:
        from ..archs import get_arch

        module, what = get_arch(arch).build_torch(), get_arch(arch).reference or arch
    else:
        module = _on_meta(lambda: instantiate(torch_model, "--torch-model"))
        what = torch_model if isinstance(torch_model, str) else type(module).__name__
    from ..read.sources import _TORCH_DTYPE_NAMES

    state = module.state_dict()
    infos = {n: TensorInfo(n, tuple(t.shape),
                           _TORCH_DTYPE_NAMES[str(t.dtype).removeprefix("torch.")])
             for n, t in state.items()}
    return Source(what, "torch-module", infos), what


def _ms_side(checkpoint: Source, arch: str | None, ms_model: Any) -> Target:
    """The checkpoint's names as a Target, with layer types from the network if known."""
    target = from_infos(checkpoint.tensors.values(), checkpoint.path)
    kinds = None
    if arch is not None:
        kinds = from_arch(arch)
    elif ms_model is not None:
        kinds = from_cell(instantiate(ms_model, "--ms-model"))
    if kinds is not None:
        target.tensors = {n: TargetTensor(t.name, t.shape, t.dtype,
                                          kinds.tensors[n].layer if n in kinds else None,
                                          kinds.tensors[n].lineage if n in kinds else ())
                          for n, t in target.tensors.items()}
    return target


def invert_plan(forward: Plan, checkpoint: Source, torch_side: Source) -> Plan:
    """Turn a PyTorch -> MindSpore plan around; restore what MindSpore cannot hold."""
    matches: dict[str, Match] = {}
    initialised = []
    conflicts = [Conflict(c.kind, c.sources, c.targets, c.message) for c in forward.conflicts]
    split: dict[str, list[Match]] = {}
    for m in forward.matches:
        if m.init is not None:  # made on conversion: nothing in PyTorch to restore
            initialised.append(Dropped(m.target, f"initialised on conversion ({m.detail})"))
            continue
        dtype = checkpoint.tensors[m.target].dtype
        if m.how == "tied":  # PyTorch holds it once, as the tensor it is tied to
            initialised.append(Dropped(m.target, f"tied: {m.detail}"))
            continue
        if m.part is not None and m.transforms:
            conflicts.append(Conflict("shape", (m.source,), (m.target,), (
                f"{m.target!r} was {m.detail} with transforms "
                f"{', '.join(map(str, m.transforms))}; export cannot join parts that were "
                "transformed one by one yet — export without that entry")))
            continue
        if m.parts and m.groups:  # fused group by group: each part from its group's rows
            matches.update(_group_parts(m, torch_side, dtype))
            continue
        if m.parts:  # fused on conversion: each PyTorch part is taken back out, after
            # the transforms applied to the joined tensor are undone
            before = invert(m.transforms, m.source_shape)
            for i, part in enumerate(m.parts):
                shape = torch_side.tensors[part].shape
                matches[part] = Match(part, m.target, m.how, f"part {i + 1} of {m.detail}",
                                      m.shape, shape, dtype, dtype, layout=m.layout, part=i,
                                      before=before)
            continue
        if m.part is not None:  # split on conversion: fused again below
            split.setdefault(m.source, []).append(m)
            continue
        # an integer tensor goes back to the integer dtype PyTorch holds (int32 -> int64)
        matches[m.source] = Match(
            m.source, m.target, m.how, f"inverse of {m.detail}", m.shape, m.source_shape,
            dtype, cast_dtype(dtype, None, torch_side.tensors[m.source].dtype),
            invert(m.transforms, m.source_shape))
    for name, parts in split.items():
        parts.sort(key=lambda p: p.part)
        dtype = checkpoint.tensors[parts[0].target].dtype
        matches[name] = Match(name, parts[0].target, "mapping",
                              f"{parts[0].layout} of {len(parts)} (inverse of a split)",
                              parts[0].source_shape, parts[0].source_shape, dtype, dtype,
                              parts=tuple(p.target for p in parts), layout=parts[0].layout)
    restored: dict[str, TensorInfo] = {}
    for d in forward.dropped:
        info = torch_side.tensors[d.name]
        if known_drop(d.name) and info.dtype == "int64":
            key = f"<restored>{d.name}"
            restored[key] = TensorInfo(key, info.shape, "int64",
                                       lambda s=info.shape: np.zeros(s, np.int64))
            matches[d.name] = Match(d.name, key, "restored",
                                    "no MindSpore counterpart; restored as 0", info.shape,
                                    info.shape, "int64", "int64")
    source = Source(checkpoint.path, checkpoint.format, {**checkpoint.tensors, **restored},
                    training_state=checkpoint.training_state)
    target = from_infos(torch_side.tensors.values(), torch_side.path)
    target.kind = "pytorch"
    missing = [Missing(u.name, u.shape, u.dtype, u.candidates) for u in forward.unused]
    missing += [Missing(d.name, torch_side.tensors[d.name].shape,
                        torch_side.tensors[d.name].dtype)
                for d in forward.dropped if d.name not in matches
                and not d.reason.startswith("tied")]
    unused = [Unused(m.name, m.shape, m.dtype, m.candidates) for m in forward.missing]
    ordered = [matches[n] for n in target.tensors if n in matches]
    return Plan(source, target, forward.mapping, ordered, missing, unused, initialised,
                conflicts,
                allow_missing=forward.allow_unused, allow_unused=forward.allow_missing,
                notes=list(forward.notes), params=dict(forward.params))


def _group_parts(m: Match, torch_side: Source, dtype: str) -> dict[str, Match]:
    """The PyTorch parts of a target fused group by group (``m.groups``, an expert each):
    each is read from its group's rows of the target alone, brought back through the
    group's transforms undone, and taken out of the group's join. Export then reads each
    expert once per part, not the whole stacked tensor (O(experts) times its size)."""
    k = len(m.parts) // m.groups
    rows = m.shape[0] // m.groups
    found = {}
    for g in range(m.groups):
        names = m.parts[g * k:(g + 1) * k]
        sizes = m.layout.sizes[g * k:(g + 1) * k]
        layout = Layout("concat", m.layout.axis, 1, sizes)
        first = torch_side.tensors[names[0]].shape
        axis = m.layout.axis % len(first)
        joined = tuple(sum(sizes) if d == axis else n for d, n in enumerate(first))
        before = invert(m.group_transforms, joined)
        for i, part in enumerate(names):
            found[part] = Match(part, m.target, m.how, f"part {g * k + i + 1} of {m.detail}",
                                m.shape, torch_side.tensors[part].shape, dtype, dtype,
                                layout=layout, part=i, before=before,
                                rows=(g * rows, (g + 1) * rows))
    return found


def export_plan(checkpoint: str | Path, opts: ExportOptions,
                config: dict[str, Any] | None = None, config_path: str | None = None) -> Plan:
    """The inverted plan for :func:`ms_port.export` (see the module docstring); ``config``
    is the Hugging Face config read from ``opts.config`` (at ``config_path``)."""
    from ..read.targets import FAMILIES, mark_family

    arch, torch_model, ms_model, ms_options = (opts.arch, opts.torch_model, opts.ms_model,
                                               opts.ms_options)
    target, mapping, dtype = opts.target, opts.mapping, opts.dtype
    allow_missing, allow_unused = opts.allow_missing, opts.allow_unused

    ckpt = read_source(checkpoint, strip_prefixes=False, **opts.cluster())
    torch_side, _ = _torch_side(arch, torch_model, target, config, config_path)
    family = ms_model if isinstance(ms_model, str) and ms_model in FAMILIES else None
    ms_side = _ms_side(ckpt, arch, None if family else ms_model)
    if family is not None or (ms_model is None and arch is None):
        # a family named, or recognised by the checkpoint's names: its table and the
        # settings that table reads (the layout the names show, the options the rest)
        mark_family(ms_side, torch_side.config, ms_options, family)
    if ms_options and (ms_side.family is None or torch_side.config is None):
        missing = ("no config.json was given" if ms_side.family
                   else "no family was named or recognised")
        raise TargetError("--ms-option is for a known --ms-model family "
                          f"({', '.join(FAMILIES)}) with the model's --config; {missing}")
    base = None
    if arch is not None:
        from ..archs import get_arch

        base = get_arch(arch).mapping_table()
    forward = make_plan(torch_side, ms_side,
                        layered(mapping, base=base, config=torch_side.config, target=ms_side),
                        options=PlanOptions(allow_missing=allow_unused,
                                            allow_unused=allow_missing))
    plan = invert_plan(forward, ckpt, torch_side)
    plan.notes += cluster_notes(ckpt)
    if dtype is not None:
        # floating-point tensors cast; an integer one keeps the dtype PyTorch holds
        plan.matches = [replace(m, out_dtype=cast_dtype(m.dtype, dtype, m.out_dtype))
                        for m in plan.matches]
    return plan

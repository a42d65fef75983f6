"""The library's front door: inspect, plan, convert, verify.

Every function returns a report dataclass and raises only
:class:`~ms_port.errors.MsPortError` subclasses for failures it understands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from .errors import MsPortError, TargetError
from .match.mapping import MappingTable, load_mapping
from .match.patterns import Pattern, PatternError, compile_pattern
from .match.plan import Plan, make_plan
from .read.sources import Source, read_source
from .read.targets import Target, from_arch, from_cell, from_factory, from_template
from .reports import ConversionReport, InspectReport
from .write.writers import Progress, check_not_input, check_output, write_plan, write_text


def inspect(
    path: str | Path | None = None,
    *,
    arch: str | None = None,
    filter: str | None = None,
    key: str | None = None,
    unsafe_pickle: bool = False,
) -> InspectReport:
    """List what a checkpoint holds, or what an architecture expects.

    Args:
        path: a ``.pth``/``.pt``/``.bin``, ``.safetensors`` (or sharded index) or ``.ckpt``.
        arch: instead of a file, a registered architecture (its MindSpore tensors).
        filter: keep only tensors whose name matches this regex (``re.search``).
        key: the container holding the state dict, if not a usual one.
        unsafe_pickle: allow full unpickling of a trusted legacy file (runs its code).

    Returns:
        An :class:`~ms_port.reports.InspectReport`.

    Example:
        >>> report = ms_port.inspect("resnet50.pth")
        >>> len(report.tensors), report.parameters
        (320, 25557032)
    """
    if (path is None) == (arch is None):
        raise MsPortError("give a checkpoint path or an architecture (arch=...), not both")
    pattern = _regex(filter)
    if arch is not None:
        target = from_arch(arch)
        from .read.tensors import TensorInfo

        infos = [TensorInfo(t.name, t.shape, t.dtype) for t in target.tensors.values()]
        return InspectReport(f"arch:{arch}", "architecture",
                             [i for i in infos if not pattern or pattern.search(i.name)],
                             len(infos), filter=filter)
    source = read_source(path, key=key, unsafe_pickle=unsafe_pickle)
    tensors = [t for t in source if not pattern or pattern.search(t.name)]
    return InspectReport(source.path, source.format, tensors, len(source),
                         unwrapped=source.unwrapped, stripped=source.stripped,
                         skipped=source.skipped, metadata=source.metadata, filter=filter)


def _regex(pattern: str | None) -> Pattern | None:
    if pattern is None:
        return None
    try:
        return compile_pattern(pattern)
    except PatternError as exc:
        raise MsPortError(f"bad --filter regex {pattern!r} ({exc})") from None


def resolve_target(
    *,
    arch: str | None = None,
    target: str | Path | Target | None = None,
    ms_model: Any = None,
) -> Target:
    """One Target from exactly one of ``arch``, ``target`` (template) or ``ms_model``."""
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
    if isinstance(ms_model, str):
        return from_factory(ms_model)
    return from_cell(ms_model)


def resolve_mapping(mapping: Any, *, arch: str | None = None) -> MappingTable:
    """The architecture's table (if any) with the user's tables layered on top."""
    table = MappingTable.empty()
    if arch is not None:
        from .archs import get_arch

        table = get_arch(arch).mapping_table()
    items = mapping if isinstance(mapping, (list, tuple)) else [mapping]
    for item in items:
        if item is None:
            continue
        table = table.merged(item if isinstance(item, MappingTable) else load_mapping(item))
    return table


def _source(source: str | Path | Source, **kw: Any) -> Source:
    return source if isinstance(source, Source) else read_source(source, **kw)


def plan(
    source: str | Path | Source,
    *,
    arch: str | None = None,
    target: str | Path | Target | None = None,
    ms_model: Any = None,
    mapping: Any = None,
    allow_missing: bool = False,
    allow_unused: bool = False,
    allow_shape_match: bool = False,
    dtype: str | None = None,
    key: str | None = None,
    unsafe_pickle: bool = False,
) -> Plan:
    """Match a checkpoint against a MindSpore target without writing anything.

    Args:
        source: the PyTorch checkpoint (path or :class:`~ms_port.read.sources.Source`).
        arch / target / ms_model: exactly one: an architecture name, a template
            checkpoint, or a MindSpore Cell (or ``"module:callable"`` building one).
        mapping: mapping table(s): a built-in name, a YAML path, a
            :class:`~ms_port.match.mapping.MappingTable`, or a list of them.
        allow_missing / allow_unused / allow_shape_match / dtype: see
            :func:`~ms_port.match.plan.make_plan`.

    Returns:
        The :class:`~ms_port.match.plan.Plan`; ``plan.ok`` says whether it is complete.

    Example:
        >>> p = ms_port.plan("resnet50.pth", arch="resnet50")
        >>> p.ok, p.counts
        (True, {'exact': 54, 'rule': 212, 'mapping': 55, 'fallback': 0})
    """
    src = _source(source, key=key, unsafe_pickle=unsafe_pickle)
    tgt = resolve_target(arch=arch, target=target, ms_model=ms_model)
    table = resolve_mapping(mapping, arch=arch)
    return make_plan(src, tgt, table, allow_missing=allow_missing, allow_unused=allow_unused,
                     allow_shape_match=allow_shape_match, dtype=dtype)


def convert(
    source: str | Path | Source,
    *,
    output: str | Path | None = None,
    arch: str | None = None,
    target: str | Path | Target | None = None,
    ms_model: Any = None,
    mapping: Any = None,
    format: str = "ckpt",
    dtype: str | None = None,
    force: bool = False,
    dry_run: bool = False,
    save_map: str | Path | None = None,
    allow_missing: bool = False,
    allow_unused: bool = False,
    allow_shape_match: bool = False,
    check_finite: bool = False,
    crc: bool = False,
    key: str | None = None,
    unsafe_pickle: bool = False,
    progress: Progress | None = None,
) -> ConversionReport:
    """Convert a PyTorch checkpoint into a MindSpore one, proving every byte.

    Args:
        source: the PyTorch checkpoint.
        output: the file to write (required unless ``dry_run``).
        arch / target / ms_model: the MindSpore side (see :func:`plan`).
        mapping: extra mapping table(s) (see :func:`plan`).
        format: ``ckpt`` or ``safetensors``.
        dtype: cast floating-point tensors (``float32``/``float16``/``bfloat16``);
            by default every dtype is kept bit for bit.
        force: replace an existing output once the new one is verified.
        dry_run: stop after the plan.
        save_map: write the plan as a mapping YAML (edit it, pass it back as ``mapping``).
        allow_missing / allow_unused / allow_shape_match: relax strict matching; all
            leftovers and fallbacks are still reported.
        check_finite: refuse weights holding NaN/Inf (always reported).
        crc: append MindSpore's CRC trailer.
        progress: ``(phase, done, total)`` callback for long writes.

    Returns:
        A :class:`~ms_port.reports.ConversionReport`; ``ok`` is False and nothing is
        written when the plan is incomplete.

    Example:
        >>> report = ms_port.convert("resnet50.pth", arch="resnet50", output="r50.ckpt")
        >>> report.ok, report.written.readback
        (True, 'bit-exact')
    """
    if output is None and not dry_run:
        raise MsPortError("no output given; pass -o FILE (output=...) or --dry-run")
    inputs = [source if isinstance(source, (str, Path)) else getattr(source, "path", None),
              target if isinstance(target, (str, Path)) else None]
    if output is not None and not dry_run:
        check_output(output, force=force)
        check_not_input(output, *inputs)
    if save_map is not None:
        check_output(save_map, force=force)
        check_not_input(save_map, *inputs)
    p = plan(source, arch=arch, target=target, ms_model=ms_model, mapping=mapping,
             allow_missing=allow_missing, allow_unused=allow_unused,
             allow_shape_match=allow_shape_match, dtype=dtype, key=key,
             unsafe_pickle=unsafe_pickle)
    saved = None
    if save_map is not None:  # the same rules as every output: no clobbering, atomic
        saved = str(write_text(save_map, p.to_yaml(), force=force))
    out = None if output is None else str(output)
    if not p.ok or dry_run:
        return ConversionReport(p.ok, p, out, dry_run=dry_run, saved_map=saved)
    written = write_plan(p, output, format=format, force=force, crc=crc,
                         check_finite=check_finite, progress=progress)
    return ConversionReport(True, p, out, written=written, saved_map=saved,
                            nonfinite=written.nonfinite)


def verify(
    source: str | Path,
    checkpoint: str | Path,
    *,
    arch: str | None = None,
    torch_model: Any = None,
    ms_model: Any = None,
    mapping: Any = None,
    tol: float = 1e-5,
    seed: int = 0,
    batch: int = 1,
    input_shape: tuple[int, ...] | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    torch_device: str | None = None,
    ms_device: str | None = None,
    noise_floor: bool = True,
    key: str | None = None,
    unsafe_pickle: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Any:
    """Run the PyTorch and MindSpore networks on the same input and compare outputs.

    The compared error is the relative L2 error ``||ms - torch|| / ||torch||`` per
    output: a difference measured against the output's own scale. A NaN or Inf on
    either side always fails.

    Args:
        source: the PyTorch checkpoint the reference network loads.
        checkpoint: the MindSpore checkpoint the MindSpore network loads.
        arch: a registered architecture (both networks), or else
        torch_model / ms_model: ``"module:callable"`` (or built objects) for each side.
        mapping: mapping table(s) used to pair layers for divergence localisation.
        tol: the largest accepted error.
        seed / batch / input_shape: the random input (shape defaults to the arch's).
        dtype: ``float32`` or ``float64`` (both sides).
        device: ``cpu``, ``gpu`` or ``ascend`` for both sides; ``torch_device`` and
            ``ms_device`` override per side.
        noise_floor: also run PyTorch in float64 to show float32 rounding error.

    Returns:
        A :class:`~ms_port.check.parity.ParityReport` with ``ok`` and ``first_divergence``.

    Example:
        >>> parity = ms_port.verify("resnet50.pth", "resnet50.ckpt", arch="resnet50")
        >>> parity.ok, parity.error < 1e-5, parity.first_divergence
        (True, True, None)
    """
    from .check.networks import (
        build_network,
        load_ms_weights,
        load_torch_weights,
        not_loaded_report,
    )
    from .check.parity import correspondence_from_pairs, run_parity

    torch_device, ms_device = torch_device or device, ms_device or device

    entry = None
    if arch is not None:
        from .archs import get_arch

        entry = get_arch(arch)
    elif torch_model is None or ms_model is None:
        raise MsPortError("give arch=..., or both torch_model and ms_model")
    shape = input_shape or (entry.input_shape if entry else None)
    if shape is None:
        raise MsPortError("no input shape: pass --input-shape C,H,W (input_shape=...) for "
                          "custom networks")
    step = progress or (lambda _msg: None)

    # read and validate both files before building anything heavy
    src = read_source(source, key=key, unsafe_pickle=unsafe_pickle)
    ckpt = read_source(checkpoint, strip_prefixes=False)
    swapped = src.format == "mindspore-ckpt" and ckpt.format != "mindspore-ckpt"
    if swapped:  # given MindSpore first (e.g. after an export): both directions work
        source, checkpoint = checkpoint, source
        src = read_source(source, key=key, unsafe_pickle=unsafe_pickle)

    step("building the PyTorch network")
    tnet = build_network(torch_model, "--torch-model", entry, "torch")
    load_torch_weights(tnet, src)  # the Source read above; no second unpickling
    step("building the MindSpore network")
    mnet = build_network(ms_model, "--ms-model", entry, "mindspore")
    step(f"loading {checkpoint}")
    not_loaded, unused = load_ms_weights(mnet, checkpoint)

    plan = make_plan(src, from_cell(mnet), resolve_mapping(mapping, arch=arch),
                     allow_missing=True, allow_unused=True)
    correspondence = correspondence_from_pairs((m.target, m.source) for m in plan.matches)
    if not_loaded:
        return not_loaded_report(checkpoint, not_loaded, unused, tol=tol, shape=shape,
                                 batch=batch, seed=seed, dtype=dtype,
                                 torch_device=torch_device, ms_device=ms_device)
    report = run_parity(tnet, mnet, input_shape=tuple(shape), batch=batch, seed=seed,
                        tol=tol, dtype=dtype, torch_device=torch_device,
                        ms_device=ms_device, correspondence=correspondence,
                        noise_floor=noise_floor, progress=progress)
    if swapped:
        report.notes.append(f"{checkpoint} is the MindSpore side, {source} the PyTorch side")
    if unused:
        report.notes.append(f"{len(unused)} checkpoint entries unused by the network: "
                            f"{', '.join(unused[:3])}")
    return report




def export(
    checkpoint: str | Path,
    *,
    output: str | Path | None = None,
    arch: str | None = None,
    torch_model: Any = None,
    target: str | Path | None = None,
    ms_model: Any = None,
    mapping: Any = None,
    format: str | None = None,
    dtype: str | None = None,
    force: bool = False,
    dry_run: bool = False,
    allow_missing: bool = False,
    allow_unused: bool = False,
    progress: Progress | None = None,
) -> Any:
    """Convert a MindSpore checkpoint back to PyTorch, through the conversion plan inverted.

    Args:
        checkpoint: the MindSpore ``.ckpt`` (or safetensors) file.
        output: the ``.pth`` or ``.safetensors`` file to write.
        arch / torch_model / target: exactly one PyTorch side: an architecture's
            reference network, a ``module:callable`` (or module, or class) building one,
            or a template ``.pth``/``.safetensors`` file.
        ms_model: optionally the MindSpore network, so rules know its layer types where
            the checkpoint alone cannot say (implied by ``arch``).
        mapping: extra mapping table(s), written PyTorch -> MindSpore as for convert.
        format: ``pth`` or ``safetensors`` (default: from the output's suffix).
        dtype: cast floating-point tensors; by default dtypes are kept bit for bit.
        force / dry_run / allow_missing / allow_unused / progress: as for :func:`convert`.

    Returns:
        An :class:`~ms_port.match.inversion.ExportReport` (``ok``, ``plan``, ``written``);
        BatchNorm's ``num_batches_tracked`` is restored as 0.

    Example:
        >>> report = ms_port.export("resnet50.ckpt", arch="resnet50", output="back.pth")
        >>> report.ok, report.plan.counts["restored"]
        (True, 53)
    """
    from .match.inversion import FORMATS, ExportReport, export_plan

    if output is None and not dry_run:
        raise TargetError("no output given; pass -o FILE (output=...) or --dry-run")
    fmt = format or ("safetensors" if str(output).endswith(".safetensors") else "pth")
    if fmt not in FORMATS:
        raise TargetError(f"unknown export format {fmt!r}; choose pth or safetensors")
    if output is not None and not dry_run:
        check_output(output, force=force)
        check_not_input(output, checkpoint)
    p = export_plan(checkpoint, arch=arch, torch_model=torch_model, target=target,
                    ms_model=ms_model, mapping=mapping, dtype=dtype,
                    allow_missing=allow_missing, allow_unused=allow_unused)
    out = None if output is None else str(output)
    if not p.ok or dry_run:
        return ExportReport(p.ok, p, out, dry_run=dry_run)
    written = write_plan(p, output, format=fmt, force=force, progress=progress)
    return ExportReport(True, p, out, written=written, nonfinite=written.nonfinite)

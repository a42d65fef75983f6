"""The library's front door: inspect, plan, convert, verify.

Every function returns a report dataclass and raises only
:class:`~ms_port.errors.MsPortError` subclasses for failures it understands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from .errors import MsPortError, TargetError
from .match.patterns import Pattern, PatternError, compile_pattern
from .match.plan import Plan
from .options import ConvertOptions, DiffOptions, ExportOptions, InspectOptions
from .read.sources import Source, read_source
from .read.targets import Target, from_arch
from .reports import ConversionReport, InspectReport
from .resolve import (
    plan_for,
    read_with_config,
)
from .text import visible
from .write.writers import Progress, check_not_input, check_output, write_plan, write_text


def inspect(
    path: str | Path | None = None,
    *,
    arch: str | None = None,
    filter: str | None = None,
    key: str | None = None,
    unsafe_pickle: bool = False,
    revision: str | None = None,
    strategy: str | Path | None = None,
    step: str | None = None,
) -> InspectReport:
    """List what a checkpoint holds, or what an architecture expects.

    Args:
        path: a ``.pth``/``.pt``/``.bin``, ``.safetensors`` (or sharded index) or ``.ckpt``,
            a Hugging Face model directory, or a Hugging Face Hub id (``"org/name"``,
            where no such local path exists), read from the Hugging Face cache.
        arch: instead of a file, a registered architecture (its MindSpore tensors).
        filter: keep only tensors whose name matches this regex (``re.search``).
        key: the container holding the state dict, if not a usual one.
        unsafe_pickle: allow full unpickling of a trusted legacy file (runs its code).
        revision: a Hub id's branch, tag or commit hash (default: ``main``).
        strategy / step: for a distributed training output (a folder of ``rank_N/``
            folders, or the folder holding ``checkpoint/``): its strategy file or folder
            (default: ``strategy/`` beside ``checkpoint/``) and the save (``STEP`` or
            ``EPOCH_STEP``; default the latest).

    Returns:
        An :class:`~ms_port.reports.InspectReport`.

    Example:
        >>> report = ms_port.inspect("resnet50.pth")
        >>> len(report.tensors), report.parameters
        (320, 25557032)
    """
    opts = InspectOptions(arch=arch, filter=filter, key=key, unsafe_pickle=unsafe_pickle,
                          revision=revision, strategy=strategy, step=step)
    if (path is None) == (opts.arch is None):
        raise MsPortError("give a checkpoint path or an architecture (arch=...), not both")
    if opts.arch is not None and opts.revision is not None:
        raise MsPortError("revision= (--revision) is for a Hugging Face id; arch= reads no "
                          "checkpoint — drop it")
    pattern = _regex(opts.filter)
    if opts.arch is not None:
        target = from_arch(opts.arch)
        from .read.tensors import TensorInfo

        infos = [TensorInfo(t.name, t.shape, t.dtype) for t in target.tensors.values()]
        return InspectReport(f"arch:{opts.arch}", "architecture",
                             [i for i in infos if not pattern or pattern.search(i.name)],
                             len(infos), filter=opts.filter)
    source = read_source(path, **opts.reading(), **opts.cluster())
    tensors = [t for t in source if not pattern or pattern.search(t.name)]
    state, state_notes = _trainer_state(path)
    return InspectReport(source.path, source.format, tensors, len(source),
                         unwrapped=source.unwrapped, stripped=source.stripped,
                         skipped=source.skipped, metadata=source.metadata, filter=opts.filter,
                         config=_config_summary(source), hub=source.hub,
                         cluster=source.cluster, training_state=source.training_state,
                         notes=source.notes + state_notes, optimizer=state)


def _trainer_state(path: Any) -> tuple[Any, list[str]]:
    """A Trainer ``checkpoint-N/`` folder's optimizer state, named by position (inspect
    builds no model to name it), or None where ``path`` is no such folder; a state that
    cannot be taken is a note, the weights still listed."""
    from .errors import SourceError
    from .read.trainer import holds_training_state, read_trainer_state

    folder = Path(path) if isinstance(path, (str, Path)) else None
    if folder is None or not folder.is_dir() or not holds_training_state(folder):
        return None, []
    try:
        return read_trainer_state(folder), []
    except SourceError as exc:
        return None, [f"training state not taken: {exc}"]


#: config.json keys worth a line in inspect (what a conversion takes from it)
_CONFIG_KEYS = ("model_type", "architectures", "hidden_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "vocab_size", "tie_word_embeddings", "dtype", "torch_dtype")


def _config_summary(source: Source) -> dict[str, Any]:
    """The config's keys a conversion uses, and which ms-port target takes its model type
    (or what it is, where none does yet)."""
    from .match.mapping import PLANNED_MODEL_TYPES, families_for

    if source.config is None:
        return {}
    model_type = source.config.get("model_type")
    families = families_for(model_type)
    planned = PLANNED_MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
    target = (" or ".join(families) if families
              else f"none yet ({planned})" if planned else None)
    return {"path": source.config_path,
            **{k: source.config[k] for k in _CONFIG_KEYS if k in source.config},
            **({"ms_port_target": target} if target else {})}


def _regex(pattern: str | None) -> Pattern | None:
    if pattern is None:
        return None
    try:
        return compile_pattern(pattern)
    except PatternError as exc:
        raise MsPortError(f"bad --filter regex {pattern!r} ({exc})") from None


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
    align: bool = True,
    config: str | Path | dict[str, Any] | None = None,
    ms_options: dict[str, Any] | None = None,
    revision: str | None = None,
) -> Plan:
    """Match a checkpoint against a MindSpore target without writing anything.

    Args:
        source: the PyTorch checkpoint (path or :class:`~ms_port.read.sources.Source`), or
            a Hugging Face Hub id (``"org/name"``) where no such local path exists; a
            local path always wins. The id is read from the Hugging Face cache, and what
            a checkpoint needs is downloaded first when online (not with
            ``HF_HUB_OFFLINE=1``); see :mod:`ms_port.read.hub`.
        revision: the Hub id's branch, tag or commit hash (default: ``main``).
        arch / target / ms_model: exactly one: an architecture name, a template
            checkpoint, or a MindSpore Cell (or ``"module:callable"`` building one).
        mapping: mapping table(s): a built-in name, a YAML path, a
            :class:`~ms_port.match.mapping.MappingTable`, or a list of them.
        allow_missing / allow_unused / allow_shape_match / dtype / align: see
            :class:`~ms_port.match.plan.PlanOptions` (``align=False``: no structural
            alignment, names only).

    Returns:
        The :class:`~ms_port.match.plan.Plan`; ``plan.ok`` says whether it is complete.

    Example:
        >>> p = ms_port.plan("resnet50.pth", arch="resnet50")
        >>> p.ok, p.counts
        (True, {'exact': 49, 'rule': 196, 'mapping': 22, 'fallback': 0})
    """
    src = read_with_config(source, key=key, unsafe_pickle=unsafe_pickle, config=config,
                           revision=revision)
    return plan_for(src, arch=arch, target=target, ms_model=ms_model, mapping=mapping,
                    ms_options=ms_options, allow_missing=allow_missing,
                    allow_unused=allow_unused, allow_shape_match=allow_shape_match,
                    dtype=dtype, align=align)


def convert(
    source: str | Path | Source,
    *,
    output: str | Path | None = None,
    arch: str | None = None,
    target: str | Path | Target | None = None,
    ms_model: Any = None,
    mapping: Any = None,
    format: str | None = None,
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
    align: bool = True,
    config: str | Path | dict[str, Any] | None = None,
    ms_options: dict[str, Any] | None = None,
    max_shard_size: str | int | None = None,
    revision: str | None = None,
    model_config: str | Path | None = None,
    strategy: str | Path | None = None,
    training_state: bool = False,
) -> ConversionReport:
    """Convert a PyTorch checkpoint into a MindSpore one, proving every byte.

    Args:
        source: the PyTorch checkpoint, or a Hugging Face Hub id (see :func:`plan`).
        output: the file to write (required unless ``dry_run``).
        arch / target / ms_model: the MindSpore side (see :func:`plan`).
        mapping: extra mapping table(s) (see :func:`plan`).
        format: ``ckpt`` or ``safetensors`` (default: from the output's suffix, else
            ``ckpt``); one the output's suffix contradicts is refused.
        dtype: cast floating-point tensors (``float32``/``float16``/``bfloat16``);
            by default every dtype is kept bit for bit.
        force: replace an existing output once the new one is verified.
        dry_run: stop after the plan.
        save_map: write the plan as a mapping YAML (edit it, pass it back as ``mapping``).
        allow_missing / allow_unused / allow_shape_match: relax strict matching; all
            leftovers and fallbacks are still reported.
        align: pair layers names leave unpaired by structure (``aligned``); see
            :mod:`ms_port.match.align`.
        check_finite: refuse weights holding NaN/Inf (always reported).
        crc: append MindSpore's CRC trailer.
        progress: ``(phase, done, total)`` callback for long writes.
        config / ms_options: see :func:`plan`.
        max_shard_size: write ``output`` as a directory of MindSpore safetensors shards of
            at most this size (``"2GB"``) with ``param_name_map.json`` (name -> shard), the
            layout MindSpore's and MindFormers' safetensors loaders read.
        revision: a Hub id's branch, tag or commit hash (see :func:`plan`).
        model_config: with ``ms_model="mindformers:llama"`` only: also write MindFormers'
            YAML here (``model.model_config`` computed from config.json, ``load_checkpoint``
            the output; see :mod:`ms_port.write.model_config`), after the checkpoint, under
            the same rules (``force``); a dry run checks it and writes nothing.
        strategy: a parallel strategy file or folder (MindSpore's, as training writes
            it): ``output`` is then a folder of ``rank_N/`` files, each holding exactly the
            slices that rank holds, with the strategy copied beside
            (:mod:`ms_port.write.ranks`).
        training_state: ``source`` is a Hugging Face Trainer ``checkpoint-N/`` folder:
            also write its AdamW moments, each made by its weight's own match
            (``adam_m.``/``adam_v.`` + the target's name, float32), and the counters
            MindFormers resumes from (``global_step``, ``step_num``, ``epoch_num``);
            see :mod:`ms_port.match.training`. Without it the output holds the weights
            alone, whatever the folder holds.

    Returns:
        A :class:`~ms_port.reports.ConversionReport`; ``ok`` is False and nothing is
        written when the plan is incomplete.

    Example:
        >>> report = ms_port.convert("resnet50.pth", arch="resnet50", output="r50.ckpt")
        >>> report.ok, report.written.readback
        (True, 'bit-exact')
    """
    opts = ConvertOptions(
        output=output, arch=arch, target=target, ms_model=ms_model, mapping=mapping,
        format=output_format(output, format,
                             folder=max_shard_size is not None or strategy is not None),
        dtype=dtype,
        force=force, dry_run=dry_run, save_map=save_map,
        allow_missing=allow_missing, allow_unused=allow_unused,
        allow_shape_match=allow_shape_match, check_finite=check_finite, crc=crc, key=key,
        unsafe_pickle=unsafe_pickle, align=align, config=config, ms_options=ms_options,
        max_shard_size=max_shard_size, revision=revision, model_config=model_config,
        strategy=strategy, training_state=training_state)
    _check_outputs(source, opts)
    p = plan(source, arch=arch, target=target, ms_model=ms_model, mapping=mapping,
             allow_missing=allow_missing, allow_unused=allow_unused,
             allow_shape_match=allow_shape_match, dtype=dtype, key=key,
             unsafe_pickle=unsafe_pickle, align=align, config=config, ms_options=ms_options,
             revision=revision)
    if output is not None and not dry_run:  # the files a model folder resolved to are inputs
        check_not_input(output, p.source.path, p.source.config_path, *p.source.shards)
    if training_state and p.ok:
        p = _with_training_state(p)
    saved = None
    if save_map is not None:  # the same rules as every output: no clobbering, atomic
        saved = str(write_text(save_map, p.to_yaml(), force=force))
    out = None if output is None else str(output)
    # built (and checked) before any weight is written
    mf_yaml = _mindformers_yaml(p, opts) if model_config is not None and p.ok else None
    if not p.ok or dry_run:
        return ConversionReport(p.ok, p, out, dry_run=dry_run, saved_map=saved)
    written = _write(p, opts, progress)
    mf_config = None
    if mf_yaml is not None:
        from .write.model_config import write_model_config

        mf_config = write_model_config(model_config, mf_yaml, force=force)
    return ConversionReport(True, p, out, written=written, saved_map=saved,
                            nonfinite=written.nonfinite, model_config=mf_config)


def _check_outputs(source: Any, opts: ConvertOptions) -> None:
    """Every file convert would write, checked before anything is read: never replaced
    without ``force``, never one of the inputs."""
    if opts.output is None and not opts.dry_run:
        raise MsPortError("no output given; pass -o FILE (output=...) or --dry-run")
    inputs = [source if isinstance(source, (str, Path)) else getattr(source, "path", None),
              opts.target if isinstance(opts.target, (str, Path)) else None]
    if opts.output is not None and not opts.dry_run:
        if opts.strategy is not None:
            _check_ranks(opts)
        elif opts.max_shard_size is not None:
            from .write.directory import check_directory, parse_size

            parse_size(opts.max_shard_size)
            check_directory(opts.output, force=opts.force, inputs=inputs)
        else:
            check_output(opts.output, force=opts.force)
        check_not_input(opts.output, *inputs)
    if opts.save_map is not None:
        check_output(opts.save_map, force=opts.force)
        check_not_input(opts.save_map, *inputs)
    if opts.model_config is not None:
        from .write.model_config import check_model_config

        check_model_config(opts.model_config, ms_model=opts.ms_model, arch=opts.arch,
                           template=opts.target, force=opts.force, dry_run=opts.dry_run,
                           inputs=tuple(inputs), outputs=(opts.output, opts.save_map))


def _with_training_state(p: Plan) -> Plan:
    """``p`` with the training state of the Trainer folder its weights were read from."""
    from .match.training import with_training_state
    from .read.trainer import read_trainer_state

    if p.source.format in ("mindspore-ckpt",) or p.source.cluster is not None:
        raise MsPortError(f"{p.source.path} is a MindSpore checkpoint; --training-state "
                          "converts a Hugging Face Trainer checkpoint-N/ folder's state")
    folder = Path(p.source.path).parent
    return with_training_state(p, read_trainer_state(folder, p.source))


#: an output's suffix -> the format it names
_SUFFIX_FORMATS = {".ckpt": "ckpt", ".safetensors": "safetensors"}


def output_format(output: Any, asked: str | None, *, folder: bool = False) -> str:
    """The format a conversion writes: ``asked``, else the one ``output``'s suffix names
    (``model.safetensors``), else ``ckpt``; ``asked`` against the suffix is refused (a
    ``.safetensors`` file holding a checkpoint would be misread). A folder's name (shards,
    ranks) says nothing."""
    named = None if folder or output is None else _SUFFIX_FORMATS.get(
        Path(str(output)).suffix.lower())
    if asked is None:
        return named or "ckpt"
    if named is not None and named != asked:
        raise MsPortError(f"--format {asked}, but the output {visible(str(output))} is named "
                          f".{named}: a reader would take it for {named} — drop --format, or "
                          f"name the file .{asked}")
    return asked


def _check_ranks(opts: ConvertOptions) -> None:
    """Per-rank output (``strategy``): a ckpt per rank, with nothing else asked of it."""
    from .read.strategy import strategy_paths
    from .write.ranks import check_ranks_output

    asked = [flag for flag, given in (("--max-shard-size", opts.max_shard_size is not None),
                                      ("--crc", opts.crc),
                                      ("--model-config", opts.model_config is not None))
             if given]
    if asked:
        raise MsPortError(f"--strategy writes one file per rank (.ckpt, or .safetensors for "
                          f"the families that train from it); {', '.join(asked)} does not "
                          "apply to it — drop it")
    strategy_paths(opts.strategy)
    check_ranks_output(opts.output, force=opts.force)


def _mindformers_yaml(p: Plan, opts: ConvertOptions) -> Any:
    """MindFormers' YAML for the converted checkpoint (``model_config``)."""
    from .write.model_config import family_yaml

    if not opts.dry_run:  # the files found beside the source are inputs too
        check_not_input(opts.model_config, p.source.path, p.source.config_path)
    built = family_yaml(opts.ms_model, p.source.config, opts.ms_options,
                        origin=str(p.source.config_path), checkpoint=opts.output,
                        checkpoint_format=("safetensors" if opts.max_shard_size is not None
                                           else opts.format))
    if p.training_state is None:
        return built
    from .write.train_yaml import with_training

    return with_training(built, p.training_state)


def _write(p: Plan, opts: ConvertOptions, progress: Progress | None) -> Any:
    """The plan written: one file, safetensors shards with their name map, or the slices
    of every rank of a strategy."""
    if opts.strategy is not None:
        from .write.ranks import rank_format, write_ranks

        return write_ranks(p, opts.output, opts.strategy, force=opts.force, progress=progress,
                           fmt=rank_format(p, opts.format))
    if opts.max_shard_size is not None:
        from .write.directory import write_directory

        if opts.crc:
            raise MsPortError("sharded output is MindSpore safetensors, which has no CRC "
                              "trailer; drop --crc")
        return write_directory(p, opts.output, layout="mindspore",
                               max_shard_size=opts.max_shard_size, force=opts.force,
                               check_finite=opts.check_finite, progress=progress)
    return write_plan(p, opts.output, format=opts.format, force=opts.force, crc=opts.crc,
                      check_finite=opts.check_finite, progress=progress)


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
    input_shape: Any = None,
    inputs: Any = None,
    input_dtype: Any = None,
    input_range: Any = None,
    dtype: str = "float32",
    device: str = "cpu",
    torch_device: str | None = None,
    ms_device: str | None = None,
    noise_floor: bool = True,
    key: str | None = None,
    unsafe_pickle: bool = False,
    progress: Callable[[str], None] | None = None,
    report: str | Path | None = None,
    force: bool = False,
    config: str | Path | dict[str, Any] | None = None,
    ms_options: dict[str, Any] | None = None,
    mode: str = "auto",
    revision: str | None = None,
    strategy: str | Path | None = None,
    step: str | None = None,
    training_state: bool = False,
) -> Any:
    """Is the conversion right? Compare every tensor, then every layer and output.

    Before any forward pass, every parameter and buffer the MindSpore network holds is
    compared with its PyTorch source through the conversion plan (a differing tensor
    fails the run and is identified by what it holds). Then both networks run on the same
    inputs; every output and paired layer must stay within ``max(tol, K × its float32
    noise)`` (relative L2 error; NaN/Inf always fails), and the outputs must depend on
    the input, else the verdict is INCONCLUSIVE (see :mod:`ms_port.check.verdict`).

    Args:
        source: the PyTorch checkpoint the reference network loads, or a Hugging Face
            Hub id (see :func:`plan`; ``revision`` picks its branch, tag or commit).
        checkpoint: the MindSpore checkpoint the MindSpore network loads (either order).
        arch: a registered architecture (both networks), or else
        torch_model / ms_model: ``"module:callable"`` (or built objects) for each side.
        mapping: the mapping table(s) used for the conversion.
        tol: the smallest bound.
        inputs: a file of real inputs (``.npy``; ``.npz``/``.safetensors``/``.pt`` with one
            array per positional input), or arrays; else generated:
        input_shape / input_dtype / input_range / batch / seed: one shape (or a list, one
            per input; default: the arch's), dtypes and ``(low, high)`` ranges, seeded.
        dtype: ``float32`` or ``float64`` (both sides).
        device: ``cpu``, ``gpu`` or ``ascend`` for both sides; ``torch_device`` and
            ``ms_device`` override per side.
        noise_floor: also run PyTorch in float64 for the per-tensor noise.
        report: also write a self-contained HTML report there (``force`` to replace one).
        config / ms_options: the model's config and a known family's options (see
            :func:`plan`). For a Hugging Face language model, ``ms_model`` alone is enough:
            the PyTorch side is built with transformers from the config, and inputs default
            to 16 token ids drawn from the vocabulary.
        strategy / step: for a distributed training output as ``checkpoint`` (a folder
            of ``rank_N/`` folders, or the folder holding ``checkpoint/``): its strategy
            file or folder (default: ``strategy/`` beside ``checkpoint/``) and the save
            (``STEP`` or ``EPOCH_STEP``; default the latest).
        training_state: check the optimizer state instead of the networks: ``source``
            a Trainer ``checkpoint-N/`` folder, ``checkpoint`` its MindSpore conversion
            with ``--training-state``; one AdamW step on each side (torch's, MindFormers')
            with the same seeded gradient must give the same next weights
            (:func:`ms_port.check.optimizer.prove_step`; returns its ``StepReport``).

    On a CPU, call :func:`ms_port.prefer_fast_cpu_kernels` before anything runs MindSpore
    in the process (the CLI does): on an AVX-512 CPU MindSpore's convolutions otherwise
    run oneDNN's reference kernel, up to 100× slower.

    Returns:
        A :class:`~ms_port.check.report.ParityReport`: ``verdict`` (PASS, FAIL,
        INCONCLUSIVE), ``first_divergence``, ``layers``, ``tensors``.

    Example:
        >>> parity = ms_port.verify("resnet50.pth", "resnet50.ckpt", arch="resnet50")
        >>> parity.verdict, parity.first_divergence
        ('PASS', None)
    """
    from .check.engine import verify as run
    from .options import VerifyOptions

    options = VerifyOptions(
        arch=arch, torch_model=torch_model, ms_model=ms_model, mapping=mapping, tol=tol,
        seed=seed, batch=batch, input_shape=input_shape, inputs=inputs,
        input_dtype=input_dtype, input_range=input_range, dtype=dtype, device=device,
        torch_device=torch_device, ms_device=ms_device, noise_floor=noise_floor, key=key,
        unsafe_pickle=unsafe_pickle, report=report, force=force, config=config,
        ms_options=ms_options, mode=mode, revision=revision, strategy=strategy, step=step,
        training_state=training_state)
    if training_state:
        from .check.optimizer import prove_step

        if ms_model is None:
            raise MsPortError("verify --training-state needs --ms-model (the family the "
                              "state was converted for, e.g. mindformers:llama)")
        return prove_step(source, checkpoint, ms_model=ms_model, ms_options=ms_options,
                          seed=seed)
    return run(source, checkpoint, options, progress)


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
    config: str | Path | dict[str, Any] | None = None,
    max_shard_size: str | int | None = None,
    ms_options: dict[str, Any] | None = None,
    strategy: str | Path | None = None,
    step: str | None = None,
    training_state: bool = False,
    train_config: str | Path | None = None,
) -> Any:
    """Convert a MindSpore checkpoint back to PyTorch, through the conversion plan inverted.

    Args:
        checkpoint: the MindSpore ``.ckpt`` (or safetensors) file, or a distributed
            training output (a folder of ``rank_N/`` folders, or the folder holding
            ``checkpoint/``): its slices joined, its training state left out.
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
        config: a Hugging Face model's ``config.json`` (path, or dict): the PyTorch side is
            that model (its names from transformers, no weights allocated), fused tensors
            are split, a tied head stays tied, and ``output`` is a model directory
            (``config.json`` carried over) that ``from_pretrained`` loads.
        max_shard_size: write that directory as shards of at most this size with
            ``model.safetensors.index.json``.
        ms_options: the options of a known ``ms_model`` family the checkpoint was
            converted with, where its names do not show them
            (``{"use_interleaved_weight_layout_mlp": False}``).
        strategy / step: a training output's strategy file or folder (default:
            ``strategy/`` beside ``checkpoint/``) and save (default the latest).
        training_state: with ``config``: the directory is also a Trainer
            ``checkpoint-N/`` that ``Trainer.train(resume_from_checkpoint=...)`` continues
            from: the checkpoint's AdamW moments, each made by its weight's own match, in
            ``optimizer.pt``, the schedule's position in ``scheduler.pt``, the step in
            ``trainer_state.json`` (:mod:`ms_port.write.trainer`). Needs ``train_config``.
        train_config: the MindFormers YAML the run trained with: the optimizer (only
            ``AdamW``: ``AdamWeightDecay`` writes the same names and computes another step)
            and the schedule, which a checkpoint does not hold.

    Returns:
        An :class:`~ms_port.match.inversion.ExportReport` (``ok``, ``plan``, ``written``);
        BatchNorm's ``num_batches_tracked`` is restored as 0.

    Example:
        >>> report = ms_port.export("resnet50.ckpt", arch="resnet50", output="back.pth")
        >>> report.ok, report.plan.counts["restored"]
        (True, 53)
    """
    from .match.inversion import ExportReport, export_plan

    opts = ExportOptions(
        output=output, arch=arch, torch_model=torch_model, target=target, ms_model=ms_model,
        mapping=mapping, format=format, dtype=dtype, force=force, dry_run=dry_run,
        allow_missing=allow_missing, allow_unused=allow_unused, config=config,
        max_shard_size=max_shard_size, ms_options=ms_options, strategy=strategy, step=step,
        training_state=training_state, train_config=train_config)
    if output is None and not dry_run:
        raise TargetError("no output given; pass -o FILE (output=...) or --dry-run")
    cfg, cfg_path, fmt = _export_format(opts)
    to_directory = cfg is not None
    run_config = _train_config(opts, to_directory)
    if output is not None and not dry_run:
        if to_directory:
            from .write.directory import check_directory

            check_directory(output, force=force, inputs=[checkpoint])
        else:
            check_output(output, force=force)
        check_not_input(output, checkpoint)
    p = export_plan(checkpoint, opts, config=cfg, config_path=cfg_path)
    out = None if output is None else str(output)
    if not p.ok or dry_run:
        return ExportReport(p.ok, p, out, dry_run=dry_run)
    if to_directory:
        from .write.directory import json_file, write_directory

        extra = {"config.json": json_file(cfg)}
        if run_config is not None:
            extra.update(_trainer_files(p, run_config, cfg, cfg_path))
        written = write_directory(p, output, layout="hf", max_shard_size=max_shard_size,
                                  force=force, progress=progress, extra=extra)
    else:
        written = write_plan(p, output, format=fmt, force=force, progress=progress)
    return ExportReport(True, p, out, written=written, nonfinite=written.nonfinite)


def _train_config(opts: ExportOptions, to_directory: bool) -> Any:
    """The run's YAML for ``training_state`` (checked before any work), or None."""
    if opts.train_config is not None and not opts.training_state:
        raise TargetError("--train-config is for --training-state; add it or drop it")
    if not opts.training_state:
        return None
    if not to_directory:
        raise TargetError("--training-state writes a Trainer checkpoint folder: pass the "
                          "model's --config config.json (and -o DIR)")
    if opts.train_config is None:
        raise TargetError("--training-state needs --train-config RUN.yaml, the MindFormers "
                          "YAML the run trained with: a checkpoint names its moments "
                          "adam_m/adam_v whether AdamW or AdamWeightDecay wrote them, and "
                          "holds no learning rate or schedule")
    from .read.train_config import read_train_config

    return read_train_config(opts.train_config)


def _trainer_files(p: Plan, run_config: Any, cfg: dict[str, Any], cfg_path: Any) -> Any:
    """The Trainer's files of ``p``'s checkpoint's training state; their notes on ``p``."""
    from .read.train_config import mindformers_state
    from .write.trainer import trainer_files

    weights = {s for m in p.matches for s in m.sources}
    state = mindformers_state(p.source.path, p.source.training_state, weights, run_config)
    files, notes = trainer_files(p, state, cfg, str(cfg_path))
    p.notes += notes
    p.notes[:] = [n for n in p.notes if not n.startswith("left out ")]
    return files


def _export_format(opts: ExportOptions) -> tuple[Any, str | None, str]:
    """(the Hugging Face config, where it came from, the output format): a config (given,
    or beside a template directory) makes the output a model directory of safetensors."""
    from .match.inversion import FORMATS
    from .read.sources import read_config

    config, target = opts.config, opts.target
    cfg, cfg_path = (config, "config (a dict)") if isinstance(config, dict) else (
        (read_config(config), str(config)) if config is not None else (None, None))
    if cfg is None and target is not None and Path(target).is_dir():
        found = Path(target) / "config.json"
        cfg, cfg_path = (read_config(found), str(found)) if found.is_file() else (None, None)
    to_directory = cfg is not None or opts.max_shard_size is not None
    fmt = "safetensors" if to_directory else (
        opts.format or ("safetensors" if str(opts.output).endswith(".safetensors") else "pth"))
    if fmt not in FORMATS:
        raise TargetError(f"unknown export format {fmt!r}; choose pth or safetensors")
    if to_directory and cfg is None:
        raise TargetError("a sharded export writes a Hugging Face model directory; pass the "
                          "model's --config config.json")
    return cfg, cfg_path, fmt


def diff(
    a: str | Path,
    b: str | Path,
    *,
    arch: str | None = None,
    ms_model: Any = None,
    mapping: Any = None,
    key: str | None = None,
    unsafe_pickle: bool = False,
    revision: str | None = None,
    strategy: str | Path | None = None,
    step: str | None = None,
    config: Any = None,
    ms_options: dict[str, Any] | None = None,
) -> Any:
    """Compare two checkpoints tensor by tensor, and say what each differing one holds.

    A PyTorch file and a MindSpore ``.ckpt`` (either order) are compared through the
    conversion plan, transforms included: the MindSpore side is ``arch``, ``ms_model``
    or, by default, the ``.ckpt``'s own names and shapes. Two files of one framework are
    paired by name. A tensor that differs is identified by content hash (else by cosine
    > 0.999) among the other side's tensors: ``bn.moving_mean holds bn.running_var``.

    Args:
        a / b: the two checkpoints (``.pth``/``.pt``/``.bin``, ``.safetensors``, ``.ckpt``).
        arch: a registered architecture naming the MindSpore side (a pair only).
        ms_model: a MindSpore Cell (or ``"module:callable"``) naming the MindSpore side.
        mapping: mapping table(s), as for :func:`plan`.
        key / unsafe_pickle: how to read a PyTorch file, as for :func:`inspect`.
        revision: the branch, tag or commit of whichever of ``a`` and ``b`` is a Hugging
            Face Hub id (see :func:`plan`).
        strategy / step: a distributed training output's strategy and save, as for
            :func:`inspect`.
        config / ms_options: the PyTorch side's ``config.json`` (default: the one beside
            it, or in its Hugging Face directory) and a known family's options, as for
            :func:`convert` (``ms_model="mindformers:glm4"``).

    Returns:
        A :class:`~ms_port.check.tensors.TensorDiff`; ``ok`` when every tensor is
        identical, and each delta's ``holds`` names what a differing tensor holds.

    Example:
        >>> d = ms_port.diff("resnet50.pth", "resnet50.ckpt", arch="resnet50")
        >>> d.ok, [(x.target, x.holds) for x in d.problems]
        (False, [('layer3.2.bn2.moving_mean', 'layer3.2.bn2.running_var')])
    """
    from .check.diff import diff as diff_step

    return diff_step(a, b, DiffOptions(arch=arch, ms_model=ms_model, mapping=mapping, key=key,
                                       unsafe_pickle=unsafe_pickle, revision=revision,
                                       strategy=strategy, step=step, config=config,
                                       ms_options=ms_options))

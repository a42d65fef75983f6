"""``ms-port``: a thin skin over :mod:`ms_port.api`.

Each command checks its options, calls one library function and renders the report.
Known failures (:class:`~ms_port.errors.MsPortError`) become one red line on stderr and
exit code 2 (bad input) or 1 (a failed check); ``--debug`` shows the traceback.
"""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap
from typing import Any

import click

from . import __version__
from .errors import MsPortError
from .text import visible

ARCH_HELP = "a built-in architecture (see `ms-port archs`)"


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, no_color="NO_COLOR" in os.environ, highlight=False)


class _Cli(click.Group):
    """Maps MsPortError to a one-line message and its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MsPortError as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            from rich.text import Text

            # the message quotes names from files: shown as text, never as markup or
            # terminal control sequences
            line = Text("error: ", style="bold red") + Text(visible(exc.message, newlines=True))
            _console(stderr=True).print(line, soft_wrap=True)
            if not (ctx.obj and ctx.obj.get("debug")):
                click.echo("(run with --debug for the traceback)", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted; nothing was left half-written", err=True)
            ctx.exit(130)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"],
                                         "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="ms-port")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Move trained PyTorch weights to MindSpore, and prove the move was exact.

    \b
    ms-port inspect resnet50.pth
    ms-port convert resnet50.pth --arch resnet50 -o resnet50.ckpt
    ms-port verify resnet50.pth resnet50.ckpt --arch resnet50
    """
    ctx.ensure_object(dict)["debug"] = debug


def _emit_json(data: dict) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _source_options(f: Any) -> Any:
    f = click.option("--key", metavar="NAME",
                     help="Container holding the state dict (default: state_dict, model, "
                          "ema… tried in turn).")(f)
    f = click.option("--unsafe-pickle", is_flag=True,
                     help="Fully unpickle a TRUSTED legacy file. This runs any code the "
                          "file contains; never use it on downloads.")(f)
    f = click.option("--revision", metavar="REV",
                     help="A checkpoint given as a Hugging Face id (org/name; a local path of "
                          "that name always wins) is read from the Hugging Face cache, its "
                          "weights and config.json downloaded first unless HF_HUB_OFFLINE=1: "
                          "REV is its branch, tag or commit hash (default: main).")(f)
    return f


def _cluster_options(f: Any) -> Any:
    """How a distributed training output (a folder of rank_N/ folders) is read."""
    f = click.option("--strategy", metavar="FILE|DIR",
                     help="A training output's strategy: a file, or a folder of per-rank or "
                          "per-stage files (default: strategy/ beside checkpoint/).")(f)
    f = click.option("--step", metavar="STEP",
                     help="A training output's save to read, STEP or EPOCH_STEP (default: "
                          "the latest by epoch and step).")(f)
    return f


def _model_options(f: Any) -> Any:
    """What a language-model conversion needs beside the weights."""
    f = click.option("--config", "config", metavar="config.json",
                     help="The model's config (default: config.json beside the PyTorch "
                          "checkpoint, or in its Hugging Face model directory).")(f)
    f = click.option("--ms-option", "ms_options", multiple=True, metavar="KEY=VALUE",
                     help="Option of a known model family (--ms-model FAMILY, or one "
                          "recognised by its names), repeatable (mindformers:llama: "
                          "qkv_concat=true for fused q/k/v and gate/up; ms-port archs lists "
                          "each family's).")(f)
    return f


def _options(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r}: expected KEY=VALUE", param_hint="--ms-option")
        out[key.strip()] = value.strip()
    return out


@main.command()
@click.argument("file", required=False, type=click.Path(dir_okay=True))
@click.option("--arch", metavar="NAME", help=f"Instead of a file, list what {ARCH_HELP} "
              "expects.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--filter", "pattern", metavar="REGEX", help="Only tensors whose name matches.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True,
              help="Rows shown in the table.")
@click.option("--all", "show_all", is_flag=True, help="Show every row.")
@_source_options
@_cluster_options
def inspect(file: str | None, arch: str | None, as_json: bool, pattern: str | None,
            limit: int, show_all: bool, key: str | None, unsafe_pickle: bool,
            revision: str | None, strategy: str | None, step: str | None) -> None:
    """Show what a checkpoint holds (.pth/.pt/.bin, .safetensors, .ckpt).

    FILE may also be a sharded set's *.safetensors.index.json or a Hugging Face model
    directory, or a Hugging Face id (org/name, see --revision), or a distributed training
    output (a folder of rank_N/ folders: its whole tensors, its parallel layout and its
    training state apart). With --arch instead of FILE, lists the tensors a built-in
    architecture expects.
    """
    from . import api

    if (file is None) == (arch is None):
        raise click.UsageError("give a FILE or --arch NAME (not both)")
    report = api.inspect(file, arch=arch, filter=pattern, key=key,
                         unsafe_pickle=unsafe_pickle, revision=revision, strategy=strategy,
                         step=step)
    if as_json:
        _emit_json(report.to_dict())
        return
    from .render import render

    _console().print(render(report, limit=None if show_all else limit))


def _finish(report: Any, *, as_json: bool, show: str = "summary") -> None:
    """Print a report (JSON or rich) and exit with its own code (verify: 3 for
    INCONCLUSIVE), else 0 if it is ok and 1 if not."""
    if as_json:
        _emit_json(report.to_dict())
    else:
        from .render import render

        _console().print(render(report, limit=None if show == "all" else 20, show=show))
    sys.exit(getattr(report, "exit_code", 0 if report.ok else 1))


def _progress_bar(enabled: bool):
    """A (phase, done, total) callback drawing a rich progress bar on a TTY, and its closer."""
    if not enabled or not sys.stderr.isatty():
        return None, lambda: None
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                   TransferSpeedColumn(), console=_console(stderr=True), transient=True)
    tasks: dict[str, Any] = {}

    def update(phase: str, done: int, total: int) -> None:
        if not tasks:
            bar.start()
        if phase not in tasks:
            tasks[phase] = bar.add_task(phase, total=total)
        bar.update(tasks[phase], completed=done)

    return update, bar.stop


@main.command()
@click.argument("source", type=click.Path(dir_okay=True))
@click.option("--arch", metavar="NAME", help=f"Target: {ARCH_HELP}.")
@click.option("--target", "template", metavar="FILE",
              help="Target: a template MindSpore checkpoint (names and shapes are read).")
@click.option("--ms-model", metavar="MODULE:CALLABLE",
              help="Target: a function returning a mindspore.nn.Cell, or a known family "
                   "built from the model's config.json (mindformers:llama).")
@click.option("-o", "--output", metavar="FILE", help="The MindSpore checkpoint to write.")
@click.option("--map", "maps", multiple=True, metavar="YAML",
              help="Extra mapping table (repeatable); see docs/mapping.md.")
@click.option("--format", "fmt", type=click.Choice(["ckpt", "safetensors"]), default=None,
              help="Output format (default: from the output's suffix, else ckpt).")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]),
              help="Cast floating-point tensors (default: keep every dtype bit for bit).")
@click.option("--force", is_flag=True, help="Replace an existing output or --save-map file "
              "(after verifying the new one).")
@click.option("--dry-run", is_flag=True, help="Stop after the plan; write nothing.")
@click.option("--save-map", metavar="YAML", help="Save the plan as a mapping to edit and "
              "pass back with --map (never replaces a file without --force).")
@click.option("--allow-missing", is_flag=True, help="Write even if target tensors are unfilled.")
@click.option("--allow-unused", is_flag=True, help="Write even if source tensors are unused.")
@click.option("--allow-shape-match", is_flag=True,
              help="Fill leftovers by equal shape, in order (each flagged as fallback).")
@click.option("--no-align", is_flag=True,
              help="Names only: no structural alignment of the layers names leave unpaired.")
@click.option("--check-finite", is_flag=True, help="Refuse weights with NaN/Inf.")
@click.option("--crc", is_flag=True, help="Append MindSpore's CRC trailer (ckpt).")
@click.option("--max-shard-size", metavar="SIZE",
              help="Write -o DIR as MindSpore safetensors shards of at most SIZE (2GB, "
                   "500MB) plus param_name_map.json (name -> shard).")
@click.option("--strategy", metavar="FILE|DIR",
              help="Write -o DIR as the per-rank slices this parallel strategy gives "
                   "(rank_N/ files and the strategy beside), as a cluster's training reads "
                   "them.")
@click.option("--model-config", "model_config", metavar="FILE.yaml",
              help="With --ms-model mindformers:llama: also write MindFormers' YAML "
                   "(model_config computed from config.json, load_checkpoint: the output; "
                   "run settings left to you, commented). Written after the checkpoint, "
                   "never replacing a file without --force; --dry-run writes nothing.")
@click.option("--training-state", is_flag=True,
              help="SOURCE is a Trainer checkpoint-N/ folder: also write its AdamW moments "
                   "(made as their weights are) and the step counters MindFormers resumes "
                   "from (resume_training). See docs/training.md.")
@click.option("--show", type=click.Choice(["summary", "all"]), default="summary",
              show_default=True, help="'all' adds the per-tensor table.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@_model_options
@_source_options
def convert(source: str, arch: str | None, template: str | None, ms_model: str | None,
            output: str | None, maps: tuple[str, ...], fmt: str, dtype: str | None,
            force: bool, dry_run: bool, save_map: str | None, allow_missing: bool,
            allow_unused: bool, allow_shape_match: bool, no_align: bool, check_finite: bool,
            crc: bool, show: str, as_json: bool, quiet: bool, key: str | None,
            unsafe_pickle: bool, config: str | None, ms_options: tuple[str, ...],
            max_shard_size: str | None, revision: str | None,
            model_config: str | None, strategy: str | None, training_state: bool) -> None:
    """Convert a PyTorch checkpoint SOURCE into a MindSpore checkpoint.

    Every target tensor is matched (mapping table, exact name, built-in rule, then the
    networks' structure for what names leave unpaired: 'aligned'), written
    to a temporary file, read back bit for bit, then renamed into place. Strict by
    default: if anything is unfilled or unused, nothing is written and the exit code is 1.

    SOURCE may be a Hugging Face id (org/name, e.g. Qwen/Qwen2.5-0.5B; see --revision).
    """
    from . import api

    if sum(x is not None for x in (arch, template, ms_model)) != 1:
        raise click.UsageError("give exactly one target: --arch, --target or --ms-model")
    if output is None and not dry_run:
        raise click.UsageError("give -o/--output FILE, or --dry-run")
    progress, stop = _progress_bar(not (quiet or as_json))
    try:
        report = api.convert(
            source, output=output, arch=arch, target=template, ms_model=ms_model,
            mapping=list(maps), format=fmt, dtype=dtype, force=force, dry_run=dry_run,
            save_map=save_map, allow_missing=allow_missing, allow_unused=allow_unused,
            allow_shape_match=allow_shape_match, check_finite=check_finite, crc=crc,
            key=key, unsafe_pickle=unsafe_pickle, progress=progress, align=not no_align,
            config=config, ms_options=_options(ms_options) or None,
            max_shard_size=max_shard_size, revision=revision, model_config=model_config,
            strategy=strategy, training_state=training_state)
    finally:
        stop()
    _finish(report, as_json=as_json, show=show)


@main.command()
@click.argument("source", type=click.Path(dir_okay=True))
@click.argument("checkpoint", type=click.Path(dir_okay=True))
@click.option("--arch", metavar="NAME", help=f"Both networks from {ARCH_HELP}.")
@click.option("--torch-model", metavar="MODULE:CALLABLE",
              help="PyTorch network factory (with --ms-model).")
@click.option("--ms-model", metavar="MODULE:CALLABLE",
              help="MindSpore network factory (with --torch-model).")
@click.option("--map", "maps", multiple=True, metavar="YAML",
              help="Mapping table(s) used for the conversion: they pair tensors and layers.")
@click.option("--tol", type=float, default=1e-5, show_default=True,
              help="The smallest bound: every output and layer must keep ||ms - torch||₂ / "
                   "||torch||₂ <= max(tol, 4 × its float32 noise); NaN/Inf always fails.")
@click.option("--input", "input_file", metavar="FILE",
              help="Real inputs: .npy, or .npz/.safetensors/.pt with one array per "
                   "positional input (batch axis first; integer arrays for token ids); or "
                   "an image or a folder of images, resized to --input-shape (default: the "
                   "target's) and scaled as the target expects.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="C,H,W",
              help="One sample's shape per input, repeatable (default: the architecture's).")
@click.option("--input-dtype", "input_dtypes", multiple=True, metavar="DTYPE",
              help="Dtype of generated inputs, once or per input (default float32; int64 "
                   "for token ids).")
@click.option("--input-range", "input_ranges", multiple=True, metavar="LOW,HIGH",
              help="Draw generated inputs uniformly in [LOW, HIGH), once or per input "
                   "(needed for integers, e.g. 0,VOCAB).")
@click.option("--seed", type=int, default=0, show_default=True, help="Input seed.")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32",
              show_default=True, help="Run both sides in this dtype.")
@click.option("--device", type=click.Choice(["cpu", "gpu", "ascend"]), default="cpu",
              show_default=True, help="Device for both sides.")
@click.option("--torch-device", type=click.Choice(["cpu", "gpu", "ascend"]),
              help="Override the PyTorch side's device.")
@click.option("--ms-device", type=click.Choice(["cpu", "gpu", "ascend"]),
              help="Override the MindSpore side's device.")
@click.option("--no-noise-floor", is_flag=True,
              help="Skip the float64 reference run (the bound is then --tol alone).")
@click.option("--report", "report_path", metavar="FILE.html",
              help="Also write a self-contained HTML report: error vs noise along the "
                   "network, the verdict, the tensor table.")
@click.option("--force", is_flag=True, help="Replace an existing --report file.")
@click.option("--show", type=click.Choice(["summary", "all"]), default="summary",
              show_default=True, help="'all' lists every compared layer.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--quiet", "-q", is_flag=True, help="No progress messages.")
@click.option("--training-state", is_flag=True,
              help="Check the optimizer state instead (SOURCE a Trainer checkpoint-N/, "
                   "CHECKPOINT converted with --training-state): one AdamW step on each "
                   "side (torch's, MindFormers') with the same seeded gradient must give the "
                   "same next weights within float32 rounding.")
@click.option("--mode", type=click.Choice(["auto", "whole", "layers"]), default="auto",
              show_default=True,
              help="'layers': one block (embedding, decoder layer, head) per side in memory "
                   "at a time, for a family target (mindformers:llama); 'whole': both "
                   "networks at once; 'auto': layers when the whole networks would not fit "
                   "in the available memory.")
@_model_options
@_source_options
@_cluster_options
def verify(source: str, checkpoint: str, arch: str | None, torch_model: str | None,
           ms_model: str | None, maps: tuple[str, ...], tol: float, input_file: str | None,
           input_shapes: tuple[str, ...], input_dtypes: tuple[str, ...],
           input_ranges: tuple[str, ...], seed: int, batch: int, dtype: str, device: str,
           torch_device: str | None, ms_device: str | None, no_noise_floor: bool,
           report_path: str | None, force: bool, show: str, as_json: bool, quiet: bool,
           mode: str, key: str | None, unsafe_pickle: bool, config: str | None,
           ms_options: tuple[str, ...], revision: str | None, strategy: str | None,
           step: str | None, training_state: bool) -> None:
    """Is the conversion right? Run PyTorch (with SOURCE) and MindSpore (with CHECKPOINT)
    on the same inputs and compare every tensor, layer and output.

    PASS: every output and paired layer within max(--tol, 4 × its float32 noise), and the
    outputs depend on the input. FAIL: something above its bound, NaN/Inf, or a tensor that
    differs from its source — the first layer in execution order is named, with the tensors
    behind it. INCONCLUSIVE: the outputs barely depend on the input, so agreement proves
    nothing. Exit 0 PASS, 1 FAIL, 2 bad input, 3 INCONCLUSIVE.

    For a Hugging Face language model (a model directory, or a file beside its
    config.json), --ms-model alone is enough (e.g. mindformers:llama): the PyTorch side is
    built with transformers from the config, and the inputs are token ids. SOURCE
    may be a Hugging Face id (org/name, see --revision); CHECKPOINT a distributed training
    output (see --strategy).
    """
    from . import api
    from .check.devices import prefer_fast_cpu_kernels
    from .check.images import is_images
    from .check.inputs import parse_range, parse_shape

    prefer_fast_cpu_kernels()  # this process is ours: before MindSpore's first operation
    if arch is None and ms_model is None:
        raise click.UsageError("give --arch NAME, or --ms-model (with --torch-model unless "
                               "SOURCE is a Hugging Face model with its config.json)")
    images = input_file is not None and is_images(input_file)
    if input_file and (input_dtypes or input_ranges or (input_shapes and not images)):
        raise click.UsageError("--input feeds a file's arrays; --input-shape/--input-dtype/"
                               "--input-range describe generated ones: give one or the other "
                               "(with images, --input-shape 3,H,W is the size they are "
                               "resized to)")
    shapes = [parse_shape(s) for s in input_shapes]
    ranges = [parse_range(r) for r in input_ranges]
    steps = None
    if not (quiet or as_json) and sys.stderr.isatty():
        from rich.text import Text

        console = _console(stderr=True)

        def steps(msg: str) -> None:
            console.print(Text(f"… {visible(msg)}", style="dim"))

    report = api.verify(source, checkpoint, arch=arch, torch_model=torch_model, mode=mode,
                        ms_model=ms_model, mapping=list(maps), tol=tol, seed=seed,
                        batch=batch, input_shape=shapes or None, inputs=input_file,
                        input_dtype=list(input_dtypes) or None, input_range=ranges or None,
                        dtype=dtype, device=device, torch_device=torch_device,
                        ms_device=ms_device, noise_floor=not no_noise_floor, key=key,
                        unsafe_pickle=unsafe_pickle, progress=steps, report=report_path,
                        force=force, config=config, ms_options=_options(ms_options) or None,
                        revision=revision, strategy=strategy, step=step,
                        training_state=training_state)
    _finish(report, as_json=as_json, show=show)


@main.command()
@click.argument("checkpoint", type=click.Path(dir_okay=True))
@click.option("--arch", metavar="NAME", help=f"PyTorch side: the reference of {ARCH_HELP}.")
@click.option("--torch-model", metavar="MODULE:CALLABLE",
              help="PyTorch side: a function returning your torch.nn.Module.")
@click.option("--target", "template", metavar="FILE",
              help="PyTorch side: a template .pth/.safetensors (names and shapes are read).")
@click.option("--ms-model", metavar="MODULE:CALLABLE",
              help="The MindSpore network, so rules know its layer types (implied by --arch).")
@click.option("-o", "--output", metavar="FILE", help="The PyTorch checkpoint to write.")
@click.option("--map", "maps", multiple=True, metavar="YAML",
              help="Extra mapping table (repeatable), written PyTorch -> MindSpore as for "
                   "convert; export inverts it.")
@click.option("--format", "fmt", type=click.Choice(["pth", "safetensors"]),
              help="Output format (default: from the output's suffix, else pth).")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]),
              help="Cast floating-point tensors (default: keep every dtype bit for bit).")
@click.option("--force", is_flag=True, help="Replace an existing output (after verifying "
              "the new one).")
@click.option("--dry-run", is_flag=True, help="Stop after the plan; write nothing.")
@click.option("--allow-missing", is_flag=True, help="Write even if PyTorch tensors are unfilled.")
@click.option("--allow-unused", is_flag=True, help="Write even if checkpoint tensors are unused.")
@click.option("--show", type=click.Choice(["summary", "all"]), default="summary",
              show_default=True, help="'all' adds the per-tensor table.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--config", metavar="config.json",
              help="PyTorch side: a Hugging Face model's config; -o is then a model "
                   "directory (config.json carried over) that from_pretrained loads.")
@click.option("--max-shard-size", metavar="SIZE",
              help="With --config: write shards of at most SIZE (2GB) plus "
                   "model.safetensors.index.json.")
@click.option("--ms-option", "ms_options", multiple=True, metavar="KEY=VALUE",
              help="Option of a known --ms-model family the checkpoint was converted with, "
                   "repeatable (mindformers:qwen3: use_interleaved_weight_layout_mlp=false).")
@click.option("--training-state", is_flag=True,
              help="With --config: -o is also a Trainer checkpoint-N/ folder that "
                   "resume_from_checkpoint continues from (optimizer.pt, scheduler.pt, "
                   "trainer_state.json from the checkpoint's AdamW state). Needs "
                   "--train-config. See docs/training.md.")
@click.option("--train-config", metavar="RUN.yaml",
              help="The MindFormers YAML the run trained with: its optimizer (AdamW) and "
                   "lr_schedule, which a checkpoint does not hold.")
@_cluster_options
def export(checkpoint: str, arch: str | None, torch_model: str | None, template: str | None,
           ms_model: str | None, output: str | None, maps: tuple[str, ...], fmt: str | None,
           dtype: str | None, force: bool, dry_run: bool, allow_missing: bool,
           allow_unused: bool, show: str, as_json: bool, quiet: bool, config: str | None,
           max_shard_size: str | None, ms_options: tuple[str, ...], training_state: bool,
           train_config: str | None, strategy: str | None, step: str | None) -> None:
    """Convert a MindSpore CHECKPOINT back to PyTorch (.pth or .safetensors), or to a
    Hugging Face model directory (--config; fused tensors split, a tied head kept tied).
    CHECKPOINT may be a distributed training output (a folder of rank_N/ folders, or the
    one holding checkpoint/ and strategy/): its slices are joined, its training state left
    out.

    The conversion's own rules and mapping tables, inverted: every rename swaps sides
    and every transform is undone. BatchNorm's num_batches_tracked is restored as 0.
    The output loads with load_state_dict(strict=True) and is read back bit for bit.
    """
    from . import api

    if sum(x is not None for x in (arch, torch_model, template, config)) != 1 and not (
            config and template):
        raise click.UsageError("give exactly one PyTorch side: --arch, --torch-model, "
                               "--target or --config")
    if output is None and not dry_run:
        raise click.UsageError("give -o/--output FILE, or --dry-run")
    progress, stop = _progress_bar(not (quiet or as_json))
    try:
        report = api.export(checkpoint, output=output, arch=arch, torch_model=torch_model,
                            target=template, ms_model=ms_model, mapping=list(maps),
                            format=fmt, dtype=dtype,
                            force=force, dry_run=dry_run, allow_missing=allow_missing,
                            allow_unused=allow_unused, progress=progress, config=config,
                            max_shard_size=max_shard_size,
                            ms_options=_options(ms_options) or None, strategy=strategy,
                            step=step, training_state=training_state,
                            train_config=train_config)
    finally:
        stop()
    _finish(report, as_json=as_json, show=show)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def archs(as_json: bool) -> None:
    """List the targets: built-in architectures (--arch), model families computed from a
    checkpoint's config.json (--ms-model FAMILY), and model zoos (PREFIX:NAME)."""
    from .archs import get_arch, list_archs
    from .archs.manifest import load_manifest
    from .match.mapping import selected_model_types
    from .read.targets import FAMILIES, FAMILY_NETWORKS, ZOO_HELP, family_module

    entries = [get_arch(n) for n in list_archs()]
    # parameter counts from the recorded manifests; unrecorded (user) archs are not built
    params: dict[str, int | None] = {}
    for a in entries:
        recorded = load_manifest(a.name)
        params[a.name] = None if recorded is None else sum(
            math.prod(t.shape) for t in recorded.tensors.values())
    families = [{"name": f, "network": FAMILY_NETWORKS.get(f, ""),
                 "model_types": selected_model_types(f),
                 "options": sorted(getattr(family_module(f), "OPTIONS", {}))}
                for f in FAMILIES]
    if as_json:
        _emit_json({"archs": [{"name": a.name, "parameters": params[a.name],
                               "reference": a.reference, "mapping": a.mapping,
                               "input_shape": list(a.input_shape), "notes": a.notes}
                              for a in entries],
                    "families": families,
                    "zoos": [{"option": k, "builds": v} for k, v in ZOO_HELP.items()]})
        return
    from rich.table import Table
    from rich.text import Text

    def table(title: str, *columns: str) -> Table:
        made = Table(title=title, title_justify="left", box=None, pad_edge=False,
                     title_style="bold")
        for col in columns:
            made.add_column(col, justify="right" if col == "parameters" else "left",
                            no_wrap=col != columns[-1], overflow="fold")
        return made

    arch_table = table("built-in architectures (--arch NAME: both networks)",
                       "name", "parameters", "input", "PyTorch reference")
    for a in entries:
        count = params[a.name]
        arch_table.add_row(a.name, "-" if count is None else f"{count:,}",
                           "×".join(map(str, a.input_shape)), a.reference)
    notes = {a.notes for a in entries if a.notes}
    family_table = table("model families (--ms-model FAMILY, computed from config.json)",
                         "family", "Hugging Face model_type", "MindFormers network")
    for f in families:
        family_table.add_row(f["name"], ", ".join(f["model_types"]) or "-", f["network"])
    zoo_table = table("model zoos (PREFIX:NAME)", "option", "builds")
    for option, builds in ZOO_HELP.items():
        zoo_table.add_row(option, builds)
    console = _console()
    console.print(arch_table)
    for note in sorted(notes):  # the same for every architecture: once, not per row
        console.print(Text(f"  {visible(note)}", style="dim"))
    console.print()
    console.print(family_table)
    console.print(Text("  --ms-option KEY=VALUE, per family:", style="dim"))
    for f in families:  # wrapped under the family, not at the screen's edge
        line = textwrap.fill(f"{f['name']}: {', '.join(f['options']) or 'none'}",
                             width=max(40, console.width - 4), initial_indent="    ",
                             subsequent_indent="      ")
        console.print(Text(line, style="dim"))
    console.print()
    console.print(zoo_table)


@main.command()
@click.argument("a", type=click.Path(dir_okay=True))
@click.argument("b", type=click.Path(dir_okay=True))
@click.option("--arch", metavar="NAME", help=f"MindSpore side: {ARCH_HELP}.")
@click.option("--ms-model", metavar="MODULE:CALLABLE",
              help="MindSpore side: a function returning a mindspore.nn.Cell, or a known "
                   "family built from the PyTorch side's config.json (mindformers:glm4).")
@click.option("--map", "maps", multiple=True, metavar="YAML",
              help="Extra mapping table (repeatable), as for convert.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--all", "show_all", is_flag=True, help="List identical tensors too.")
@_source_options
@_cluster_options
@_model_options
def diff(a: str, b: str, arch: str | None, ms_model: str | None, maps: tuple[str, ...],
         as_json: bool, show_all: bool, key: str | None, unsafe_pickle: bool,
         revision: str | None, strategy: str | None, step: str | None, config: str | None,
         ms_options: tuple[str, ...]) -> None:
    """Compare the tensors of A and B, and name what each differing one holds.

    A .pth (or .safetensors, or a Hugging Face directory) and a .ckpt, in either order,
    are compared through the conversion plan (the MindSpore side: --arch, --ms-model, or
    the .ckpt's own names, with a known family's table where they are its);
    two files of one framework are paired by name. Exit 0 identical, 1 differences,
    2 bad input. A or B may be a Hugging Face id (org/name, see --revision).
    """
    from . import api

    if arch is not None and ms_model is not None:
        raise click.UsageError("give --arch or --ms-model, not both")
    report = api.diff(a, b, arch=arch, ms_model=ms_model, mapping=list(maps), key=key,
                      unsafe_pickle=unsafe_pickle, revision=revision, strategy=strategy,
                      step=step, config=config, ms_options=_options(ms_options) or None)
    _finish(report, as_json=as_json, show="all" if show_all else "summary")


def _exit_now(status: int) -> None:
    """What Python's own exit does before it tears the interpreter down: wait for
    non-daemon threads, run every atexit handler (a temporary log folder's removal),
    flush the output; then exit with ``status`` and skip the teardown."""
    import atexit
    import contextlib
    import threading

    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:  # wakes idle thread pools first, then joins, as exit does
        shutdown()
    else:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()  # the handlers a normal exit runs, in order
    for stream in (sys.stdout, sys.stderr):
        # a closed pipe (| head): nothing more can be written
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


def run() -> None:
    """The ``ms-port`` command: :func:`main`, then an exit without the interpreter's
    teardown. Unloading torch and MindSpore took 1.4 s after a verify had printed its
    verdict (of 8.3 s in all). Only a command that ended with an exit status exits this
    way; an uncaught exception (``--debug``) is left to Python. The in-process ``main``
    (CliRunner, tests) is unchanged."""
    try:
        main()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            _exit_now(exc.code or 0)
        raise


if __name__ == "__main__":  # pragma: no cover
    run()

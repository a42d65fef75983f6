"""The verify engine: a request (what the user gave, read and resolved) goes through
the steps — the tensors through the plan, a forward by one driver, the judge, the report.

Drivers, each ``(request, ...) -> ParityReport``:

- :func:`whole`: both whole networks built, loaded and run at once (any network);
- :func:`by_layers`: one block per side in memory at a time (a family target whose
  blocks are known: :mod:`ms_port.check.blocks`);
- :func:`graph`: a family whose MindSpore network runs only in GRAPH mode with CPU
  stand-ins (MindFormers' parallel_core), whole or by blocks;
- :func:`tensors_only`: no forward can run; every tensor through the plan, and the
  forward INCONCLUSIVE with the reason.

:func:`verify` reads both files, builds the inputs, picks the driver and writes the
report; :func:`ms_port.verify` is its door. Nothing here imports the doors.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import ForwardUnavailable, MsPortError
from ..match.plan import LENIENT, Plan, make_plan
from ..options import VerifyOptions
from ..read.distributed import cluster_notes, find_training_output
from ..read.sources import MINDSPORE_FORMATS, Source, read_source
from ..read.targets import from_cell, from_family, torch_reference
from ..resolve import family_fits, read_with_config, resolve_mapping
from ..write.writers import check_not_input, check_output, write_text


@dataclass
class Request:
    """One verify: the options, and what they resolved to."""

    options: VerifyOptions
    src: Source
    ckpt: Source
    #: (PyTorch side, MindSpore side) as the user named them
    names: tuple[str, str]
    feed: list[Any]
    family: str | None = None
    progress: Callable[[str], None] | None = None

    def step(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)

    @property
    def torch_device(self) -> str:
        return self.options.torch_device or self.options.device

    @property
    def ms_device(self) -> str:
        return self.options.ms_device or self.options.device

    def plan(self, target: Any, arch: str | None = None) -> Plan:
        """The plan against ``target``, leftovers allowed (the tensor check reports them)."""
        table = resolve_mapping(self.options.mapping, arch=arch, config=self.src.config,
                                target=target)
        return make_plan(self.src, target, table, options=LENIENT)

    def run(self, notes: list[str] | None = None, *, whole: bool = False) -> Any:
        """A :class:`~ms_port.check.parity.Run` on this request's inputs: in the options'
        dtype and on their devices for the whole-network driver (``whole``), else on the
        CPU in float32 (the drivers that run the family's own way)."""
        from .parity import Run, check_run

        opts = self.options
        run = Run(self.feed, seed=opts.seed, tol=opts.tol, noise_floor=opts.noise_floor,
                  progress=self.progress, notes=list(notes or []))
        if whole:
            run.dtype, run.torch_device, run.ms_device = (
                opts.dtype, self.torch_device, self.ms_device)
            check_run(run)
        return run

    def not_loaded(self, missing: list[str], unused: list[str], *,
                   whole: bool = False) -> Any:
        from .networks import not_loaded_report

        return not_loaded_report(self.names[1], missing, unused, self.run(whole=whole))


# -- the door's steps --------------------------------------------------------------------


def verify(source: str | Path, checkpoint: str | Path, options: VerifyOptions,
           progress: Callable[[str], None] | None = None) -> Any:
    """Is the conversion right? (:func:`ms_port.verify` documents the options.)"""
    from .language import is_language_model

    opts = options
    if opts.report is not None:
        check_output(opts.report, force=opts.force)
        check_not_input(opts.report, source, checkpoint)
    entry = None
    if opts.arch is not None:
        from ..archs import get_arch

        entry = get_arch(opts.arch)
    # read and validate both files before building anything heavy
    src, ckpt, swapped = _read_both(source, checkpoint, opts)
    if swapped:  # given MindSpore first (e.g. after an export): both directions work
        source, checkpoint = checkpoint, source
    src, reference_notes = (src, []) if opts.torch_model is not None else \
        _reference_view(src, opts.ms_model)  # a PyTorch model given holds its own names
    # a PyTorch twin built from what the checkpoint describes of itself (ultralytics), or,
    # where the user trusted the file with its code, the module it holds
    opts = replace(opts, torch_model=torch_reference(opts.torch_model, src.described))
    own = getattr(src.described, "module", None)
    if opts.torch_model is None and own is not None:
        opts = replace(opts, torch_model=lambda: own.float().eval())
        reference_notes.append(f"the PyTorch side is the checkpoint's own "
                               f"{src.described.cls}, unpickled with its code (--unsafe-pickle)")
    language = opts.arch is None and is_language_model(src.config)
    if opts.arch is None and (opts.ms_model is None
                              or (opts.torch_model is None and not language)):
        zoo = (f" ({opts.ms_model} is MindCV's network: name its PyTorch twin, e.g. "
               f"--torch-model timm:NAME or torchvision:NAME)"
               if isinstance(opts.ms_model, str) and opts.ms_model.startswith("mindcv:")
               else "")
        raise MsPortError("give --arch NAME (arch=...), or both --torch-model and --ms-model "
                          f"(torch_model=, ms_model=){zoo}; for a Hugging Face model "
                          "directory, --ms-model alone: the PyTorch side is built from its "
                          "config.json")
    feed, zoo_shape = _inputs(opts, src, entry, language)
    request = Request(opts, src, ckpt, (str(source), str(checkpoint)), feed,
                      progress=progress)
    result = _dispatch(request, entry, language)
    if swapped:
        result.notes.append(f"{checkpoint} is the MindSpore side, {source} the PyTorch side")
    result.notes += reference_notes
    result.notes += cluster_notes(ckpt)
    if zoo_shape is not None:
        result.notes.append(f"inputs of {'×'.join(map(str, zoo_shape[0]))}: {zoo_shape[1]} "
                            "(--input-shape for another)")
    if opts.report is not None:
        from .html import render_html

        write_text(opts.report, render_html(result.to_dict()), force=opts.force)
    return result


def _reference_view(src: Source, ms_model: Any) -> tuple[Source, list[str]]:
    """A known family's view of a source layout transformers has no class for, as the
    layout it has (GLM-4's remote code as transformers' glm), and the note that says so;
    ``src`` as it is otherwise."""
    from ..read.targets import FAMILIES, family_module

    if not (isinstance(ms_model, str) and ms_model in FAMILIES):
        return src, []
    where = getattr(family_module(ms_model), "REFERENCE", None)
    if where is None:
        return src, []
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)(src)


def _read_both(source: str | Path, checkpoint: str | Path,
               opts: VerifyOptions) -> tuple[Source, Source, bool]:
    """(the PyTorch side, the MindSpore side, whether the user gave them the other way)."""
    def torch_side(path: str | Path) -> Source:
        return read_with_config(path, config=opts.config, **opts.reading())

    def ms_side(path: str | Path) -> Source:
        return read_source(path, strip_prefixes=False, **opts.cluster())

    if find_training_output(Path(source)) is not None:  # given the other way round
        return torch_side(checkpoint), ms_side(source), True
    src = torch_side(source)
    ckpt = ms_side(checkpoint)
    if src.format in MINDSPORE_FORMATS and ckpt.format not in MINDSPORE_FORMATS:
        return torch_side(checkpoint), read_source(source, strip_prefixes=False), True
    return src, ckpt, False


def _inputs(opts: VerifyOptions, src: Source, entry: Any,
            language: bool) -> tuple[list[Any], tuple[Any, str] | None]:
    """(the inputs both networks run on, MindCV's input size where that chose it)."""
    from ..read.targets import zoo_input_shape
    from .images import is_images
    from .inputs import generate_inputs, load_inputs

    if isinstance(opts.inputs, (str, Path)) and not is_images(opts.inputs):
        return load_inputs(opts.inputs), None
    if opts.inputs is not None and not isinstance(opts.inputs, (str, Path)):
        return opts.inputs, None
    shapes = opts.input_shape or (entry.input_shape if entry else None)
    dtypes, ranges = opts.input_dtype, opts.input_range
    zoo_shape = None if shapes or language else zoo_input_shape(opts.ms_model)
    if zoo_shape is not None:
        shapes = zoo_shape[0]
    if opts.inputs is not None:  # real images, prepared for this target
        return _images(opts.inputs, shapes, opts.ms_model), zoo_shape
    if language:  # token ids from the vocabulary unless told otherwise
        from .language import token_defaults

        default_shapes, default_dtypes, default_ranges = token_defaults(
            src.config, str(src.config_path or "config.json"))
        shapes = shapes or default_shapes
        dtypes = dtypes or default_dtypes
        ranges = ranges or default_ranges
    if shapes is None:
        raise MsPortError("no input: pass --input FILE or --input-shape C,H,W "
                          "(inputs=... or input_shape=...) for custom networks")
    if shapes and not isinstance(shapes[0], (tuple, list)):
        shapes = [tuple(shapes)]
    feed = generate_inputs([tuple(s) for s in shapes], batch=opts.batch, seed=opts.seed,
                           dtypes=dtypes or ("float32",), ranges=ranges or (None,))
    return feed, zoo_shape


def _images(path: str | Path, shape: Any, ms_model: Any) -> list[Any]:
    """``--input`` naming image files: one batch, resized and scaled as the target expects
    (:mod:`ms_port.check.images`)."""
    from .images import load_images, preparation
    from .inputs import InputArray

    if shape and isinstance(shape[0], (tuple, list)):
        shape = shape[0] if len(shape) == 1 else None
    prep = preparation(tuple(shape) if shape else None, ms_model)
    batch, names = load_images(path, prep)
    shown = ", ".join(names[:3]) + (f", … ({len(names)} images)" if len(names) > 3 else "")
    return [InputArray("input0", batch, f"file {path}: {shown}; {prep.describe()}")]


def _dispatch(request: Request, entry: Any, language: bool) -> Any:
    """The report of the driver the request calls for."""
    from ..read.targets import FAMILIES, family_module

    opts, src = request.options, request.src
    ms_model = opts.ms_model
    family = ms_model if isinstance(ms_model, str) and ms_model in FAMILIES else None
    request.family = family
    module = family_module(family) if family else None
    forward = getattr(module, "FORWARD", None)
    if forward is not None and opts.arch is None and opts.torch_model is None and language:
        family_fits(src, family, opts.ms_options)
        return graph(request, forward)
    if module is not None and getattr(module, "build", None) is None:
        family_fits(src, family, opts.ms_options)
        return tensors_only(request, module.NO_FORWARD)
    if family is not None:  # a config that does not fit the checkpoint: one line, now
        from .language import family_builder

        family_fits(src, family, opts.ms_options)
        first = np.asarray(request.feed[0].array)
        ms_model = family_builder(family, src.config or {}, opts.ms_options,
                                  int(first.shape[1]) if first.ndim > 1 else 1)
    elif opts.ms_options:
        raise MsPortError(f"ms_options are for the known families ({', '.join(FAMILIES)})")
    return _local(request, entry, ms_model, language)


def _local(request: Request, entry: Any, ms_model: Any, language: bool) -> Any:
    """Whole networks, or a family's blocks one at a time, as the mode and memory say."""
    from ..read.targets import family_blocks, family_options
    from .blocks import choose_mode
    from .language import check_size, torch_from_config

    opts, src, family = request.options, request.src, request.family
    torch_model = opts.torch_model
    from_config = torch_model is None and language
    where = src.config_path or request.names[0]
    if from_config:
        check_size(src.config, where, sum(i.numel for i in src))
        torch_model = lambda: torch_from_config(src.config, where)  # noqa: E731
    blocks = family_blocks(family) if family else None
    why_not = next((why for bad, why in (
        (blocks is None, "only a family target computed from config.json knows its blocks "
                         "(--ms-model mindformers:llama)"),
        (not from_config, "the PyTorch blocks are transformers' own, built from config.json, "
                          "not a --torch-model"),
        (opts.dtype != "float32", f"--dtype {opts.dtype}: the blocks run in float32"),
        (request.torch_device != "cpu" or request.ms_device != "cpu",
         "the blocks run on the CPU"),
    ) if bad), None)
    mode, why = choose_mode(opts.mode, sum(i.numel for i in src), why_not)
    if mode == "layers":
        options = family_options(family, opts.ms_options)
        if "seq_length" not in (opts.ms_options or {}):
            options["seq_length"] = int(np.asarray(request.feed[0].array).shape[1])
        try:
            result = by_layers(request, blocks(src.config,
                                               lambda c: torch_from_config(c, where),
                                               **options))
        except ForwardUnavailable as exc:  # a block that does not fit in memory
            result = tensors_only(request, exc.message)
    else:
        result = whole(request, entry, torch_model, ms_model)
    if result.mode != "tensors":
        result.mode, result.mode_reason = mode, why
    return result


# -- drivers -----------------------------------------------------------------------------


def take_declared(plan: Plan, ckpt: Source) -> list[str]:
    """A tensor the target declares (a value, no PyTorch counterpart: MindFormers' MoE
    router's zero accumulator ``fi_accu``) that ``ckpt`` lacks is taken as declared, as
    the network's own loader initialises it: added to ``ckpt``, and a note says so.
    Checkpoints made by MindFormers' own converters leave it out."""
    from ..read.tensors import TensorInfo

    taken = []
    for m in plan.matches:
        if m.how == "initialised" and m.target not in ckpt.tensors:
            ckpt.tensors[m.target] = TensorInfo(m.target, m.shape, m.out_dtype,
                                                loader=lambda m=m: plan.expected(m))
            taken.append(f"{m.target} ({m.init})")
    if not taken:
        return []
    return [f"{len(taken)} tensor{'s' * (len(taken) != 1)} the target declares "
            f"{'are' if len(taken) != 1 else 'is'} not in {ckpt.path}: "
            f"{', '.join(taken[:3])}{' …' if len(taken) > 3 else ''} — taken as declared, "
            "as the network initialises it where a checkpoint leaves it out"]


def tensors_only(request: Request, why: str) -> Any:
    """verify where no forward can run: every tensor through the plan, and the verdict
    for the forward INCONCLUSIVE with the reason (a differing tensor still FAILs)."""
    from ..read.targets import from_family
    from .parity import tensor_note
    from .report import FAIL, INCONCLUSIVE, ParityReport
    from .tensors import compare_through_plan

    src, ckpt, opts = request.src, request.ckpt, request.options
    tgt = from_family(request.family, src.config, opts.ms_options)
    plan = request.plan(tgt)
    declared = take_declared(plan, ckpt)
    not_loaded = [n for n in tgt.tensors if n not in ckpt.tensors]
    if not_loaded:
        return request.not_loaded(not_loaded, [n for n in ckpt.tensors
                                               if n not in tgt.tensors])
    tensors = compare_through_plan(plan, {i.name: i.load for i in ckpt}, a=request.names[0],
                                   b=request.names[1], infos=ckpt.tensors)
    differing = [d for d in tensors.deltas if d.status in ("differs", "shape")]
    if differing:
        verdict = FAIL
        reasons = [f"{len(differing)} MindSpore tensor(s) differ from their PyTorch source "
                   f"through the plan: {'; '.join(tensor_note(d) for d in differing[:3])}"]
    else:
        verdict = INCONCLUSIVE
        reasons = [f"no forward ran: {why}; every tensor is identical to its source through "
                   f"the plan ({len(tensors.deltas)} compared), which proves the tensors and "
                   "their layout as the table states it, not the network"]
    first = np.asarray(request.feed[0].array)
    result = ParityReport(
        ok=False, tol=opts.tol, error=float("nan"), max_abs=float("nan"), outputs=[],
        noise_floor=None, first_divergence=None, input_shape=tuple(first.shape[1:]),
        batch=int(first.shape[0]), seed=opts.seed, dtype="float32", torch_device="cpu",
        ms_device="cpu", verdict=verdict, reasons=reasons, tensors=tensors,
        inputs=[i.to_dict() for i in request.feed], mode="tensors", mode_reason=why,
        notes=declared)
    result.message = f"{verdict}: {reasons[0]}"
    return result


def by_layers(request: Request, blocks: Any) -> Any:
    """verify one block at a time (:mod:`ms_port.check.blocks`): the plan against the
    family's computed target, every tensor through it, then the blocks."""
    from ..read.targets import from_family
    from .blocks import run_blocks
    from .parity import correspondence_from_pairs
    from .tensors import PlanCheck

    src, ckpt = request.src, request.ckpt
    tgt = from_family(request.family, src.config, blocks.options or None)
    plan = request.plan(tgt)
    notes: list[str] = take_declared(plan, ckpt)
    not_loaded = [n for n in tgt.tensors if n not in ckpt.tensors]
    unused = [n for n in ckpt.tensors if n not in tgt.tensors]
    if not_loaded:
        return request.not_loaded(not_loaded, unused)
    # every tensor through the plan, a block's before the block runs (run_blocks)
    tensors = PlanCheck(plan, {i.name: i.load for i in ckpt}, a=request.names[0],
                        b=request.names[1], infos=ckpt.tensors)
    correspondence = correspondence_from_pairs((m.target, m.source) for m in plan.matches
                                               if not m.parts and m.part is None)
    if unused:
        notes.append(f"{len(unused)} checkpoint entries unused by the network: "
                     f"{', '.join(unused[:3])}")
    return run_blocks(blocks, src, ckpt, request.run(notes), correspondence=correspondence,
                      tensors=tensors, ms_names=list(tgt.tensors))


def whole(request: Request, entry: Any, torch_model: Any, ms_model: Any) -> Any:
    """verify with both whole networks built, loaded and run at once."""
    from .networks import build_network, load_ms_weights, load_torch_weights
    from .parity import compare_networks, correspondence_from_pairs
    from .tensors import compare_through_plan

    src, ckpt, opts = request.src, request.ckpt, request.options
    source, checkpoint = request.names
    request.step("building the PyTorch network")
    tnet = build_network(torch_model, "--torch-model", entry, "torch")
    load_torch_weights(tnet, src)  # the Source read above; no second unpickling
    request.step("building the MindSpore network")
    mnet = build_network(ms_model, "--ms-model", entry, "mindspore")
    tgt = from_cell(mnet)
    tgt.family = request.family
    if request.family is not None:  # the layout settings a table's entries read (when:),
        # which the built network's names cannot show (use_rearrange_rope)
        tgt.settings = from_family(request.family, src.config, opts.ms_options).settings
    plan = request.plan(tgt, arch=opts.arch)
    declared = take_declared(plan, ckpt)
    request.step(f"loading {checkpoint}")
    not_loaded, unused = load_ms_weights(mnet, ckpt)  # the Source read above
    # the plan names MindSpore's tensors by Parameter.name, which need not be the cell path
    # the hooks see (MindCV's RegNet: '0.blocks.0.proj.weight' at 'stages.0.blocks.0.proj')
    paths = {param.name: path for path, param in mnet.parameters_and_names()}
    # a fused or split tensor's layer computes several of the other side's layers at once
    correspondence = correspondence_from_pairs((paths.get(m.target, m.target), m.source)
                                               for m in plan.matches
                                               if not m.parts and m.part is None)
    if not_loaded:
        return request.not_loaded(not_loaded, unused, whole=True)
    request.step("comparing every tensor through the plan")
    values = {param.name: (lambda p=param: p.asnumpy())
              for _, param in mnet.parameters_and_names()}
    tensors = compare_through_plan(plan, values, a=str(source), b=str(checkpoint))
    result = compare_networks(tnet, mnet, request.run(whole=True),
                              correspondence=correspondence, tensor_diff=tensors)
    result.notes += declared + list(getattr(mnet, "ms_port_notes", []))
    if unused:
        result.notes.append(f"{len(unused)} checkpoint entries unused by the network: "
                            f"{', '.join(unused[:3])}")
    return result


def graph(request: Request, forward: str) -> Any:
    """verify a family whose MindSpore network runs only in GRAPH mode with CPU stand-ins
    (MindFormers' parallel_core): whole (:func:`graph_whole`) or one block at a time, as
    the mode and the memory say; INCONCLUSIVE for the forward where MindFormers' network
    cannot run here."""
    from ..read.targets import family_blocks, family_options
    from .blocks import choose_mode
    from .language import check_size, torch_from_config

    src, family, opts = request.src, request.family, request.options
    where = src.config_path or request.names[0]
    check_size(src.config, where, sum(i.numel for i in src))
    blocks = family_blocks(family)
    config, said = _run_config(family, src.config, int(np.asarray(request.feed[0].array).shape[1]))
    mode, why = choose_mode(opts.mode, sum(i.numel for i in src),
                            None if blocks is not None else
                            f"{family} has no blocks to run one at a time")
    if mode == "whole":
        result = graph_whole(request, lambda: torch_from_config(config, where), forward,
                             config)
        if result.mode == "whole":
            result.mode_reason = f"{why}; GRAPH mode with CPU stand-ins"
        result.notes += said
        return result
    options = family_options(family, opts.ms_options)
    options.setdefault("seq_length", int(np.asarray(request.feed[0].array).shape[1]))
    try:
        result = by_layers(request, blocks(config, lambda c: torch_from_config(c, where),
                                           **options))
    except ForwardUnavailable as exc:
        return tensors_only(request, exc.message)
    result.mode, result.mode_reason = mode, why
    result.notes += said
    return result


def _run_config(family: str, config: dict[str, Any], seq_length: int
                ) -> tuple[dict[str, Any], list[str]]:
    """The config both sides are built with for ``seq_length`` tokens (a family's
    ``run_config``: DeepSeek-V3.2's indexer keeping fewer tokens than the run has), and
    what the report says of it."""
    from ..read.targets import family_module

    adjust = getattr(family_module(family), "run_config", None)
    return adjust(config, seq_length) if adjust is not None else (config, [])


def graph_whole(request: Request, build_torch: Callable[[], Any], forward: str,
                config: dict[str, Any] | None = None) -> Any:
    """verify a network that runs only in GRAPH mode, with CPU stand-ins for the kernels
    it lacks (MindFormers' parallel_core): every tensor through the plan, then the logits
    of both networks against their rounding-aware bound. GRAPH mode records no layer, so
    a wrong tensor is named by the tensor check; the report lists the stand-ins that ran.
    A network that does not compile here is INCONCLUSIVE for the forward, naming why."""
    from .compare import torch_outputs
    from .inputs import second_draw
    from .networks import load_torch_weights

    first = tensors_only(request, "")
    if first.verdict == "FAIL" and first.tensors is None:  # tensors the network needs, absent
        return first
    run = request.run([n for n in first.notes if "taken as declared" in n])
    opts = request.options
    ids = np.asarray(request.feed[0].array)
    other = np.asarray(second_draw(request.feed, seed=opts.seed)[0].array)
    request.step("building the PyTorch network")
    tnet = build_torch()
    load_torch_weights(tnet, request.src)
    runs = _torch_runs(tnet, (ids, other), run, torch_outputs)
    del tnet
    module = importlib.import_module(forward)
    request.step("building and running MindFormers' network (GRAPH mode, CPU stand-ins)")
    t0 = time.perf_counter()
    try:
        ran = _graph_forward(request, module, ids,
                             request.src.config if config is None else config)
    except (RuntimeError, ValueError, TypeError) as exc:  # MindSpore's compile/run errors
        return tensors_only(request, ForwardUnavailable.of(exc).message)
    if not isinstance(ran, tuple):
        return ran  # the checkpoint does not load: that report
    logits, standins = ran
    run.timings["mindspore_forward"] = time.perf_counter() - t0
    run.notes.append("MindSpore ran in GRAPH mode with CPU stand-ins for what has no CPU "
                     f"kernel ({len(standins)}): " + "; ".join(standins))
    run.notes.append("layers not recorded: GRAPH mode runs no cell hooks; the tensors are "
                     "compared one by one instead")
    return _judge_logits(runs, logits, first.tensors, run)


def _torch_runs(tnet: Any, draws: tuple[np.ndarray, np.ndarray], run: Any,
                outputs: Callable) -> dict[str, dict[str, np.ndarray]]:
    """PyTorch's logits in float32, in float64 (optional: the bound is tol without it) and
    on the second draw."""
    import torch

    from . import devices

    cpu = devices.torch_device("cpu")

    def forward(model: Any, x: np.ndarray, what: str) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        out = dict(devices.run_torch(model, [x], cpu, what, outputs))
        run.timings[what.replace(" ", "_")] = time.perf_counter() - t0
        return out

    runs = {"32": forward(tnet, draws[0], "torch forward"), "64": {}}
    if run.noise_floor:
        try:  # optional, as in the whole-network run: the comparison stands without it
            runs["64"] = forward(devices.torch_variant(tnet, torch.float64, cpu), draws[0],
                             "torch float64 forward")
        except MsPortError as exc:
            run.unmeasured = exc.message.split("; check")[0]
            run.notes.append(f"noise not measured: {run.unmeasured}; the bound is tol")
    runs["2"] = forward(tnet, draws[1], "torch second-input forward")
    return runs


def _graph_forward(request: Request, module: Any, ids: np.ndarray,
                   config: dict[str, Any]) -> Any:
    """(MindFormers' logits, the stand-ins that ran), or the report of a checkpoint the
    network does not load."""
    from ..read.targets import family_options

    opts = request.options
    with module.cpu_standins() as standins:
        net = module.build_network(config, seq_length=int(ids.shape[1]),
                                   options=family_options(request.family, opts.ms_options))
        loaded = module.load_arrays(net, {i.name: np.asarray(i.load(), dtype=np.float32)
                                          for i in request.ckpt})
        if not loaded.complete:
            return request.not_loaded(list(loaded.missing), list(loaded.unexpected))
        logits = module.forward(net, ids)
        return logits, standins.lines(net)


def _judge_logits(runs: dict[str, dict[str, np.ndarray]], logits: Any, tensors: Any,
                  run: Any) -> Any:
    from .parity import Networks, _compare_outputs, judge
    from .verdict import Drift

    drift = Drift()
    outputs = _compare_outputs([("logits", runs["32"]["logits"])], [("logits", logits)],
                               {"logits": runs["64"]["logits"]} if runs["64"] else {},
                               {"logits": runs["2"]["logits"]}, tol=run.tol, scaled=True,
                               drift=drift, notes=run.notes)
    networks = Networks(params_of=lambda path, torch_side: [], known=lambda c: [])
    result = judge(outputs, [], drift, networks, run, tensor_diff=tensors)
    result.mode, result.mode_reason = "whole", "GRAPH mode with CPU stand-ins"
    return result


__all__ = ["Request", "by_layers", "graph", "graph_whole", "take_declared", "tensors_only",
           "verify", "whole"]

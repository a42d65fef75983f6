"""A Hugging Face Trainer checkpoint's training state (``checkpoint-N/``), read as data.

Beside the weights the Trainer saves ``optimizer.pt`` (torch's optimizer state dict:
``state[i] = {step, exp_avg, exp_avg_sq}`` keyed by position, and ``param_groups``),
``scheduler.pt`` (LambdaLR's position: ``last_epoch``, ``base_lrs``, ``_last_lr``; its
lambdas are saved empty), ``trainer_state.json`` (``global_step``, ``epoch``) and
``training_args.bin`` (a pickled TrainingArguments: never loaded). Both ``.pt`` files are
read no wider than ``torch.load(weights_only=True)``.

``optimizer.pt`` names no weight. Its positions run over the Trainer's two groups, the
weights it decays and then the rest, each in ``model.named_parameters()`` order (a tied
duplicate appears once). That order is the model's: it is computed by building the model
from ``config.json`` on PyTorch's meta device with transformers (nothing allocated, no
remote code), and the decay set as the Trainer computes it (:data:`DECAY_RULES`: the one
whose group sizes the file's groups have). Each position's moments must have its weight's
shape in the weights file, or the folder is refused.

Only AdamW's elementwise state is taken; every other optimizer is refused naming why
(:func:`_refuse_other_optimizers`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SourceError, shown
from .sources import read_torch_tree, tensor_leaf
from .tensors import Source, TensorInfo
from .training_state import Group, Schedule, TrainingState

OPTIMIZER = "optimizer.pt"
SCHEDULER = "scheduler.pt"
TRAINER_STATE = "trainer_state.json"
TRAINING_ARGS = "training_args.bin"
#: torch's GradScaler state, where the run trained in float16 (its loss scale)
SCALER = "scaler.pt"
#: TrainingArguments' fields read from training_args.bin (as data: nothing constructed)
_ARGS = ("lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio",
         "learning_rate", "optim", "max_steps", "per_device_train_batch_size",
         "gradient_accumulation_steps", "max_grad_norm", "save_steps", "logging_steps")
#: the Trainer's AdamW optimizers (``optim``), by their torch class
_ADAMW_OPTIMS = {"adamw_torch": "torch.optim.AdamW", "adamw_torch_fused":
                 "torch.optim.AdamW (fused)", "adamw_hf": "transformers AdamW"}
#: a trainer_state.json is a log: far smaller than this
MAX_STATE_JSON = 64 << 20

#: the Trainer's weight-decay grouping, newest first: (which transformers, the name
#: patterns it exempts). Both also exempt every parameter of an ``nn.LayerNorm``.
#: (``Trainer.get_decay_parameter_names``)
DECAY_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("transformers >= 4.48 (biases and norms not decayed)",
     (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")),
    ("transformers < 4.48 (biases and nn.LayerNorm not decayed)", (r"bias",)),
)

#: a state entry's keys, for AdamW
_ADAMW_KEYS = frozenset({"step", "exp_avg", "exp_avg_sq"})
#: other optimizers' state keys -> what they are (refused: not AdamW's elementwise step)
_OTHER_STATE = {
    "max_exp_avg_sq": "amsgrad (a running maximum of the second moment)",
    "exp_avg_sq_row": "a factored second moment (Adafactor)",
    "exp_avg_sq_col": "a factored second moment (Adafactor)",
    "momentum_buffer": "SGD with momentum",
    "square_avg": "RMSprop",
    "sum": "Adagrad",
    "acc_delta": "Adadelta",
    "exp_inf": "Adamax",
    "mu_product": "NAdam",
    "prev": "Rprop",
}


def holds_training_state(folder: Path) -> bool:
    """Whether ``folder`` is a Trainer checkpoint with an optimizer state."""
    return (folder / OPTIMIZER).is_file()


@dataclass
class _Raw:
    """``optimizer.pt`` as read: positions, not yet names."""

    groups: list[dict[str, Any]]
    positions: list[list[int]]
    state: dict[int, dict[str, Any]]


def read_trainer_state(folder: str | Path, source: Source | None = None) -> TrainingState:
    """The training state of a Trainer ``checkpoint-N/`` folder.

    Args:
        folder: the checkpoint folder (``optimizer.pt`` and the rest in it).
        source: its weights, read: the moments are then named after the weights they
            belong to (and their shapes checked against them). Without it they are named
            by position (``#0``, ``#1``...), which is enough to list them.

    Raises:
        SourceError: a file is missing or unreadable, the optimizer is not AdamW, the
            steps differ, or the positions do not fit the model's parameters.
    """
    folder = Path(folder)
    path = folder / OPTIMIZER
    if not path.is_file():
        raise SourceError(f"{folder}: no {OPTIMIZER} (the Trainer saved no optimizer state: "
                          "save_only_model?); there is no training state to take",
                          path=folder)
    raw = _read_optimizer(path)
    names = (_names(folder, raw, source) if source is not None
             else [[f"#{i}" for i in group] for group in raw.positions])
    moments: dict[str, tuple[TensorInfo, TensorInfo]] = {}
    steps: dict[str, float] = {}
    without: list[str] = []
    for group_names, positions in zip(names, raw.positions):
        for name, index in zip(group_names, positions):
            entry = raw.state.get(index)
            if not entry:  # no gradient ever reached it
                without.append(name)
                continue
            moments[name] = _moments(path, name, index, entry, source)
            steps[name] = _step(path, index, entry["step"])
    step = _one_step(path, steps)
    groups = [_group(g, n) for g, n in zip(raw.groups, names)]
    args = training_args(folder / TRAINING_ARGS)
    optim = str(args.get("optim", "adamw_torch"))
    if optim not in _ADAMW_OPTIMS:
        raise SourceError(f"{folder / TRAINING_ARGS}: the run's optimizer is "
                          f"{shown(optim)}, not one of the Trainer's AdamW ("
                          f"{', '.join(_ADAMW_OPTIMS)}); refused", path=folder)
    state = TrainingState(str(folder), _ADAMW_OPTIMS[optim], step, moments, groups,
                          without_state=without)
    _trainer_counters(folder / TRAINER_STATE, state)
    state.schedule = _schedule(folder / SCHEDULER, step, args)
    kwargs, clip = args.get("lr_scheduler_kwargs"), args.get("max_grad_norm")
    state.schedule_kwargs = dict(kwargs) if isinstance(kwargs, dict) and kwargs else None
    state.max_grad_norm = float(clip) if _number(clip) and clip > 0 else None
    state.intervals = {k: int(args[k]) for k in ("save_steps", "logging_steps")
                       if _number(args.get(k)) and args[k] >= 1}
    _loss_scale(folder / SCALER, state)
    rng = sorted(p.name for p in folder.glob("rng_state*.pth"))
    if rng:
        state.notes.append(f"{', '.join(rng)}: the run's random generators' states, not "
                           "carried (MindSpore's are its own): the data order and dropout "
                           "after resuming follow MindFormers' seed")
    return state


def _loss_scale(path: Path, state: TrainingState) -> None:
    """``scaler.pt`` (a float16 run's GradScaler): its scale, and how it grows and backs
    off, for MindFormers' dynamic loss scale."""
    if not path.is_file():
        return
    tree = read_torch_tree(path)
    scale = tree.get("scale") if isinstance(tree, Mapping) else None
    if not _number(scale) or not 0 < scale < float("inf"):
        raise SourceError(f"{path}: not a torch GradScaler's state (no positive 'scale')",
                          path=path)
    state.loss_scale = float(scale)
    growth, backoff, interval = (tree.get(k) for k in (
        "growth_factor", "backoff_factor", "growth_interval"))
    if _number(growth) and _number(backoff) and type(interval) is int and interval > 0:
        state.loss_scaler = {"growth_factor": float(growth), "backoff_factor": float(backoff),
                             "growth_interval": interval}
        if abs(growth * backoff - 1) > 1e-9:
            state.notes.append(f"{path.name}: the loss scale backs off by {backoff:g} on an "
                               f"overflow; MindSpore's dynamic loss scale divides by its "
                               f"growth factor {growth:g}: after an overflow the two differ")


def training_args(path: Path) -> dict[str, Any]:
    """The fields of ``training_args.bin`` (:data:`_ARGS`) that say the run's optimizer and
    schedule, read as data by the whole-module pass (a TrainingArguments is never made;
    its enumerations' members are their names); ``{}`` where the file is absent."""
    from . import torchzip

    if not path.is_file():
        return {}
    try:
        obj = torchzip.load(path, modules=True)
    except (torchzip.Unsupported, torchzip.Refused, OSError, ValueError) as exc:
        raise SourceError(f"{path}: cannot be read as data ({exc}); move it away to convert "
                          "without the run's schedule", path=path) from None
    state = obj.state if isinstance(obj, torchzip.Instance) else None
    if not isinstance(state, dict):
        raise SourceError(f"{path}: not a TrainingArguments", path=path)
    return {k: (str(v) if isinstance(v, torchzip.NamedValue) else v)
            for k, v in state.items() if k in _ARGS}


def _read_optimizer(path: Path) -> _Raw:
    tree = read_torch_tree(path)
    if not isinstance(tree, Mapping) or not isinstance(tree.get("state"), Mapping) \
            or not isinstance(tree.get("param_groups"), list):
        raise SourceError(f"{path}: not a torch optimizer state dict (no 'state' and "
                          "'param_groups')", path=path)
    groups = tree["param_groups"]
    positions: list[list[int]] = []
    for i, g in enumerate(groups):
        params = g.get("params") if isinstance(g, Mapping) else None
        if not isinstance(params, list) or not all(type(p) is int for p in params):
            raise SourceError(f"{path}: param_groups[{i}] lists no parameter positions",
                              path=path)
        positions.append(params)
    flat = [p for ps in positions for p in ps]
    if len(set(flat)) != len(flat):
        raise SourceError(f"{path}: a parameter position appears in two groups", path=path)
    state = {k: v for k, v in tree["state"].items()}
    stray = [k for k in state if k not in set(flat)]
    if stray:
        raise SourceError(f"{path}: state for position {shown(stray[0])}, which no group "
                          "holds", path=path)
    _refuse_other_optimizers(path, groups, state)
    return _Raw(list(groups), positions, state)


def _refuse_other_optimizers(path: Path, groups: list[Any], state: dict[Any, Any]) -> None:
    """Only AdamW's elementwise update carries over; name what else the file holds."""
    for i, g in enumerate(groups):
        if g.get("amsgrad"):
            raise SourceError(f"{path}: group {i} uses amsgrad (a running maximum of the "
                              "second moment), which MindFormers' AdamW has not; refused",
                              path=path)
        if g.get("maximize"):
            raise SourceError(f"{path}: group {i} maximizes; refused", path=path)
        if g.get("decoupled_weight_decay") is False and g.get("weight_decay"):
            raise SourceError(f"{path}: group {i} is Adam with L2 weight decay (added to "
                              "the gradient), not AdamW's decoupled decay; refused",
                              path=path)
        for key in ("lr", "eps", "weight_decay"):
            if not _number(g.get(key)):
                raise SourceError(f"{path}: group {i} has no number {key!r}; not an "
                                  "AdamW state", path=path)
        betas = g.get("betas")
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2
                and all(_number(b) for b in betas)):
            raise SourceError(f"{path}: group {i} has no (beta1, beta2); not an AdamW "
                              "state", path=path)
    for index, entry in state.items():
        if not isinstance(entry, Mapping):
            raise SourceError(f"{path}: state of position {shown(index)} is no dict",
                              path=path)
        keys = set(map(str, entry))
        other = sorted(keys - _ADAMW_KEYS)
        if other:
            what = next((_OTHER_STATE[k] for k in other if k in _OTHER_STATE),
                        f"state {', '.join(map(shown, other))}")
            raise SourceError(f"{path}: the optimizer keeps {what}, not AdamW's two "
                              "elementwise moments; MindFormers' AdamW cannot continue from "
                              "it — refused", path=path)
        if entry and keys != _ADAMW_KEYS:
            raise SourceError(f"{path}: state of position {index} holds "
                              f"{', '.join(sorted(keys))}, not step, exp_avg and exp_avg_sq",
                              path=path)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _moments(path: Path, name: str, index: int, entry: Mapping[str, Any],
             source: Source | None) -> tuple[TensorInfo, TensorInfo]:
    pair = []
    for key in ("exp_avg", "exp_avg_sq"):
        info = tensor_leaf(f"{key}.{name}", entry[key])
        if info is None or info.dtype not in ("float32", "bfloat16", "float16"):
            raise SourceError(f"{path}: {key} of {shown(name)} (position {index}) is not a "
                              "floating-point tensor", path=path, tensor=name)
        pair.append(info)
    if pair[0].shape != pair[1].shape:
        raise SourceError(f"{path}: the moments of {shown(name)} differ in shape",
                          path=path, tensor=name)
    if source is not None and source.tensors[name].shape != pair[0].shape:
        raise SourceError(
            f"{path}: position {index}'s moments are {list(pair[0].shape)}, the weight it "
            f"falls on, {shown(name)}, is {list(source.tensors[name].shape)}: the "
            "optimizer's parameter order is not the model's (a custom optimizer?)",
            path=path, tensor=name)
    return pair[0], pair[1]


def _step(path: Path, index: int, value: Any) -> float:
    if _number(value):
        return float(value)
    info = tensor_leaf("step", value)
    if info is None or info.numel != 1:
        raise SourceError(f"{path}: position {index}'s step is not a number", path=path)
    return float(info.load().reshape(()).astype("float64"))


def _one_step(path: Path, steps: dict[str, float]) -> int:
    """The one step every weight took: MindFormers keeps one ``global_step``."""
    values = sorted(set(steps.values()))
    if not values:
        raise SourceError(f"{path}: the optimizer holds no state (no step was taken)",
                          path=path)
    if len(values) > 1:
        by = {v: [n for n, s in steps.items() if s == v] for v in values}
        shown_ = "; ".join(f"step {v:g}: {', '.join(map(shown, ns[:3]))}"
                           f"{' …' if len(ns) > 3 else ''}" for v, ns in by.items())
        raise SourceError(f"{path}: the weights took different numbers of steps ({shown_}); "
                          "MindFormers keeps one global_step for all — refused", path=path)
    if values[0] != int(values[0]) or values[0] < 1:
        raise SourceError(f"{path}: step {values[0]} is not a whole count", path=path)
    return int(values[0])


def _group(g: Mapping[str, Any], names: list[str]) -> Group:
    initial = g.get("initial_lr")
    return Group(float(g["lr"]), (float(g["betas"][0]), float(g["betas"][1])),
                 float(g["eps"]), float(g["weight_decay"]), tuple(names),
                 float(initial) if _number(initial) else None)


def _schedule(path: Path, step: int, args: dict[str, Any]) -> Schedule | None:
    if not path.is_file():
        return None
    tree = read_torch_tree(path)
    last, base, lrs = (tree.get(k) if isinstance(tree, Mapping) else None
                       for k in ("last_epoch", "base_lrs", "_last_lr"))
    if type(last) is not int or not isinstance(base, list) or not isinstance(lrs, list) \
            or not all(_number(x) for x in [*base, *lrs]):
        raise SourceError(f"{path}: not a torch LR scheduler's state (last_epoch, base_lrs, "
                          "_last_lr)", path=path)
    if last != step:
        raise SourceError(f"{path}: the schedule stands at step {last}, the optimizer at "
                          f"{step}; the schedule cannot be stated — refused", path=path)
    kind = args.get("lr_scheduler_type")
    total = args.get("max_steps")
    total = total if type(total) is int and total > 0 else None
    return Schedule(last, tuple(map(float, base)), tuple(map(float, lrs)),
                    kind=kind if isinstance(kind, str) else None,
                    warmup_steps=_warmup(args, total), total_steps=total)


def _warmup(args: dict[str, Any], total: int | None) -> int | None:
    """The whole warm-up steps the Trainer took: ``warmup_steps`` (below 1: a ratio, rounded
    up, as transformers 5 does), else ``warmup_ratio`` of the total, rounded up."""
    steps, ratio = args.get("warmup_steps"), args.get("warmup_ratio")
    if _number(steps) and steps >= 1:
        return int(steps)
    share = steps if _number(steps) and steps > 0 else ratio
    if _number(share) and share > 0:
        return math.ceil(total * share) if total is not None else None
    return 0 if _number(steps) else None


def _trainer_counters(path: Path, state: TrainingState) -> None:
    """``trainer_state.json``'s epoch, its global_step checked against the optimizer's."""
    if not path.is_file():
        state.notes.append(f"no {TRAINER_STATE}: the epoch is unknown (the Trainer needs "
                           "it to resume)")
        return
    if path.stat().st_size > MAX_STATE_JSON:
        raise SourceError(f"{path}: {path.stat().st_size} bytes, more than a trainer state "
                          "holds", path=path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise SourceError(f"{path}: not JSON ({exc})", path=path) from None
    if not isinstance(data, dict):
        raise SourceError(f"{path}: not a trainer state", path=path)
    global_step, epoch = data.get("global_step"), data.get("epoch")
    if type(global_step) is int and global_step != state.step:
        raise SourceError(f"{path}: global_step {global_step}, the optimizer's step "
                          f"{state.step}; which to resume from cannot be told — refused",
                          path=path)
    if _number(epoch):
        state.epoch = float(epoch)


def _names(folder: Path, raw: _Raw, source: Source) -> list[list[str]]:
    """Each group's positions named: the model's trainable parameters in order, split as
    the Trainer splits them (:data:`DECAY_RULES`)."""
    if source.config is None:
        raise SourceError(f"{folder}: no config.json beside the weights; the optimizer's "
                          "parameter order is computed from it", path=folder)
    order, decays = parameter_order(source.config, str(folder))
    missing = [n for n in order if n not in source.tensors]
    if missing:
        raise SourceError(f"{folder}: the model built from config.json has "
                          f"{shown(missing[0])}, which the weights file lacks ("
                          f"{len(missing)} such); the config and weights disagree",
                          path=folder)
    sizes = [len(p) for p in raw.positions]
    tried = []
    for label, decayed in decays:
        groups = [[n for n in order if n in decayed], [n for n in order if n not in decayed]]
        groups = [g for g in groups if g] if len(sizes) < 2 else groups
        if [len(g) for g in groups] == sizes:
            return groups
        tried.append(f"{label}: {'+'.join(str(len(g)) for g in groups)}")
    raise SourceError(
        f"{folder / OPTIMIZER}: its groups hold {'+'.join(map(str, sizes))} parameters; the "
        f"Trainer's grouping of this model gives {'; '.join(tried)}. The optimizer was not "
        "the Trainer's default (a custom create_optimizer?): its order cannot be named",
        path=folder)


def parameter_order(config: dict[str, Any], where: str
                    ) -> tuple[list[str], list[tuple[str, set[str]]]]:
    """A Hugging Face model's trainable parameters in ``named_parameters()`` order, and the
    decayed set under each of :data:`DECAY_RULES`, from its ``config.json`` (``config``,
    read from ``where``): computed for the plain decoders :mod:`ms_port.archs.hf_layout`
    describes (their module order is their tensors' order there, and they hold no
    ``nn.LayerNorm``; ``tests/test_training_state.py`` holds both equal to transformers'),
    else built by transformers on the meta device."""
    from ..archs.hf_layout import hf_tensors

    computed = hf_tensors(config) if config.get("model_type") != "chatglm" else None
    if computed is not None:
        order = list(computed[1])
        return order, [(label, {n for n in order if not any(
            re.search(p, n.lower()) for p in patterns)}) for label, patterns in DECAY_RULES]
    return _built_order(config, where)


def _built_order(config: dict[str, Any], where: str
                 ) -> tuple[list[str], list[tuple[str, set[str]]]]:
    """:func:`parameter_order` by transformers' own model, on the meta device."""
    if "auto_map" in config:
        raise SourceError(f"{where}: config.json names remote code (auto_map); ms-port "
                          "runs none, so the parameter order cannot be computed", path=where)
    try:
        import torch
        import transformers
        from transformers.trainer_pt_utils import get_parameter_names
    except ImportError as exc:
        raise SourceError(f"the optimizer's parameter order is computed with transformers, "
                          f"which is not importable ({exc}); pip install transformers",
                          path=where) from None
    try:
        built = transformers.AutoConfig.for_model(**config)
        arch = (config.get("architectures") or [None])[0]
        cls = getattr(transformers, arch, None) if isinstance(arch, str) else None
        with torch.device("meta"):
            model = (cls(built) if cls is not None and hasattr(cls, "config_class")
                     else transformers.AutoModelForCausalLM.from_config(built))
    except Exception as exc:  # transformers' own errors: any config it cannot build
        raise SourceError(f"{where}: transformers cannot build the model of config.json "
                          f"({type(exc).__name__}: {exc}); its parameter order is needed to "
                          "name the optimizer's state", path=where) from None
    order = [n for n, p in model.named_parameters() if p.requires_grad]
    decays = [(label, set(get_parameter_names(model, [torch.nn.LayerNorm], list(patterns))))
              for label, patterns in DECAY_RULES]
    return order, decays


def installed_decay_rule() -> str:
    """The label of :data:`DECAY_RULES` the installed transformers' Trainer groups by (the
    one that will resume an exported folder)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    newest, older = DECAY_RULES
    try:
        installed = Version(version("transformers"))
    except PackageNotFoundError:  # the folder will be resumed elsewhere: today's rule
        return newest[0]
    return (newest if installed >= Version("4.48") else older)[0]

"""A MindFormers run's YAML (``--train-config RUN.yaml``): the optimizer and schedule its
checkpoint does not hold, and MindFormers' training state read from the checkpoint.

A MindFormers checkpoint names its moments ``adam_m.<weight>`` / ``adam_v.<weight>``
whichever optimizer wrote them: MindFormers' ``AdamW`` (bias-corrected, as torch's) and
MindSpore's ``nn.AdamWeightDecay`` (no bias correction: the same moments give another
step) cannot be told apart by the names. The YAML's ``optimizer.type`` says which; only
``AdamW`` is taken. Its ``lr_schedule`` is taken where transformers has a twin that
computes the same rate at every step (:data:`ms_port.read.training_state.SCHEDULES`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import SourceError, shown
from .tensors import TensorInfo
from .training_state import MINDFORMERS_MOMENTS, SCHEDULES, Group, Schedule, TrainingState

#: a run's YAML is a page of settings
MAX_YAML_BYTES = 4 << 20
#: MindFormers' optimizers whose state is not AdamW's, and why (refused)
_NOT_ADAMW = {
    "AdamWeightDecay": "MindSpore's AdamWeightDecay has no bias correction: the same "
                       "moments give another step than torch's AdamW",
    "FusedAdamW": "FusedAdamW counts global_step from -1",
    "FusedAdamWeightDecay": "no bias correction",
    "Came": "a factored second moment (CAME)",
    "Lamb": "trust ratios (LAMB)",
    "LARS": "trust ratios (LARS)",
    "Muon": "not an elementwise update (Muon)",
    "PmaAdamW": "parameter-moving-average AdamW keeps more state",
    "FusedPmaAdamW": "parameter-moving-average AdamW keeps more state",
}


@dataclass(frozen=True)
class RunConfig:
    """What a MindFormers YAML says of the optimizer and the schedule."""

    path: str
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    #: transformers' name of the twin schedule, its base rate, warm-up and total steps
    schedule: str
    learning_rate: float
    warmup_steps: int
    total_steps: int
    max_grad_norm: float | None = None
    #: the run's saving and logging interval (its callbacks' ``save_checkpoint_steps``,
    #: ``per_print_times``): a resumed Trainer takes them from ``trainer_state.json``
    save_steps: int = 500
    logging_steps: int = 500


#: callback type -> (its key, RunConfig's field)
_INTERVALS = {"CheckpointMonitor": ("save_checkpoint_steps", "save_steps"),
              "MFLossMonitor": ("per_print_times", "logging_steps")}


def read_train_config(path: str | Path) -> RunConfig:
    """The optimizer and schedule of a MindFormers run's YAML.

    Raises:
        SourceError: unreadable, not AdamW, or a schedule transformers cannot state.
    """
    path = Path(path)
    doc = _load(path)
    opt = doc.get("optimizer")
    if not isinstance(opt, dict) or not isinstance(opt.get("type"), str):
        raise SourceError(f"{path}: no optimizer.type; the run's optimizer must be named "
                          "(its moments' names do not say it)", path=path)
    if opt["type"] != "AdamW":
        why = _NOT_ADAMW.get(opt["type"], "not MindFormers' AdamW")
        raise SourceError(f"{path}: optimizer {shown(opt['type'])}: {why}; only AdamW's "
                          "state carries over to torch's AdamW — refused", path=path)
    sched = doc.get("lr_schedule")
    if not isinstance(sched, dict) or not isinstance(sched.get("type"), str):
        raise SourceError(f"{path}: no lr_schedule.type; the schedule cannot be stated",
                          path=path)
    twins = {mf: (hf, fixed) for hf, (mf, fixed) in SCHEDULES.items() if hf != "constant"}
    if sched["type"] not in twins:
        raise SourceError(f"{path}: lr_schedule {shown(sched['type'])} has no transformers "
                          f"twin ms-port knows ({', '.join(twins)}); the schedule cannot be "
                          "stated — refused", path=path)
    kind, fixed = twins[sched["type"]]
    for key, value in fixed.items():
        if key in sched and sched[key] != value:
            raise SourceError(f"{path}: lr_schedule.{key} is {shown(sched[key])}; "
                              f"transformers' {kind} schedule has {value} — the schedule "
                              "cannot be stated", path=path)
    total = _int(path, sched, "total_steps")
    ratio = sched.get("warmup_ratio")
    warmup = (int(total * _float(path, sched, "warmup_ratio")) if ratio is not None
              else _int(path, sched, "warmup_steps", default=0))  # MindFormers rounds down
    betas = opt.get("betas", [0.9, 0.999])
    if not (isinstance(betas, list) and len(betas) == 2):
        raise SourceError(f"{path}: optimizer.betas is not two numbers", path=path)
    wrapper = doc.get("runner_wrapper")
    clip = (wrapper.get("max_grad_norm", 1.0) if isinstance(wrapper, dict)
            and wrapper.get("use_clip_grad") else None)
    return RunConfig(str(path), (_num(path, betas[0], "betas"), _num(path, betas[1], "betas")),
                     _float(path, opt, "eps", default=1e-8),
                     _float(path, opt, "weight_decay", default=0.0), kind,
                     _float(path, sched, "learning_rate"), warmup, total,
                     None if clip is None else _num(path, clip, "max_grad_norm"),
                     **_intervals(path, doc.get("callbacks")))


def _intervals(path: Path, callbacks: Any) -> dict[str, int]:
    """``save_steps``/``logging_steps`` from the run's callbacks, where they say them."""
    found: dict[str, int] = {}
    for cb in callbacks if isinstance(callbacks, list) else []:
        if isinstance(cb, dict) and cb.get("type") in _INTERVALS:
            key, field_ = _INTERVALS[cb["type"]]
            if key in cb:
                found[field_] = _int(path, cb, key)
    return found


def _load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise SourceError(f"{path}: no such file (the MindFormers YAML the run trained "
                          "with)", path=path)
    if path.stat().st_size > MAX_YAML_BYTES:
        raise SourceError(f"{path}: larger than a run's YAML ({MAX_YAML_BYTES} bytes)",
                          path=path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SourceError(f"{path}: not YAML ({exc})", path=path) from None
    if not isinstance(doc, dict):
        raise SourceError(f"{path}: not a MindFormers YAML (a mapping)", path=path)
    return doc


def _num(path: Path, value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise SourceError(f"{path}: {key} is {shown(value)}, not a number", path=path)
    return float(value)


def _float(path: Path, section: dict[str, Any], key: str, default: float | None = None
           ) -> float:
    if key not in section and default is not None:
        return default
    return _num(path, section.get(key), key)


def _int(path: Path, section: dict[str, Any], key: str, default: int | None = None) -> int:
    value = section.get(key, default)
    if type(value) is not int or value < 0:
        raise SourceError(f"{path}: {key} is {shown(value)}, not a whole number of steps",
                          path=path)
    return value


def mindformers_state(origin: str, tensors: list[TensorInfo], weights: set[str],
                      run: RunConfig) -> TrainingState:
    """MindFormers' training state as read from a checkpoint (``Source.training_state``),
    with the run's settings: the moments by weight, the step, the schedule's position.

    Raises:
        SourceError: no moments or no ``global_step``, a weight with one moment only, or
            per-weight state that is not AdamW's.
    """
    by_name = {t.name: t for t in tensors}
    other = sorted({t.name.split(".", 1)[0] for t in tensors if "." in t.name}
                   - set(MINDFORMERS_MOMENTS))
    if other:
        raise SourceError(f"{origin}: the checkpoint holds optimizer state {shown(other[0])}."
                          "*, not AdamW's adam_m/adam_v — refused", path=origin)
    first, second = MINDFORMERS_MOMENTS
    moments: dict[str, tuple[TensorInfo, TensorInfo]] = {}
    for t in tensors:
        if t.name.startswith(first + "."):
            weight = t.name[len(first) + 1:]
            pair = by_name.get(f"{second}.{weight}")
            if pair is None:
                raise SourceError(f"{origin}: {shown(t.name)} has no {second} beside it",
                                  path=origin)
            moments[weight] = (t, pair)
    if not moments:
        raise SourceError(f"{origin}: the checkpoint holds no optimizer moments (adam_m.*); "
                          "it was saved without its training state", path=origin)
    step = _counter(origin, by_name, "global_step")
    if step is None or step < 1:
        raise SourceError(f"{origin}: no global_step of at least 1; the step cannot be told",
                          path=origin)
    lr = schedule_lr(run, step)
    group = Group(lr, run.betas, run.eps, run.weight_decay, initial_lr=run.learning_rate)
    state = TrainingState(origin, "MindFormers AdamW", step, moments, [group],
                          schedule=Schedule(step, (run.learning_rate,), (lr,),
                                            kind=run.schedule, warmup_steps=run.warmup_steps,
                                            total_steps=run.total_steps),
                          max_grad_norm=run.max_grad_norm,
                          without_state=sorted(weights - set(moments)))
    state.batch_size = _counter(origin, by_name, "global_batch_size")
    state.intervals = {"save_steps": run.save_steps, "logging_steps": run.logging_steps}
    scale = _counter(origin, by_name, "loss_scale", floating=True)
    if scale is not None and scale != 1.0:
        state.loss_scale = scale
        state.notes.append(f"loss scale {scale:g} not carried (the Trainer keeps none in "
                           "float32 or bfloat16)")
    return state


def _counter(origin: str, by_name: dict[str, TensorInfo], name: str, *,
             floating: bool = False) -> Any:
    info = by_name.get(name)
    if info is None:
        return None
    if info.numel != 1:
        raise SourceError(f"{origin}: {name} holds {info.numel} values, not one", path=origin)
    value = info.load().reshape(-1)[0]
    return float(value) if floating else int(value)


def schedule_lr(run: RunConfig, step: int) -> float:
    """The rate at ``step`` (the one the next update uses): transformers' and MindFormers'
    formulas, which are the same for the schedules taken."""
    warm, total, base = run.warmup_steps, run.total_steps, run.learning_rate
    if step < warm:
        return base * step / max(1, warm)
    if run.schedule == "constant_with_warmup":
        return base
    progress = (step - warm) / max(1, total - warm)
    if run.schedule == "linear":
        return base * max(0.0, (total - step) / max(1, total - warm))
    return base * max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))

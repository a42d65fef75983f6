"""An optimizer's state, from either side, as one description: the moments of each weight,
the step, the hyperparameters of each group, the schedule's position and the counters.

Two kinds of files hold it: a Hugging Face Trainer ``checkpoint-N/`` folder
(:mod:`ms_port.read.trainer`) and a MindFormers training checkpoint, whose ``adam_m.*`` /
``adam_v.*`` moments and counters the reader keeps apart from the weights
(:data:`ms_port.read.distributed.TRAINING_STATE_PREFIXES`). Only AdamW's elementwise
state is described: every other optimizer is refused where it is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..text import size_text
from .tensors import TensorInfo

#: what each side calls the two moments of the weight ``NAME``
TORCH_MOMENTS = ("exp_avg", "exp_avg_sq")
MINDFORMERS_MOMENTS = ("adam_m", "adam_v")

#: transformers' schedules (``lr_scheduler_type``) -> MindFormers' ``lr_schedule.type`` and
#: the settings that make it compute the same rate at every step (their formulas are
#: equal term by term: tests/test_training_state.py holds them at every step)
SCHEDULES: dict[str, tuple[str, dict[str, Any]]] = {
    "cosine": ("CosineWithWarmUpLR", {"num_cycles": 0.5, "lr_end": 0.0,
                                      "warmup_lr_init": 0.0}),
    "linear": ("LinearWithWarmUpLR", {"warmup_lr_init": 0.0}),
    "constant_with_warmup": ("ConstantWarmUpLR", {"warmup_lr_init": 0.0}),
    "constant": ("ConstantWarmUpLR", {"warmup_lr_init": 0.0}),
}


@dataclass(frozen=True)
class Group:
    """One parameter group's hyperparameters (torch's ``param_groups[i]``)."""

    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    #: the weights of the group, by name, in the optimizer's order
    names: tuple[str, ...] = ()
    initial_lr: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"lr": self.lr, "betas": list(self.betas), "eps": self.eps,
                "weight_decay": self.weight_decay, "initial_lr": self.initial_lr,
                "parameters": len(self.names)}


@dataclass(frozen=True)
class Schedule:
    """Where a learning-rate schedule stands (torch's ``scheduler.pt``: the steps taken,
    the base rates and the rates of the next step) and, where the run's arguments say it,
    what it is: ``kind`` (transformers' name: ``cosine``, ``linear``,
    ``constant_with_warmup``, ``constant``), whole warm-up and total steps."""

    last_epoch: int
    base_lrs: tuple[float, ...]
    last_lrs: tuple[float, ...]
    kind: str | None = None
    warmup_steps: int | None = None
    total_steps: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs),
                "last_lrs": list(self.last_lrs), "kind": self.kind,
                "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}

    def describe(self) -> str:
        kind = (f"{self.kind} (warm-up {self.warmup_steps}, total {self.total_steps}), "
                if self.kind else "")
        lrs = ", ".join(f"{x:g}" for x in sorted(set(self.last_lrs)))
        return f"schedule {kind}at step {self.last_epoch} (next lr {lrs})"


@dataclass
class TrainingState:
    """What an optimizer holds between two steps.

    Attributes:
        origin: the files read.
        optimizer: its kind, as the files say it (``torch.optim.AdamW``).
        step: the optimizer steps taken (the next step's bias correction uses ``step + 1``).
        moments: weight name -> (first moment, second moment), in the optimizer's order.
        groups: the parameter groups' hyperparameters (empty where the file holds none:
            MindFormers' are in its YAML).
        schedule: the learning-rate schedule's position, where saved.
        epoch: the epochs run (the Trainer's fraction), where saved.
        loss_scale: the loss scale, where saved.
        without_state: weights the optimizer holds no moments for (never updated).
    """

    origin: str
    optimizer: str
    step: int
    moments: dict[str, tuple[TensorInfo, TensorInfo]]
    groups: list[Group] = field(default_factory=list)
    schedule: Schedule | None = None
    epoch: float | None = None
    loss_scale: float | None = None
    without_state: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the schedule's own arguments beyond its kind (``lr_scheduler_kwargs``), if any
    schedule_kwargs: dict[str, Any] | None = None
    #: the gradient clipping's norm (``max_grad_norm``), where the run clipped
    max_grad_norm: float | None = None
    #: the global batch (samples per optimizer step), where saved
    batch_size: int | None = None
    #: how often the run saved and logged (``save_steps``, ``logging_steps``), where said
    intervals: dict[str, int] = field(default_factory=dict)
    #: a dynamic loss scale's rules (torch GradScaler's ``growth_factor``,
    #: ``backoff_factor``, ``growth_interval``), where the run had one
    loss_scaler: dict[str, Any] | None = None

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes + v.nbytes for m, v in self.moments.values())

    def line(self) -> str:
        """One line for ``inspect``: optimizer, moments, step, schedule, loss scale."""
        dtypes = sorted({t.dtype for pair in self.moments.values() for t in pair})
        parts = [self.optimizer, f"step {self.step}",
                 f"moments of {len(self.moments)} weights ({'/'.join(dtypes) or 'none'}, "
                 f"{size_text(self.nbytes)})"]
        if self.without_state:
            parts.append(f"{len(self.without_state)} weights without state")
        if self.groups:
            parts.append("groups " + "; ".join(
                f"lr {g.lr:g} wd {g.weight_decay:g} ({len(g.names)})" for g in self.groups))
        if self.schedule is not None:
            parts.append(self.schedule.describe())
        if self.epoch is not None:
            parts.append(f"epoch {self.epoch:g}")
        parts.append("no loss scale" if self.loss_scale is None
                     else f"loss scale {self.loss_scale:g}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"origin": self.origin, "optimizer": self.optimizer, "step": self.step,
                "moments": len(self.moments), "nbytes": self.nbytes,
                "groups": [g.to_dict() for g in self.groups],
                "schedule": None if self.schedule is None else self.schedule.to_dict(),
                "epoch": self.epoch, "loss_scale": self.loss_scale,
                "without_state": self.without_state, "notes": self.notes}


#: a counter is a scalar or one element: larger tensors under these names are not read
_COUNTER_ELEMENTS = 8


def mindformers_line(tensors: list[TensorInfo]) -> str:
    """One line for a MindSpore checkpoint's training state, as its reader kept it apart:
    the moments of how many weights, and the counters' values (read: a few bytes each)."""
    moments = {n: sum(t.name.startswith(n + ".") for t in tensors)
               for n in MINDFORMERS_MOMENTS}
    other = [t for t in tensors if "." in t.name and not t.name.startswith(
        tuple(n + "." for n in MINDFORMERS_MOMENTS))]
    parts = [" / ".join(f"{n} of {k} weights" for n, k in moments.items() if k)]
    if other:
        parts.append(f"{len(other)} other per-weight state ({other[0].name.split('.')[0]}…)")
    for t in tensors:
        if "." not in t.name and 0 < t.numel <= _COUNTER_ELEMENTS and t.loader is not None:
            values = t.load().reshape(-1).tolist()
            parts.append(f"{t.name} {values[0] if len(values) == 1 else values}")
    held = size_text(sum(t.nbytes for t in tensors))
    return f"{len(tensors)} tensors, {held}: " + "; ".join(p for p in parts if p)

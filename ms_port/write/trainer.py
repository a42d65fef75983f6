"""The files a Hugging Face Trainer resumes from, made of MindFormers' training state
(``export --training-state --train-config RUN.yaml``).

Beside the exported weights and ``config.json``:

- ``optimizer.pt``: torch AdamW's state dict. Its positions run as the Trainer's
  ``create_optimizer`` builds them (the decayed weights, then the rest, each in
  ``named_parameters()`` order, computed from ``config.json`` on the meta device:
  :func:`ms_port.read.trainer.parameter_order`), each holding ``step``, ``exp_avg`` and
  ``exp_avg_sq``: each moment made by its weight's own export match (the fused q/k/v split
  as the weight is). ``param_groups`` carry the run's betas, ε and decay, and the rate of
  the next step: torch's ``load_state_dict`` takes them over the Trainer's own, so they
  must be the run's.
- ``scheduler.pt``: LambdaLR's position (``last_epoch`` = the step, ``base_lrs``, the next
  rate); the Trainer makes the schedule's function from its own arguments, which must name
  the same schedule (the report says which).
- ``trainer_state.json``: ``global_step`` and ``max_steps``; the Trainer raises without it.

``optimizer.pt`` is written a tensor at a time (:mod:`ms_port.write.torch_stream`): memory
is one moment, not the state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MappingError, shown
from ..match.result import Plan
from ..match.training import with_training_state
from ..read.trainer import installed_decay_rule, parameter_order
from ..read.training_state import TORCH_MOMENTS, TrainingState
from .directory import Extra
from .torch_stream import Later, save_path
from .writers import atomic_output


def trainer_files(plan: Plan, state: TrainingState, config: dict[str, Any], where: str
                  ) -> tuple[dict[str, Extra], list[str]]:
    """The Trainer's files for ``plan`` (an export's, to a model directory) and the notes
    on what they hold.

    Raises:
        MappingError: a weight the Trainer updates has no moments in the checkpoint.
    """
    order, decays = parameter_order(config, where)
    rule = installed_decay_rule()
    decayed = dict(decays)[rule]
    moments = _moments(plan, state)
    lacking = [n for n in order if n not in moments]
    if lacking:
        raise MappingError(f"the checkpoint holds no moments for {shown(lacking[0])} ("
                           f"{len(lacking)} weights the Trainer updates); its training state "
                           "cannot be made whole")
    groups = [[n for n in order if n in decayed], [n for n in order if n not in decayed]]
    shapes = {m.target: tuple(m.shape) for m in plan.matches}
    files = {"optimizer.pt": lambda p: _save(p, _optimizer(groups, moments, shapes, state)),
             "scheduler.pt": lambda p: _save(p, _scheduler(state)),
             "trainer_state.json": lambda p: _text(p, _trainer_state(state))}
    s = state.schedule
    notes = [f"training state at step {state.step}: optimizer.pt ({len(groups[0])} decayed "
             f"+ {len(groups[1])} weights, grouped as {rule}), scheduler.pt, "
             "trainer_state.json",
             f"resume with TrainingArguments(learning_rate={s.base_lrs[0]!r}, "
             f"lr_scheduler_type={s.kind!r}, warmup_steps={s.warmup_steps}, "
             f"max_steps={s.total_steps}, weight_decay={state.groups[0].weight_decay!r}, "
             f"adam_beta1={state.groups[0].betas[0]!r}, "
             f"adam_beta2={state.groups[0].betas[1]!r}, "
             f"adam_epsilon={state.groups[0].eps!r}"
             + (f", max_grad_norm={state.max_grad_norm!r}" if state.max_grad_norm else "")
             + ")",
             "trainer_state.json holds the run's "
             + ", ".join(f"{k} {v}" for k, v in state.intervals.items())
             + " (from its callbacks; the Trainer takes them over its own arguments)"]
    return files, notes + state.notes


def _moments(plan: Plan, state: TrainingState) -> dict[str, tuple[Any, Any]]:
    """PyTorch's weight name -> its two moments, made by the export plan's own matches."""
    made = with_training_state(plan, state, into="torch")
    first, second = TORCH_MOMENTS
    arrays = {m.target: m for m in made.matches if m.how == "state"}
    out = {}
    for name in {m.target for m in plan.matches}:
        a, b = arrays.get(f"{first}.{name}"), arrays.get(f"{second}.{name}")
        if a is not None and b is not None:
            out[name] = (lambda m=a: made.expected(m), lambda m=b: made.expected(m))
    return out


def _optimizer(groups: list[list[str]], moments: dict[str, tuple[Any, Any]],
               shapes: dict[str, tuple[int, ...]], state: TrainingState) -> dict[str, Any]:
    """torch AdamW's state dict, each tensor made when written (:mod:`.torch_stream`)."""
    group = state.groups[0]
    step = np.array(float(state.step), dtype=np.float32)
    lr = state.schedule.last_lrs[0]
    entries: dict[int, dict[str, Any]] = {}
    positions: list[list[int]] = []
    for names in groups:
        positions.append(list(range(len(entries), len(entries) + len(names))))
        for name in names:
            shape, (m, v) = shapes[name], moments[name]
            entries[len(entries)] = {"step": Later("float32", (), lambda: step),
                                     "exp_avg": Later("float32", shape, m),
                                     "exp_avg_sq": Later("float32", shape, v)}
    base = {"lr": lr, "betas": group.betas, "eps": group.eps, "amsgrad": False,
            "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
            "fused": None, "decoupled_weight_decay": True, "initial_lr": group.initial_lr}
    return {"state": entries,
            "param_groups": [{"weight_decay": group.weight_decay, **base,
                              "params": positions[0]},
                             {"weight_decay": 0.0, **base, "params": positions[1]}]}


def _scheduler(state: TrainingState) -> dict[str, Any]:
    s = state.schedule
    return {"base_lrs": [s.base_lrs[0]] * 2, "last_epoch": state.step,
            "_step_count": state.step + 1, "_is_initial": False,
            "_get_lr_called_within_step": False, "_last_lr": [s.last_lrs[0]] * 2,
            "lr_lambdas": [None, None]}


def _trainer_state(state: TrainingState) -> str:
    # the Trainer compares train_batch_size with its own and warns where they differ
    return json.dumps({"global_step": state.step, "max_steps": state.schedule.total_steps,
                       "train_batch_size": state.batch_size or 1, "log_history": [],
                       **state.intervals,
                       "stateful_callbacks": {"TrainerControl": {"args": {
                           "should_training_stop": False, "should_epoch_stop": False,
                           "should_save": True, "should_evaluate": False,
                           "should_log": False}, "attributes": {}}}},
                      indent=2) + "\n"


def _save(path: Path, obj: Any) -> None:
    """``obj`` as torch.save writes it, a tensor at a time, read back as the Trainer reads
    it (:func:`~.torch_stream.save_path`)."""
    with atomic_output(path) as (_final, tmp):
        save_path(obj, tmp)


def _text(path: Path, text: str) -> None:
    from .writers import write_text

    write_text(path, text)


__all__ = ["trainer_files"]

"""The training sections of MindFormers' YAML for a converted training state
(``convert --training-state --model-config``): what MindFormers must be told for its next
step to be the one the Trainer would take.

A MindFormers checkpoint holds no learning rate, betas, ε, weight decay or schedule: they
are the YAML's ``optimizer`` and ``lr_schedule``, and the gradient clipping is its
``runner_wrapper``'s. They are computed from the Trainer's files (``optimizer.pt``'s groups,
``training_args.bin`` read as data, ``trainer_state.json``'s total steps), with the warm-up
and the total as whole steps (transformers rounds a warm-up ratio up, MindFormers down:
whole steps leave nothing to round). A schedule MindFormers has no twin for is refused.
"""

from __future__ import annotations

from typing import Any

import yaml

from ..errors import WriteError
from ..read.training_state import SCHEDULES, TrainingState
from ..text import visible


def training_sections(state: TrainingState) -> dict[str, Any]:
    """``optimizer``, ``lr_schedule``, ``runner_wrapper`` (when the run clipped) and
    ``resume_training``, as MindFormers' YAML holds them.

    Raises:
        WriteError: the groups' betas or ε differ, or the schedule cannot be stated (its
            kind unknown or without a MindFormers twin, its warm-up or total unknown).
    """
    sched = state.schedule
    where = visible(state.origin)
    if sched is None or sched.kind is None:
        raise WriteError(f"{where}: the learning-rate schedule is not known (no scheduler.pt "
                         "or training_args.bin); it cannot be stated in the YAML — drop "
                         "--model-config, or --training-state")
    if sched.kind not in SCHEDULES or state.schedule_kwargs:
        raise WriteError(f"{where}: the schedule {sched.kind!r}"
                         f"{' with ' + str(state.schedule_kwargs) if state.schedule_kwargs else ''}"
                         f" has no MindFormers twin ms-port knows ({', '.join(SCHEDULES)}); "
                         "it cannot be stated — write lr_schedule yourself")
    if sched.total_steps is None or sched.warmup_steps is None:
        raise WriteError(f"{where}: the schedule's total or warm-up steps are not known; "
                         "the schedule cannot be stated")
    if len({g.betas for g in state.groups}) != 1 or len({g.eps for g in state.groups}) != 1:
        raise WriteError(f"{where}: the parameter groups have different betas or eps, which "
                         "MindFormers' one optimizer section cannot hold")
    if len(set(sched.base_lrs)) != 1:
        raise WriteError(f"{where}: the groups' base learning rates differ "
                         f"({', '.join(map(str, sched.base_lrs))}); one lr_schedule cannot "
                         "hold them")
    decays = sorted({g.weight_decay for g in state.groups} - {0.0})
    if len(decays) > 1:
        raise WriteError(f"{where}: the groups decay by {decays}; MindFormers' optimizer "
                         "takes one weight_decay")
    mf_type, fixed = SCHEDULES[sched.kind]
    group = state.groups[0]
    sections: dict[str, Any] = {
        "resume_training": True,
        "optimizer": {"type": "AdamW", "betas": list(group.betas), "eps": group.eps,
                      "weight_decay": decays[0] if decays else 0.0},
        "lr_schedule": {"type": mf_type, "learning_rate": sched.base_lrs[0],
                        "warmup_steps": 0 if sched.kind == "constant" else sched.warmup_steps,
                        "total_steps": sched.total_steps, **fixed},
    }
    if state.max_grad_norm:
        sections["runner_wrapper"] = {"type": "MFTrainOneStepCell", "use_clip_grad": True,
                                      "max_grad_norm": state.max_grad_norm}
    if state.loss_scale is not None:  # a float16 run's GradScaler, as MindSpore's dynamic one
        rules = state.loss_scaler or {"growth_factor": 2.0, "growth_interval": 2000}
        sections.setdefault("runner_wrapper", {"type": "MFTrainOneStepCell"})["scale_sense"] = {
            "type": "DynamicLossScaleUpdateCell", "loss_scale_value": state.loss_scale,
            "scale_factor": rules["growth_factor"], "scale_window": rules["growth_interval"]}
    callbacks = [{"type": kind, key: state.intervals[field]}
                 for kind, key, field in _CALLBACKS if field in state.intervals]
    if callbacks:
        sections["callbacks"] = callbacks
    return sections


#: the run's intervals as MindFormers' callbacks: (type, its key, TrainingState.intervals')
_CALLBACKS = (("MFLossMonitor", "per_print_times", "logging_steps"),
              ("CheckpointMonitor", "save_checkpoint_steps", "save_steps"))


def training_lines(state: TrainingState) -> list[str]:
    """:func:`training_sections` as YAML lines, with a comment saying where they came from;
    checked to load back equal."""
    sections = training_sections(state)
    body: list[str] = []
    for key, value in sections.items():
        if isinstance(value, dict):
            body.append(f"{key}:")
            body += ["  " + line for k, v in value.items() for line in _dumped(k, v)]
        elif key == "callbacks":
            body.append(f"{key}:")
            for item in value:
                lines = [line for k, v in item.items() for line in _dumped(k, v)]
                body += ["  - " + lines[0], *("    " + line for line in lines[1:])]
        else:
            body += _dumped(key, value)
    if yaml.safe_load("\n".join(body)) != sections:  # pragma: no cover - safe_dump's own
        raise WriteError("the training sections do not load back; this is a bug in ms-port")
    head = ["", f"# the training state's settings, from {visible(state.origin)} "
                f"(step {state.step}): the resumed step is the Trainer's next one only with "
                "these", "# (the global batch, epochs and sink mode are yours: runner_config)"]
    return head + body


def _dumped(key: str, value: Any) -> list[str]:
    """``key: value`` by safe_dump (a list inline)."""
    return yaml.safe_dump({key: value}, sort_keys=False, width=4096,
                          default_flow_style=None if isinstance(value, list) else False
                          ).rstrip("\n").split("\n")


def with_training(built: Any, state: TrainingState) -> Any:
    """A model YAML (:class:`~ms_port.write.model_config.MindFormersYaml`) made a training
    one: ``run_mode: train`` and the training sections appended."""
    from dataclasses import replace

    lines = built.text.rstrip("\n").split("\n")
    mode = next((i for i, line in enumerate(lines) if line.startswith("run_mode:")), None)
    if mode is None:  # pragma: no cover - every family's document has it
        raise WriteError("the model YAML has no run_mode; this is a bug in ms-port")
    lines[mode] = "run_mode: train  # resumes the converted training state"
    return replace(built, text="\n".join(lines + training_lines(state)) + "\n",
                   notes=[*built.notes, "run_mode train, resume_training, optimizer and "
                          f"lr_schedule from the training state (step {state.step})"])

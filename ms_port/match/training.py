"""A weights plan extended with the training state MindFormers resumes from.

AdamW updates every element on its own, so a weight's moments are rearranged exactly as
the weight is: each moment is made by its weight's own match (the rename, the fusion of
q/k/v or gate/up, the expert stacking, the transposes and rotary row orders), applied to
the moment's data instead of the weight's. No second table: :func:`with_training_state`
copies each match with the moment as its source and ``adam_m.`` / ``adam_v.`` before its
target (MindFormers' AdamW names its states ``adam_m.<parameter>``, float32 whatever the
weight's dtype). Every transform ms-port has is a rearrangement of elements
(:mod:`ms_port.match.transforms`), which is what makes this exact.

Beside them, the counters MindFormers' resume reads (``load_resume_context_from_checkpoint``
and the optimizer's own ``global_step``): ``global_step`` (int32 [1]: the steps taken; its
AdamW reads the learning rate at it and corrects the bias with it + 1, as torch does),
``step_num`` (int64) and ``epoch_num`` (int64: the epoch being run, MindFormers' count from
1, so a Trainer's 0.4 epochs is epoch 1); and, where the run trained in float16 with a loss
scale, ``loss_scale`` (float32: MindFormers' resume sets its ``scale_sense`` to it).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..errors import MappingError, shown
from ..read.tensors import TensorInfo
from ..read.training_state import MINDFORMERS_MOMENTS, TORCH_MOMENTS, TrainingState
from .entries import Match
from .result import Plan

#: the counters written beside the moments: name -> (shape, dtype)
COUNTERS = {"global_step": ((1,), "int32"), "step_num": ((), "int64"),
            "epoch_num": ((), "int64")}


def with_training_state(plan: Plan, state: TrainingState, *,
                        into: str = "mindformers") -> Plan:
    """``plan`` with each weight's two moments and the counters added after the weights.

    ``into``: ``mindformers`` (a convert's plan: targets ``adam_m.``/``adam_v.`` + the
    weight's, and the counters) or ``torch`` (an export's: targets ``exp_avg.``/
    ``exp_avg_sq.`` + the weight's, no counters: :mod:`ms_port.write.trainer` puts them in
    the Trainer's files).

    A target whose weights have no moments (never updated, or a buffer) gets none:
    MindFormers starts such a state at zero, as torch would have. A fused target some of
    whose parts have moments and some not is refused.

    Raises:
        MappingError: a source name clashes with a moment's, or a fused target's parts
            are partly without state.
    """
    moments = {info.name: info for pair in state.moments.values() for info in pair}
    clash = next((n for n in moments if n in plan.source.tensors), None)
    if clash is not None:
        raise MappingError(f"the checkpoint holds a tensor named {shown(clash)}, the name "
                           "a moment is read under; rename it")
    added: list[Match] = []
    prefixes = MINDFORMERS_MOMENTS if into == "mindformers" else TORCH_MOMENTS
    for k, prefix in enumerate(prefixes):
        for m in plan.matches:
            made = _moment_match(m, state, k, prefix)
            if made is not None:
                added.append(made)
    counters = _counters(state) if into == "mindformers" else []
    tensors = {**plan.source.tensors, **moments, **{i.name: i for i in counters}}
    added += [Match(i.name, i.name, "state", "training state", i.shape, i.shape, i.dtype,
                    i.dtype) for i in counters]
    taken = {m.target for m in plan.matches}
    clash = next((m.target for m in added if m.target in taken), None)
    if clash is not None:
        raise MappingError(f"the target already holds {shown(clash)}, which the training "
                           "state writes; convert the weights alone")
    return replace(plan, source=replace(plan.source, tensors=tensors),
                   matches=plan.matches + added,
                   notes=plan.notes + _notes(plan, state), training_state=state)


def _moment_match(m: Match, state: TrainingState, k: int, prefix: str) -> Match | None:
    """``m`` made from the ``k``-th moment of its sources, or None where they have none."""
    if m.init is not None or not m.sources:
        return None
    held = [s in state.moments for s in m.sources]
    if not any(held):
        return None
    if not all(held):
        lacking = [s for s, h in zip(m.sources, held) if not h]
        raise MappingError(f"{shown(m.target)} is made of {len(m.sources)} weights and "
                           f"{shown(lacking[0])} has no optimizer state; its moments cannot "
                           "be made whole — convert the weights alone")
    def name(s: str) -> str:
        return state.moments[s][k].name

    dtypes = {state.moments[s][k].dtype for s in m.sources}
    if len(dtypes) > 1:
        raise MappingError(f"the moments {shown(m.target)} is made of differ in dtype "
                           f"({', '.join(sorted(dtypes))})")
    return replace(m, target=f"{prefix}.{m.target}", source=name(m.source),
                   parts=tuple(name(p) for p in m.parts), how="state",
                   detail=f"{prefix} of {m.target}", dtype=dtypes.pop(), out_dtype="float32")


def _counters(state: TrainingState) -> list[TensorInfo]:
    epoch = 0 if state.epoch is None else math.ceil(state.epoch)
    values = {"global_step": state.step, "step_num": state.step, "epoch_num": epoch}
    kinds = dict(COUNTERS)
    if state.loss_scale is not None:
        values["loss_scale"], kinds["loss_scale"] = state.loss_scale, ((), "float32")
    out = []
    for name, (shape, dtype) in kinds.items():
        array = np.full(shape, values[name], dtype=dtype)
        out.append(TensorInfo(name, shape, dtype, lambda a=array: a.copy()))
    return out


def _notes(plan: Plan, state: TrainingState) -> list[str]:
    made = {s for m in plan.matches for s in m.sources}
    unused = [n for n in state.moments if n not in made]
    notes = [f"training state from {state.origin}: the moments of "
             f"{len(state.moments) - len(unused)} weights made as their weights are; "
             f"global_step and step_num {state.step}"]
    if unused:
        notes.append(f"{len(unused)} weights' moments go nowhere (their weights are not "
                     f"converted), e.g. {shown(unused[0])}")
    if state.without_state:
        notes.append(f"{len(state.without_state)} weights had no optimizer state (never "
                     "updated); MindFormers starts theirs at zero")
    return notes + state.notes

"""Is a converted training state right? One AdamW step on each side, from each side's
state, with the same gradient; the next weights compared (``verify --training-state``).

The PyTorch side is torch's own ``AdamW``, loaded with torch's own ``load_state_dict`` from
the Trainer folder's ``optimizer.pt`` (read by ``torch.load(weights_only=True)``, as the
Trainer reads it). The MindSpore side is MindFormers' own ``AdamW``, its weights, moments
and ``global_step`` read by ``mindspore.load_checkpoint``. The gradient is seeded: for each
weight, normal noise scaled by its second moment (a gradient of the size this run's
gradients had), made MindSpore's by the conversion's own plan, as the weights and the
moments were. Both sides take the rate torch's groups hold for the next step.

The verdict is per weight, against float32 rounding, computed for this step: each side
rounds the decay, the moments and the step in its own order (:data:`ULPS` units in the last
place of each weight), and MindFormers holds β₁, β₂ in float32, so its bias corrections
``1 − β^t`` differ from torch's (double) by a share of the update that
:func:`bias_share` computes (6e-6 of it at β₂ = 0.999 and t = 5). A weight's next values may
differ by at most that share of its update plus :data:`ULPS` ulps, in norm. A state one step
off, a moment of another weight, or another optimizer differs by far more, and is named.

A separate check, not a mode of the networks' comparison: it needs no input and no
forward, only the two optimizers, and the networks' own gradients are what ``verify``
proves equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..display import Renderable
from ..errors import MsPortError, shown

#: each element of the next weights may differ by this many units in its last place
ULPS = 4
#: beyond the bias corrections' float32 share, other roundings of the update (the rate
#: and ε in float32, the order of operations)
UPDATE_SLACK = 1e-6


def bias_share(betas: tuple[float, float], t: int) -> float:
    """The share of an update by which β in float32 moves AdamW's bias corrections at step
    ``t``: the first moment's correction divides the update, the second's its square."""
    def rel(beta: float) -> float:
        exact = 1.0 - beta ** t
        return abs(float(np.float32(beta)) ** t - beta ** t) / exact if exact else 0.0
    return rel(betas[0]) + 0.5 * rel(betas[1]) + UPDATE_SLACK


@dataclass(frozen=True)
class StepRow:
    """One weight's next values on both sides."""

    name: str
    #: ||ms − torch|| / ||torch's update||
    relative: float
    #: ||ms − torch|| / its bound (bias share × ||update|| + ULPS × ||ulp(weight)||)
    of_bound: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "relative": self.relative, "of_bound": self.of_bound}


@dataclass(repr=False)
class StepReport(Renderable):
    """The verdict of :func:`prove_step`."""

    source: str
    checkpoint: str
    step: int
    lr: float
    rows: list[StepRow]
    #: the bias corrections' share of an update at this step (:func:`bias_share`)
    share: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def worst(self) -> StepRow:
        return max(self.rows, key=lambda r: r.of_bound)

    @property
    def ok(self) -> bool:
        return all(r.of_bound <= 1.0 for r in self.rows)

    @property
    def verdict(self) -> str:
        return "PASS" if self.ok else "FAIL"

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    @property
    def message(self) -> str:
        w = self.worst
        bound = f"{self.share:.1e} of the update + {ULPS} ulps"
        if self.ok:
            return (f"PASS: one AdamW step from each side's state (step {self.step} → "
                    f"{self.step + 1}, lr {self.lr:g}) gives the same next weights: "
                    f"{len(self.rows)} weights within float32 rounding ({bound}; worst "
                    f"{w.name}: {w.relative:.1e} of its update, {w.of_bound:.2f} of its "
                    "bound)")
        bad = [r for r in self.rows if r.of_bound > 1.0]
        return (f"FAIL: one AdamW step from each side's state parts at {len(bad)} of "
                f"{len(self.rows)} weights; worst {w.name}: {w.relative:.1e} of its update, "
                f"{w.of_bound:.3g}× its bound ({bound}) — its moments, or the step, are "
                "not the PyTorch side's")

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "message": self.message, "source": self.source,
                "checkpoint": self.checkpoint, "step": self.step, "lr": self.lr,
                "bound": {"share_of_update": self.share, "ulps": ULPS},
                "rows": [r.to_dict() for r in self.rows],
                "notes": self.notes}


def prove_step(source: str | Path, checkpoint: str | Path, *, ms_model: Any,
               ms_options: dict[str, Any] | None = None, seed: int = 0) -> StepReport:
    """One step of torch's AdamW from a Trainer folder and one of MindFormers' AdamW from
    a MindSpore checkpoint converted from it (or the other way), compared.

    Raises:
        MsPortError: MindFormers or torch missing, or either side without a state.
    """
    from ..match.training import with_training_state
    from ..resolve import plan_for, read_with_config
    from .trainer_step import torch_step

    try:
        import mindspore as ms
        from mindformers.core.optim.adamw import AdamW
    except ImportError as exc:
        raise MsPortError(f"verify --training-state runs MindFormers' own AdamW, which is "
                          f"not importable ({exc}); install the llm extra") from None
    from ..read.trainer import read_trainer_state

    src = read_with_config(source, key=None, unsafe_pickle=False, config=None, revision=None)
    plan = plan_for(src, arch=None, target=None, ms_model=ms_model, mapping=None,
                    ms_options=ms_options, allow_missing=False, allow_unused=False,
                    allow_shape_match=False, dtype=None, align=True)
    if not plan.ok:
        raise MsPortError(f"{source} does not convert to {ms_model}: "
                          f"{(plan.problems() or ['incomplete plan'])[0]}")
    folder = Path(plan.source.path).parent
    state = read_trainer_state(folder, plan.source)
    plan = with_training_state(plan, state)
    rng = np.random.default_rng(seed)
    grads = {name: (rng.standard_normal(v.shape) * np.sqrt(
        v.load().astype(np.float64) / (1 - state.groups[0].betas[1] ** state.step)) + 1e-30
                    ).astype(np.float32) for name, (_, v) in state.moments.items()}
    torch_next = torch_step(folder, plan.source, state, grads)
    weights = [m for m in plan.matches if m.how != "state" and m.sources
               and all(s in grads for s in m.sources)]
    saved = ms.load_checkpoint(str(checkpoint))
    lacking = [n for m in weights for n in (m.target, f"adam_m.{m.target}",
                                            f"adam_v.{m.target}") if n not in saved]
    if lacking or "global_step" not in saved:
        raise MsPortError(f"{checkpoint}: no {shown((lacking or ['global_step'])[0])}; it "
                          "holds no training state for this model (convert with "
                          "--training-state)", path=checkpoint)
    ms_next, lr = _mindformers_step(saved, weights, plan, state, grads, AdamW)
    torch_plan = _with_tensors(plan, torch_next)
    before = {m.target: saved[m.target].asnumpy() for m in weights}
    share = bias_share(state.groups[0].betas, state.step + 1)
    rows = [_row(m.target, ms_next[m.target], torch_plan.expected(m), before[m.target], share)
            for m in weights]
    return StepReport(str(source), str(checkpoint), state.step, lr, rows, share,
                      notes=[f"gradient: seeded (seed {seed}), each weight's scaled by its "
                             "second moment, made MindSpore's by the conversion's plan"])


def _with_tensors(plan: Any, arrays: dict[str, np.ndarray]) -> Any:
    """``plan`` reading ``arrays`` (PyTorch's names) in place of its source's tensors."""
    from ..read.tensors import TensorInfo

    infos = {n: TensorInfo(n, a.shape, "float32", lambda a=a: a) for n, a in arrays.items()}
    return replace(plan, source=replace(plan.source, tensors={**plan.source.tensors,
                                                              **infos}))


def _mindformers_step(saved: dict[str, Any], weights: list[Any], plan: Any, state: Any,
                      grads: dict[str, np.ndarray], adamw: Any) -> tuple[dict, float]:
    import mindspore as ms

    ms_grads = _with_tensors(plan, grads)
    params = {m.target: ms.Parameter(saved[m.target], name=m.target) for m in weights}
    decayed = {m.target for m in weights if m.source in state.groups[0].names}
    group = state.groups[0]
    decays = {g.weight_decay for g in state.groups} - {0.0}
    lr = group.lr
    opt = adamw([{"params": [p for n, p in params.items() if n in decayed],
                  "weight_decay": max(decays, default=0.0)},
                 {"params": [p for n, p in params.items() if n not in decayed],
                  "weight_decay": 0.0},
                 {"order_params": list(params.values())}],
                learning_rate=lr, betas=group.betas, eps=group.eps)
    for moment in (*opt.exp_avg, *opt.exp_avg_sq):
        moment.set_data(saved[moment.name])
    opt.global_step.set_data(saved["global_step"])
    by_target = {m.target: m for m in weights}
    opt(tuple(ms.Tensor(ms_grads.expected(by_target[p.name])) for p in opt._parameters))
    return {n: p.asnumpy() for n, p in params.items()}, lr


def _row(name: str, got: np.ndarray, want: np.ndarray, before: np.ndarray,
         share: float) -> StepRow:
    got, want = got.astype(np.float64), want.astype(np.float64)
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    update = float(np.linalg.norm(want - before.astype(np.float64)))
    gap = float(np.linalg.norm(got - want))
    bound = share * update + ULPS * float(np.linalg.norm(ulp))
    return StepRow(name, gap / max(update, 1e-30), gap / max(bound, 1e-30))

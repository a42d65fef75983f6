"""transformers 5's in-memory layout of a mixture of experts, against its files'.

transformers 5 holds a MoE's experts stacked in memory (``experts.gate_up_proj
[E, 2F, H]``, ``experts.down_proj [E, H, F]``) while the files it saves, and the Hub's,
keep one tensor per expert (``experts.{e}.gate_proj.weight``). This module knows the
correspondence and nothing else (no imports of ms-port's own).
"""

from __future__ import annotations

from typing import Any

#: transformers 5 holds a mixture of experts fused in memory, while its files (and the
#: Hub's) keep one tensor per expert: in-memory suffix -> the per-expert suffixes stacked
#: into it, each expert's parts joined on their first axis ({e}: the expert's number)
STACKED_IN_MEMORY = {
    "mlp.experts.gate_up_proj": ("mlp.experts.{e}.gate_proj.weight",
                                 "mlp.experts.{e}.up_proj.weight"),   # [E, 2F, H]
    "mlp.experts.down_proj": ("mlp.experts.{e}.down_proj.weight",),   # [E, H, F]
}


def stack_experts(state: dict[str, Any], wanted: dict[str, Any]) -> None:
    """Fill a network's in-memory stacked expert tensors from per-expert ones, in place
    (:data:`STACKED_IN_MEMORY`); what does not fit exactly is left for the caller to name."""
    import torch

    for name, param in wanted.items():
        if name in state:
            continue
        for suffix, parts in STACKED_IN_MEMORY.items():
            if not name.endswith("." + suffix):
                continue
            prefix = name[: -len(suffix)]
            experts = []
            for e in range(int(param.shape[0])):
                keys = [prefix + p.format(e=e) for p in parts]
                if not all(k in state for k in keys):
                    break
                experts.append(torch.cat([state[k] for k in keys]))
            else:
                stacked = torch.stack(experts)
                if tuple(stacked.shape) == tuple(param.shape):
                    state[name] = stacked
                    for e in range(len(experts)):
                        for p in parts:
                            state.pop(prefix + p.format(e=e))


__all__ = ["STACKED_IN_MEMORY", "stack_experts"]

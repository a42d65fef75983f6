"""transformers 5's in-memory layout of a mixture of experts, against its files'.

transformers 5 holds a MoE's experts stacked in memory (``experts.gate_up_proj
[E, 2F, H]``, ``experts.down_proj [E, H, F]``) while the files it saves, and the Hub's,
keep one tensor per expert (``experts.{e}.gate_proj.weight``). This module knows the
correspondence and nothing else (no imports of ms-port's own).
"""

from __future__ import annotations

from dataclasses import dataclass
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
    (:data:`STACKED_IN_MEMORY`); what does not fit exactly is left for the caller to name.

    Each expert is copied into one preallocated stack and its per-expert tensors are taken
    out of ``state`` as it goes: where ``state`` holds the only references, memory grows by
    one expert, not by a second and third copy of every expert (at Qwen3-30B-A3B's widths
    a float64 layer's experts are 4.8 GiB)."""
    import torch

    for name, param in wanted.items():
        if name in state:
            continue
        for suffix, parts in STACKED_IN_MEMORY.items():
            if not name.endswith("." + suffix):
                continue
            prefix = name[: -len(suffix)]
            count = int(param.shape[0])
            keys = [[prefix + p.format(e=e) for p in parts] for e in range(count)]
            if not all(k in state for ks in keys for k in ks):
                continue
            first = [state[k] for k in keys[0]]
            rows = [t.shape[0] for t in first]
            shape = (count, sum(rows), *first[0].shape[1:])
            if (tuple(shape) != tuple(param.shape) or len({t.dtype for t in first}) != 1
                    or any(state[k].shape != t.shape for ks in keys for k, t in zip(ks, first))):
                continue
            stacked = torch.empty(shape, dtype=first[0].dtype)
            del first
            for e, ks in enumerate(keys):
                start = 0
                for k, n in zip(ks, rows):
                    stacked[e, start:start + n] = state.pop(k)
                    start += n
            state[name] = stacked


def expert_parts(layer: str, suffix: str, names: set[str], count: int
                 ) -> tuple[str, ...] | None:
    """The file's tensors holding in-memory ``{layer}.{suffix}`` ([E, ...]; ``layer``:
    ``model.layers.3``, ``suffix``: ``mlp.experts.gate_up_proj``), each expert's on its
    own: the one stacked tensor (its rows are the experts), or the per-expert ones of
    :data:`STACKED_IN_MEMORY` (``{e}`` filled in, expert by expert); None where the file
    holds neither whole."""
    stacked = f"{layer}.{suffix}"
    if stacked in names:
        return (stacked,)
    parts = STACKED_IN_MEMORY.get(suffix)
    if parts is None:
        return None
    found = tuple(f"{layer}.{p.format(e=e)}" for e in range(count) for p in parts)
    return found if all(n in names for n in found) else None


@dataclass(frozen=True)
class RoutedExperts:
    """A mixture-of-experts layer's routed experts, which verify by layers may run a
    group at a time (:mod:`ms_port.check.routed`).

    Attributes:
        count: the experts (E).
        torch: the in-memory stacked tensors' local names (``model.layers.0.mlp.experts.
            gate_up_proj``, [E, ...]) -> the file's tensors holding them
            (:func:`expert_parts`).
        ms: the MindSpore experts' local names -> the checkpoint's tensors, each with its
            rows the experts' in turn (``weight1`` [E x H, 2F]).
        torch_layer / ms_layer: the layer's names in the files (``model.layers.3``,
            ``decoder.layers.3``), to name an expert.
    """

    count: int
    torch: dict[str, tuple[str, ...]]
    ms: dict[str, str]
    torch_layer: str
    ms_layer: str


__all__ = ["STACKED_IN_MEMORY", "RoutedExperts", "expert_parts", "stack_experts"]

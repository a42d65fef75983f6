"""Outputs that hold the same values in another layout, paired after the plain pairing.

A detector's two implementations return the same numbers laid out differently: ultralytics
its predictions as B×C×N (channels, then anchors), MindYOLO as B×N×C; one side its heads'
per-level maps B×C×Hᵢ×Wᵢ, the other their flattened concatenation B×C×ΣHᵢWᵢ, or that
concatenation split by channels (boxes B×64×N, scores B×80×N). These are tried only for
outputs the plain pairing (name, shape, position) left without a counterpart, and only where
the layout leaves no doubt: a transposition only of two different sizes, a join only of
outputs under one parent that share every other size. Each pair says how it was laid out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..read.tensors import format_shape

Named = tuple[str, np.ndarray]


@dataclass(frozen=True)
class Joined:
    """Outputs under one parent joined into one: per-level maps flattened and concatenated
    along their positions, or channel groups concatenated along their channels."""

    parent: str
    members: tuple[str, ...]
    flatten: bool  # maps B×C×H×W: flattened to B×C×HW and joined on the last axis

    @property
    def name(self) -> str:
        leaves = ",".join(m.rpartition(".")[2] for m in self.members)
        return f"{self.parent}.{{{leaves}}}"

    def of(self, by_name: dict[str, np.ndarray]) -> np.ndarray | None:
        parts = [by_name.get(m) for m in self.members]
        if any(p is None for p in parts):
            return None
        if self.flatten:
            return np.concatenate([p.reshape(p.shape[0], p.shape[1], -1) for p in parts],
                                  axis=2)
        return np.concatenate(parts, axis=1)

    def describe(self) -> str:
        how = ("flattened and joined along positions" if self.flatten
               else "joined along channels")
        return f"{self.name} ({len(self.members)} outputs {how})"


def groups(outs: list[Named]) -> list[Joined]:
    """The joins a side's leftover outputs allow: two or more under one parent, all 4-D maps
    of one batch and channel count (flattened), or all 3-D of one batch and length."""
    by_parent: dict[str, list[Named]] = {}
    for name, array in outs:
        parent, dot, _ = name.rpartition(".")
        if dot:
            by_parent.setdefault(parent, []).append((name, array))
    found = []
    for parent, members in by_parent.items():
        if len(members) < 2:
            continue
        shapes = [a.shape for _, a in members]
        names = tuple(n for n, _ in members)
        if all(len(s) == 4 and s[:2] == shapes[0][:2] for s in shapes):
            found.append(Joined(parent, names, flatten=True))
        elif all(len(s) == 3 and (s[0], s[2]) == (shapes[0][0], shapes[0][2])
                 for s in shapes):
            found.append(Joined(parent, names, flatten=False))
    return found


def transposed(ms: np.ndarray, torch: np.ndarray) -> bool:
    """B×N×C against B×C×N, with N ≠ C (else the layout cannot be told from the shapes)."""
    return (ms.ndim == torch.ndim == 3 and ms.shape[0] == torch.shape[0]
            and ms.shape[1:] == torch.shape[:0:-1] and ms.shape[1] != ms.shape[2])


def transposition_note(ms: np.ndarray, torch: np.ndarray) -> str:
    return (f"MindSpore {format_shape(ms.shape)} compared transposed with PyTorch "
            f"{format_shape(torch.shape)}")


__all__ = ["Joined", "groups", "transposed", "transposition_note"]

"""A PyTorch buffer that is a constant the MindSpore network builds itself, checked.

Some networks compute a tensor from their config when they are built and PyTorch's
checkpoint holds it too: YOLOv5's detection head keeps its ``anchors`` in grid units, and
MindYOLO's YOLOv5 head builds the same ``anchors`` (and the ``anchor_grid`` made from them)
from its config file. The target's value stands (``initialised`` as the network's own), so
the checkpoint's must be the same: YOLOv5's training re-fits its anchors to the data set
(autoanchor) unless told not to, and a network built with the config's anchors would then
draw every box at another size. So a leftover source tensor with the same last name and
shape as exactly one such constant is compared with it: equal (within the rounding of the
dtype it is stored in) it is accounted for; otherwise the plan refuses, showing both.
"""

from __future__ import annotations

import numpy as np

from ..errors import shown
from ..read.tensors import TensorInfo, format_shape
from .derived import rounding_of
from .differences import Difference
from .entries import Dropped, Planning
from .rules import NETWORK

#: a constant's value within this relative difference is the same (float32's rounding of a
#: config's numbers divided by a stride)
RTOL = 1e-6
#: values shown per side in a refusal
SHOWN = 6


def checked(state: Planning, pending: list[TensorInfo]) -> tuple[list[TensorInfo],
                                                                  list[Difference]]:
    """``pending`` less the source tensors checked equal to the network's own constant
    (dropped, saying so), and a difference for each that holds other values."""
    constants: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for m in state.matches.values():
        if m.init == NETWORK:
            constants.setdefault((_leaf(m.target), tuple(m.shape)), []).append(m.target)
    if not constants:
        return pending, []
    kept, found = [], []
    for info in pending:
        targets = constants.get((_leaf(info.name), tuple(info.shape)), [])
        own = state.target.tensors[targets[0]].constant if len(targets) == 1 else None
        if own is None:
            kept.append(info)
            continue
        stored = np.asarray(info.load())  # read once: its values and the dtype they are in
        held = stored.astype(np.float64)
        value = np.asarray(own(), dtype=np.float64)
        worst = float(np.max(np.abs(held - value) / np.maximum(np.abs(value), 1e-30),
                             initial=0.0))
        if worst <= max(RTOL, rounding_of(stored.dtype)):
            state.dropped.append(Dropped(info.name, f"the network's own value: checked equal "
                                                    f"to {targets[0]}, which the MindSpore "
                                                    "network computes when it is built"))
            continue
        kept.append(info)
        found.append(Difference("constant", _differs(info, targets[0], held, value),
                                (info.name, targets[0])))
    return kept, found


def _leaf(name: str) -> str:
    return name.rpartition(".")[2]


def _values(array: np.ndarray) -> str:
    flat = array.reshape(-1)
    shown_values = ", ".join(f"{v:.6g}" for v in flat[:SHOWN])
    return f"[{shown_values}{', …' if flat.size > SHOWN else ''}]"


def _differs(info: TensorInfo, target: str, held: np.ndarray, value: np.ndarray) -> str:
    return (f"the networks differ: PyTorch's {shown(info.name)} ({format_shape(info.shape)}) "
            f"holds {_values(held)}, MindSpore's {shown(target)} {_values(value)}, a "
            "constant its network computes from its config when it is built: the checkpoint "
            "was trained with other values (YOLOv5 re-fits its anchors to the data set) — "
            "build the MindSpore network from a config that gives the checkpoint's values "
            "(for a detector's anchors, in pixels: these values × each level's stride), then "
            "convert again")


__all__ = ["checked"]

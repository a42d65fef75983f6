"""Tiny paired networks for the matching tests: one PyTorch module, one MindSpore cell.

Importable as ``tests.tiny_nets:build_ms`` for ``--ms-model`` (run from the repo root).
"""

from __future__ import annotations

import torch
from torch import nn as tnn


class TorchNet(tnn.Module):
    """Every layer kind a built-in rule knows, plus a classifier."""

    def __init__(self, classes: int = 5):
        super().__init__()
        self.emb = tnn.Embedding(10, 4)
        self.conv1d = tnn.Conv1d(4, 6, 3, bias=True)
        self.bn1d = tnn.BatchNorm1d(6)
        self.conv = tnn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.bn = tnn.BatchNorm2d(6)
        self.bn3d = tnn.BatchNorm3d(6)
        self.gn = tnn.GroupNorm(2, 6)
        self.ln = tnn.LayerNorm(6)
        self.act = tnn.PReLU()
        self.fc = tnn.Linear(6, classes)


def torch_state(classes: int = 5, seed: int = 0, dtype: torch.dtype | None = None) -> dict:
    torch.manual_seed(seed)
    net = TorchNet(classes)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, tnn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 1.5)
    state = net.state_dict()
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    return state


def build_ms(classes: int = 5, head: str = "fc"):
    """The MindSpore twin: mindspore.nn layers, whose names differ from torch's."""
    from mindspore import nn

    class MsNet(nn.Cell):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.conv1d = nn.Conv1d(4, 6, 3, has_bias=True, pad_mode="valid")
            self.bn1d = nn.BatchNorm1d(6)
            self.conv = nn.Conv2d(3, 6, 3, pad_mode="pad", padding=1)
            self.bn = nn.BatchNorm2d(6)
            self.bn3d = nn.BatchNorm3d(6)  # parameters nested under bn3d.bn2d.*
            self.gn = nn.GroupNorm(2, 6)
            self.ln = nn.LayerNorm((6,))
            self.act = nn.PReLU()
            setattr(self, head, nn.Dense(6, classes))

    return MsNet()


def build_ms_head() -> object:
    """The same network with its classifier named ``head`` (a mapping must say so)."""
    return build_ms(head="head")


def build_mint():
    """A target in PyTorch's own naming (mindspore.mint.nn): everything matches exactly."""
    from mindspore import mint, nn

    class MintNet(nn.Cell):
        def __init__(self):
            super().__init__()
            self.bn = mint.nn.BatchNorm2d(6)
            self.fc = mint.nn.Linear(6, 5)

    return MintNet()


def not_a_cell() -> int:
    return 42

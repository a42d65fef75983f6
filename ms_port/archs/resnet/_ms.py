"""torchvision's ResNet family written in ``mindspore.nn``, under the model zoo's names.

The networks compute exactly what ``torchvision.models.resnet`` computes (ResNet v1.5:
the stride sits on the 3×3 conv of a bottleneck) and name their parameters like the
MindSpore model zoo's ResNet (``down_sample_layer``, ``end_point``), so a torchvision
checkpoint converts with a handful of segment renames (``mappings/resnet.yaml``).

Parity details that differ from MindSpore's defaults:

* Convolutions use ``pad_mode='pad'`` with explicit symmetric padding. MindSpore's
  default ``'same'`` pads the extra pixel at the bottom/right at stride 2; torch pads
  both sides equally.
* The stem max-pool is ``MaxPool2d(3, 2, pad_mode='pad', padding=1)``, which pads with
  -inf like torch (``'same'`` would shift the window, ~1% on the logits).
* BatchNorm momentum is MindSpore's convention: torch's 0.1 is MindSpore's 0.9.
* Global average pooling is a mean over H and W (no ``AdaptiveAvgPool2d``).

This is the only module of ``ms_port.archs`` that imports MindSpore at import time;
:mod:`ms_port.archs.resnet.family` imports it lazily when a network is built.
"""

from __future__ import annotations

import math

from mindspore import nn, ops
from mindspore.common.initializer import HeNormal, HeUniform, Uniform

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "build"]

#: torch's BatchNorm default (eps 1e-5, momentum 0.1) in MindSpore's convention.
BN_EPS = 1e-5
BN_MOMENTUM = 1.0 - 0.1


def _conv(in_ch: int, out_ch: int, kernel: int, stride: int = 1, groups: int = 1) -> nn.Conv2d:
    """A bias-free conv with torch's symmetric padding ``kernel // 2`` and He-normal init.

    torchvision initialises convs with ``kaiming_normal_(mode='fan_out',
    nonlinearity='relu')``; ``HeNormal`` computes fan_out the same way
    (out_channels · k · k).
    """
    return nn.Conv2d(
        in_ch, out_ch, kernel_size=kernel, stride=stride, pad_mode="pad",
        padding=kernel // 2, group=groups, has_bias=False,
        weight_init=HeNormal(mode="fan_out", nonlinearity="relu"),
    )


def _bn(channels: int, zero_gamma: bool = False) -> nn.BatchNorm2d:
    """BatchNorm with torch's eps/momentum; gamma zero for ``zero_init_residual``."""
    return nn.BatchNorm2d(
        channels, eps=BN_EPS, momentum=BN_MOMENTUM,
        gamma_init="zeros" if zero_gamma else "ones", beta_init="zeros",
    )


class BasicBlock(nn.Cell):
    """Two 3×3 convs (ResNet-18/34); the stride sits on the first."""

    expansion = 1

    def __init__(
        self, in_ch: int, planes: int, stride: int = 1, down_sample: bool = False,
        groups: int = 1, base_width: int = 64, zero_init_residual: bool = False,
    ):
        super().__init__()
        if groups != 1 or base_width != 64:
            raise ValueError("BasicBlock only supports groups=1 and base_width=64")
        self.conv1 = _conv(in_ch, planes, 3, stride)
        self.bn1 = _bn(planes)
        self.conv2 = _conv(planes, planes, 3)
        self.bn2 = _bn(planes, zero_gamma=zero_init_residual)
        self.relu = nn.ReLU()
        self.down_sample = down_sample
        self.down_sample_layer = (
            nn.SequentialCell([_conv(in_ch, planes, 1, stride), _bn(planes)])
            if down_sample else None
        )

    def construct(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.down_sample:
            identity = self.down_sample_layer(x)
        out = out + identity
        return self.relu(out)


class Bottleneck(nn.Cell):
    """1×1 → 3×3 (grouped, strided: v1.5) → 1×1 ×4 (ResNet-50 and up, ResNeXt, Wide)."""

    expansion = 4

    def __init__(
        self, in_ch: int, planes: int, stride: int = 1, down_sample: bool = False,
        groups: int = 1, base_width: int = 64, zero_init_residual: bool = False,
    ):
        super().__init__()
        width = int(planes * (base_width / 64.0)) * groups
        out_ch = planes * self.expansion
        self.conv1 = _conv(in_ch, width, 1)
        self.bn1 = _bn(width)
        self.conv2 = _conv(width, width, 3, stride, groups)
        self.bn2 = _bn(width)
        self.conv3 = _conv(width, out_ch, 1)
        self.bn3 = _bn(out_ch, zero_gamma=zero_init_residual)
        self.relu = nn.ReLU()
        self.down_sample = down_sample
        self.down_sample_layer = (
            nn.SequentialCell([_conv(in_ch, out_ch, 1, stride), _bn(out_ch)])
            if down_sample else None
        )

    def construct(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.down_sample:
            identity = self.down_sample_layer(x)
        out = out + identity
        return self.relu(out)


class ResNet(nn.Cell):
    """torchvision's ``ResNet`` for any block, depth, group count and width.

    Args:
        block: :class:`BasicBlock` or :class:`Bottleneck`.
        layers: blocks per stage, e.g. ``(3, 4, 6, 3)`` for ResNet-50.
        num_classes: outputs of the final ``end_point`` Dense.
        zero_init_residual: start each block's last BatchNorm gamma at zero.
        groups: 3×3 conv groups (ResNeXt's cardinality).
        width_per_group: bottleneck width per group (64; 128 for Wide ResNet).
    """

    def __init__(
        self, block: type[BasicBlock] | type[Bottleneck], layers: tuple[int, ...] | list[int],
        num_classes: int = 1000, zero_init_residual: bool = False,
        groups: int = 1, width_per_group: int = 64,
    ):
        super().__init__()
        if len(layers) != 4:
            raise ValueError(f"layers needs 4 stage depths, got {list(layers)}")
        self.conv1 = _conv(3, 64, 7, stride=2)
        self.bn1 = _bn(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=1)
        in_ch = 64
        stages = []
        for i, (planes, depth) in enumerate(zip((64, 128, 256, 512), layers)):
            stride = 1 if i == 0 else 2
            blocks = []
            for j in range(depth):
                s = stride if j == 0 else 1
                blocks.append(block(
                    in_ch, planes, s,
                    down_sample=s != 1 or in_ch != planes * block.expansion,
                    groups=groups, base_width=width_per_group,
                    zero_init_residual=zero_init_residual,
                ))
                in_ch = planes * block.expansion
            stages.append(nn.SequentialCell(blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        # torch's nn.Linear default: kaiming_uniform(a=√5) weight, U(±1/√fan_in) bias.
        self.end_point = nn.Dense(
            in_ch, num_classes, weight_init=HeUniform(negative_slope=math.sqrt(5)),
            bias_init=Uniform(1.0 / math.sqrt(in_ch)),
        )

    def construct(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = ops.mean(x, axis=(2, 3), keep_dims=False)  # (N, C): already flat
        return self.end_point(x)


_BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


def build(
    block: str, layers: tuple[int, ...], *, groups: int = 1, width_per_group: int = 64,
    num_classes: int = 1000, zero_init_residual: bool = False,
) -> ResNet:
    """Build a :class:`ResNet` with ``block`` given by name (``"basic"``/``"bottleneck"``)."""
    return ResNet(
        _BLOCKS[block], layers, num_classes=num_classes,
        zero_init_residual=zero_init_residual, groups=groups, width_per_group=width_per_group,
    )

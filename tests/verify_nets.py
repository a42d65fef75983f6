"""Small twin networks for verify's verdict tests: a PyTorch net and its MindSpore copy.

``TorchNet``/``MsNet``: conv → BatchNorm → ReLU → max-pool → residual block → average
pool → classifier, named as torchvision's ResNet and ms-port's (``fc`` vs ``end_point``),
so the built-in ``resnet`` mapping converts them. Weights come from seeded init with the
BatchNorm statistics estimated on data (:func:`ms_port.testing.estimate_batchnorm`).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import torch

from ms_port.testing import estimate_batchnorm

SHAPE = (3, 16, 16)
CLASSES = 5


class TorchBlock(torch.nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(ch)
        self.relu = torch.nn.ReLU(inplace=True)
        self.conv2 = torch.nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(ch)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + x)


class TorchNet(torch.nn.Module):
    def __init__(self, ch: int = 8):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, ch, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(ch)
        self.relu = torch.nn.ReLU(inplace=True)
        self.maxpool = torch.nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = torch.nn.Sequential(TorchBlock(ch))
        self.avgpool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(ch, CLASSES)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.avgpool(self.layer1(x)), 1))


class MsBlock(ms.nn.Cell):
    def __init__(self, ch: int):
        super().__init__()
        self.conv1 = ms.nn.Conv2d(ch, ch, 3, pad_mode="pad", padding=1, has_bias=False)
        self.bn1 = ms.nn.BatchNorm2d(ch)
        self.relu = ms.nn.ReLU()
        self.conv2 = ms.nn.Conv2d(ch, ch, 3, pad_mode="pad", padding=1, has_bias=False)
        self.bn2 = ms.nn.BatchNorm2d(ch)

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + x)


class MsNet(ms.nn.Cell):
    def __init__(self, ch: int = 8, pool_pad_mode: str = "pad"):
        super().__init__()
        self.conv1 = ms.nn.Conv2d(3, ch, 3, pad_mode="pad", padding=1, has_bias=False)
        self.bn1 = ms.nn.BatchNorm2d(ch)
        self.relu = ms.nn.ReLU()
        # "same" pads bottom/right only at stride 2 (MindCV's choice); "pad" as torch
        self.maxpool = (ms.nn.MaxPool2d(3, 2, pad_mode="pad", padding=1)
                        if pool_pad_mode == "pad" else ms.nn.MaxPool2d(3, 2, pad_mode="same"))
        self.layer1 = ms.nn.SequentialCell([MsBlock(ch)])
        self.avgpool = ms.nn.AdaptiveAvgPool2d(1)
        self.end_point = ms.nn.Dense(ch, CLASSES)

    def construct(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.end_point(ms.ops.flatten(self.avgpool(self.layer1(x))))


def realistic(seed: int = 0) -> TorchNet:
    """Seeded init, BatchNorm affine off 1/0, statistics estimated on data."""
    torch.manual_seed(seed)
    net = TorchNet()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=gen) * 0.2)
    return estimate_batchnorm(net, SHAPE, seed=seed + 2)


def insensitive(seed: int = 0) -> TorchNet:
    """The input barely reaches the output: a near-zero first conv whose BatchNorm keeps
    fixed statistics (as in a randomly initialised deep net that has collapsed)."""
    net = realistic(seed)
    with torch.no_grad():
        net.conv1.weight.mul_(1e-9)
        net.bn1.running_var.fill_(1.0)
    return net


def zero_head(seed: int = 0) -> TorchNet:
    """A zero-initialised classifier (torchvision's ViT does this): a constant output."""
    net = realistic(seed)
    with torch.no_grad():
        net.fc.weight.zero_()
        net.fc.bias.zero_()
    return net


class TorchTokens(torch.nn.Module):
    """Token ids in, logits out."""

    def __init__(self, vocab: int = 32, dim: int = 8):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.proj = torch.nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.proj(torch.tanh(self.embed(ids)))


class MsTokens(ms.nn.Cell):
    def __init__(self, vocab: int = 32, dim: int = 8):
        super().__init__()
        self.embed = ms.nn.Embedding(vocab, dim)
        self.proj = ms.nn.Dense(dim, vocab)

    def construct(self, ids):
        return self.proj(ms.ops.tanh(self.embed(ids)))


def rng_array(shape, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
